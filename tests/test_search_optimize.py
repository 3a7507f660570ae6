"""placer.optimize end to end with the search registry."""

import pytest

import placer
from placer.errors import StrategyError
from placer.search import Progress, optimize, strategies


@pytest.fixture(scope="module")
def graph():
    return placer.datasets.layered(120, width=6, seed=1)


def test_optimize_end_to_end_on_a_preset(graph):
    cluster = placer.Cluster.preset("two-sites")
    events = []
    plan = optimize(graph, cluster, "heft", seed=0, time_budget=10.0, progress=events.append)
    plan.validate(graph, cluster)                       # fingerprints bound
    assert plan.graph == graph.fingerprint() and plan.cluster == cluster.fingerprint()
    assert plan.method == "heft"
    assert plan.predicted["model"] == "simulator"
    assert plan.predicted["search"]["model"] == "analytical"
    assert plan.predicted["step_time"] > 0 and plan.predicted["feasible"]
    assert set(plan.predicted["peak_memory"]) <= set(cluster.names)
    assert events and isinstance(events[-1], Progress) and events[-1].done
    again = placer.simulate(graph, cluster, plan)
    assert again.step_time == pytest.approx(plan.predicted["step_time"])


def test_optimize_options(graph, capsys):
    cluster = placer.Cluster.preset("hetero-lab")
    plan = optimize(graph, cluster, "even_pipeline", evaluations=10, time_budget=None,
                    microbatches=4, schedule="gpipe", progress=True,
                    problem_options={"recompute": True})
    assert (plan.microbatches, plan.schedule) == (4, "gpipe")
    assert plan.predicted["search"]["evaluations"] <= 10
    assert "[even_pipeline]" in capsys.readouterr().err


def test_optimize_through_the_top_level_api(graph):
    cluster = placer.Cluster.preset("two-sites")
    plan = placer.optimize(graph, cluster, method="pipeline_dp", time_budget=10.0)
    assert plan.method == "pipeline_dp" and plan.predicted["feasible"]
    assert set(placer.strategies()) == set(strategies())


def test_unknown_and_missing_methods(graph):
    cluster = placer.Cluster.preset("two-sites")
    with pytest.raises(StrategyError, match="unknown strategy 'magic'.*even_pipeline"):
        optimize(graph, cluster, "magic")
    if "evolution" not in strategies():
        with pytest.raises(StrategyError, match="evolution"):
            optimize(graph, cluster)

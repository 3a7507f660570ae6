"""Anytime ``rl``: with a budget it searches on from its one-shot plan."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("deap")

from placer import datasets  # noqa: E402
from placer.cost import Problem, get_cost_model  # noqa: E402
from placer.search import Budget, get_strategy  # noqa: E402

from gnn.checkpoint import save_policy  # noqa: E402
from gnn.model import PlacementPolicy, PolicyConfig  # noqa: E402


@pytest.fixture(scope="module")
def stem(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("policy") / "p"
    save_policy(path, PlacementPolicy(PolicyConfig(hidden=16, layers=1)))
    return str(path)


@pytest.fixture(scope="module")
def problem():
    # an unrolled LSTM (out of the policy's families) on two speed classes
    return Problem(datasets.graph("rnn-t8-l2-s0"), datasets.cluster("classes-d4-s0"))


def _search(stem, problem, budget, seed=0, **options):
    # without the one-shot cut descent, which here finds what the anytime
    # search would (the test is of the search going on from a first plan)
    options.setdefault("cuts", False)
    events = []
    model = budget.meter(get_cost_model("analytical"))
    plan = get_strategy("rl", checkpoint=stem, samples=4, max_units=48, **options).search(
        problem, model, budget, seed, events.append)
    return plan, events, budget


def test_anytime_rl_reports_its_first_plan_then_improves_deterministically(stem, problem):
    sim = get_cost_model("simulator")
    one, one_events, one_budget = _search(stem, problem, Budget())          # no budget: one-shot
    off, _, _ = _search(stem, problem, Budget(evaluations=800), anytime=False)
    assert off.placement == one.placement and off.predicted["evaluations"] < 800
    assert [e.message for e in one_events] == ["done"]
    a, events, budget = _search(stem, problem, Budget(evaluations=800))
    b, _, _ = _search(stem, problem, Budget(evaluations=800))
    assert a.placement == b.placement and a.microbatches == b.microbatches  # same seed, same plan
    # the first report is the one-shot plan, by the simulator, before the search goes on
    first = events[0]
    assert first.message == "first plan" and first.extra["model"] == "simulator"
    assert first.best == pytest.approx(sim.estimate(problem, one).objective)
    assert first.evaluations < 0.5 * budget.used
    # then it spends the budget (a tenth kept for the final model's descent,
    # which stops at its local optimum) and is better by the simulator
    assert 700 <= budget.used <= 800
    assert sim.estimate(problem, a).objective < 0.97 * first.best
    # and here as good as evolution's at the same number of plans scored
    evo = Budget(evaluations=800)
    plan = get_strategy("evolution").search(problem, evo.meter(get_cost_model("analytical")),
                                            evo, 0)
    assert sim.estimate(problem, a).objective <= 1.05 * sim.estimate(problem, plan).objective
    assert a.extra["first_source"] == one.extra["source"]
    assert events[-1].done and len(events) > 2


def test_anytime_rl_stops_at_its_time_budget(stem, problem):
    import time
    start = time.perf_counter()
    plan, events, budget = _search(stem, problem, Budget(time=1.5))
    took = time.perf_counter() - start
    assert 1.2 <= took <= 1.5 * 1.3 + 0.5      # most of it used (a tenth kept to rank)
    assert events[0].message == "first plan" and events[0].elapsed < took
    plan.validate(problem.graph, problem.cluster, check_fingerprints=False)


def test_anytime_rl_ranks_the_heuristics_plans_by_the_final_model(stem, problem, monkeypatch):
    """The final model ranks the heuristics' plans and the best of each
    other shape beside the search model's best: where the two models
    disagree, the search model's favourites alone can all lose to the
    first plan by the final model."""
    import numpy as np
    import gnn.anytime as anytime
    import placer.search.ranker as ranker
    ranked, found = [], []
    rank, heuristics = ranker.rank_finalists, anytime._heuristics
    monkeypatch.setattr(ranker, "rank_finalists", lambda model, problem, plans, budget, **kw: (
        ranked.extend(plans) or rank(model, problem, plans, budget, **kw)))
    monkeypatch.setattr(anytime, "_heuristics", lambda *a: (
        found.extend(heuristics(*a)) or found))
    # the analytical model screens (an evaluation budget), the simulator ranks
    plan, _, _ = _search(stem, problem, Budget(evaluations=800))
    assert found and len(ranked) > anytime.FINAL_K

    def row(p):
        return tuple(tuple(p.placement[op]) for op in problem.ids)
    rows = {row(p) for p in ranked}
    best = sorted(found, key=lambda h: h[2])[:anytime.FINAL_K]
    assert all(row(p) in rows for _, p, _ in best)
    assert len({len(np.unique([d for op in problem.ids for d in p.placement[op]]))
                for p in ranked}) >= 2      # plans over different numbers of devices

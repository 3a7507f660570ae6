"""Big graphs: coarsen-search-refine in optimize, refinement moves, the
simulator's replica edges in linear memory, and predicted costs that keep
slow phases (simulations, seeding heuristics) inside a time budget."""

import math
import time

import numpy as np
import pytest

import placer
from placer.cost import Problem, get_cost_model
from placer.plan import Plan
from placer.search import optimize_with_report
from placer.search.base import Budget
from placer.search.common import SimulationClock
from placer.search.multilevel import coarsen_target
from placer.search.refine import refine


@pytest.fixture(scope="module", autouse=True)
def warm():
    from placer.cost.warmup import warm_up
    warm_up()


def _replica_edges_by_product(su, sv, fu, fv, eb):
    """The reference: every (a, b) replica pair of every edge, then the
    overlapping ones kept (what the simulator did before, k*k per edge)."""
    cnt = su * sv
    e_idx = np.repeat(np.arange(len(su)), cnt)
    r = np.arange(len(e_idx)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    q, pp = sv[e_idx], su[e_idx]
    a, b = r // q, r % q
    ov = np.minimum((a + 1) / pp, (b + 1) / q) - np.maximum(a / pp, b / q)
    keep = ov > 1e-12
    return (fu[e_idx] + a)[keep], (fv[e_idx] + b)[keep], (eb[e_idx] * ov)[keep]


def test_replica_edges_match_the_pairwise_product_exactly():
    from placer.cost.simulator import _replica_edges
    rng = np.random.default_rng(0)
    for _ in range(100):
        E = int(rng.integers(1, 30))
        su = rng.choice([1, 2, 3, 4, 5, 8, 64], E).astype(np.int64)
        sv = rng.choice([1, 2, 3, 4, 6, 8, 64], E).astype(np.int64)
        fu, fv = rng.integers(0, 500, E), rng.integers(0, 500, E)
        eb = rng.random(E) * 1e6
        for want, got in zip(_replica_edges_by_product(su, sv, fu, fv, eb),
                             _replica_edges(su, sv, fu, fv, eb)):
            assert want.shape == got.shape and np.array_equal(want, got)


def test_wide_data_parallel_plan_simulates_in_linear_memory():
    """Every op on all 64 devices: the replica edges are 64 per edge (the
    product would be 4096 per edge)."""
    import tracemalloc
    g = placer.datasets.graph("random_dag-n300-w8-s0")
    cluster = placer.Cluster.preset("dtfm-worldwide")
    plan = Plan({op: list(cluster.names) for op in g.ids}, microbatches=1)
    p = Problem(g, cluster)
    tracemalloc.start()
    report = get_cost_model("simulator").estimate(p, plan)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert math.isfinite(report.step_time)
    # 4096 pairs x ~1,000 edges x 8 arrays of 8 bytes would be ~260 MB
    assert peak < 120e6, peak


def _skewed_plan(problem):
    """A two-stage pipeline cut far too late: 90% of the ops on the first device."""
    ids = problem.ids
    cut = int(0.9 * len(ids))
    a, b = problem.devices[0], problem.devices[1]
    return Plan({op: [a if i < cut else b] for i, op in enumerate(ids)}, microbatches=4)


def test_refine_improves_a_skewed_plan_and_reports_its_true_objective():
    g = placer.datasets.layered(300, width=4, seed=0)
    p = Problem(g, placer.Cluster.preset("a100x8"))
    model = get_cost_model("analytical")
    start = _skewed_plan(p)
    before = model.estimate(p, start).objective
    budget = Budget(time=5.0)
    plan, value, kept, _ = refine(p, start, budget.meter(model), budget)
    after = model.estimate(p, plan).objective
    assert after == pytest.approx(value, rel=1e-9)
    assert kept >= 1 and after < 0.8 * before, (before, after)
    assert sorted(plan.placement) == sorted(g.ids)
    assert budget.elapsed <= 5.0 * 1.1


def test_refine_keeps_colocated_ops_together():
    from placer.graph import Graph, Op
    base = placer.datasets.layered(200, width=4, seed=1)
    ops = [Op(o.id, o.op, o.flops, o.bwd_flops, o.param_bytes, o.output_bytes,
              "tied" if i % 50 == 7 else None, dict(o.extra)) for i, o in enumerate(base)]
    g = Graph(base.name, ops, base.edges)
    p = Problem(g, placer.Cluster.preset("a100x8"))
    start = _skewed_plan(p)
    tied = [op for op in g.ids if g.op(op).colocate == "tied"]
    for op in tied:
        start.placement[op] = [p.devices[0]]
    budget = Budget(time=3.0)
    plan, _, _, _ = refine(p, start, budget.meter(get_cost_model("analytical")), budget)
    assert len({tuple(plan.placement[op]) for op in tied}) == 1


def test_optimize_coarsens_searches_and_refines_within_its_budget():
    g = placer.datasets.graph("random_dag-n1500-w8-s0")
    cluster = placer.Cluster.preset("hetero-lab")
    events = []
    budget = 4.0
    start = time.perf_counter()
    plan, report = optimize_with_report(g, cluster, "pipeline_dp", seed=0, time_budget=budget,
                                        coarsen=150, final_cost_model="analytical",
                                        progress=events.append)
    wall = time.perf_counter() - start
    search = plan.predicted["search"]
    assert sorted(plan.placement) == sorted(g.ids)
    assert search["search_seconds"] <= 1.1 * budget and wall <= 1.1 * budget + 2.0
    assert plan.extra["search"]["coarsened"]["to"] <= 150
    # the refined plan is no worse by the search model than the expanded coarse one
    info = plan.extra["search"]["coarsened"]
    assert search["objective"] <= info["expanded_objective"] * (1 + 1e-9)
    # and no worse than the heuristics run on the whole graph
    assert {"heft", "pipeline_dp"} <= set(info["starts"])
    assert search["objective"] <= min(info["starts"].values()) * (1 + 1e-9)
    messages = [e.message for e in events]
    assert any("coarsening 1500 ops" in m for m in messages)
    assert any("refine" in m for m in messages)
    # elapsed on the whole search's clock, never going back
    times = [e.elapsed for e in events]
    assert times == sorted(times)


def test_coarsen_option():
    from placer.errors import StrategyError
    from placer.search.multilevel import COARSEN_ABOVE, COARSEN_TO
    assert coarsen_target("auto", COARSEN_ABOVE) is None
    assert coarsen_target("auto", COARSEN_ABOVE + 1) == COARSEN_TO
    assert coarsen_target(None, 10 ** 6) is None
    assert coarsen_target(100, 100) is None and coarsen_target(100, 101) == 100
    for bad in (1, "many", 2.5, True):
        with pytest.raises(StrategyError, match="coarsen"):
            coarsen_target(bad, 1000)


def test_simulation_clock_skips_what_cannot_fit():
    g = placer.datasets.layered(100, width=4, seed=0)
    p = Problem(g, placer.Cluster.preset("two-sites"))
    plan = Plan({op: [p.devices[0]] for op in g.ids}, microbatches=2)
    sim = get_cost_model("simulator")
    assert SimulationClock.estimate(sim, p, plan, Budget(time=60.0)) is not None
    spent = Budget(time=1e-3)
    time.sleep(2e-3)
    assert SimulationClock.estimate(sim, p, plan, spent) is None
    assert SimulationClock.estimate(sim, p, plan, Budget()) is not None


def test_seeding_skips_a_heuristic_predicted_to_overrun(monkeypatch):
    from evolution import search as evo
    from placer.search import common
    g = placer.datasets.graph("random_dag-n400-w8-s0")
    p = Problem(g, placer.Cluster.preset("dtfm-worldwide"))
    monkeypatch.setitem(common._SEED_RATES, "heft", 1.0)      # an hour per op
    pool = evo.SeedPool(Budget(time=2.0), 0.5, 2)
    model = get_cost_model("analytical")
    assert pool.run("even_pipeline", p, model, 0) is not None
    start = time.perf_counter()
    assert pool.run("heft", p, model, 0) is None
    assert time.perf_counter() - start < 0.1


def test_deepened_graph_is_the_traced_deep_model():
    """Three traced blocks replicated to 6 give the op graph a 6-block trace
    gives: the same ops, costs and edges, position by position."""
    from placer.deepen import deepen

    def shape(g):
        order = g.topological_order()
        pos = {x: i for i, x in enumerate(order)}
        ops = [(g.op(x).op, g.op(x).flops, g.op(x).bwd_flops, g.op(x).param_bytes,
                g.op(x).output_bytes) for x in order]
        return ops, sorted((pos[e.src], pos[e.dst], e.bytes) for e in g.edges)

    module, inputs = placer.datasets.model("gpt-125m", 2, 16, tiny=True, n_layer=6)
    real = placer.trace(module, inputs, granularity="op")
    deep = deepen("gpt-125m", 6, batch=2, seq=16, tiny=True)
    assert len(deep) == len(real) and shape(deep) == shape(real)
    assert deep.meta["generator"] == "deepen" and "6 blocks" in deep.meta["description"]


def test_cli_plan_coarsen_option(tmp_path, capsys):
    from placer.cli import main
    out = tmp_path / "p.json"
    assert main(["plan", "layered-n300-w4-s0", "-c", "two-sites", "--coarsen", "x",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--coarsen" in err[0] and "fix:" in err[0]
    assert main(["plan", "layered-n300-w4-s0", "-c", "two-sites", "--coarsen", "40",
                 "-m", "heft", "--time-budget", "2", "--no-plots", "--json",
                 "-o", str(out)]) == 0
    plan = Plan.load(out)
    assert len(plan.placement) == 300 and plan.extra["search"]["coarsened"]["to"] <= 40


@pytest.mark.parametrize("name", ["random_dag-n3000-w8-s0", "gpt-1.3b.op", "inception.op",
                                  "opgraph-n2000-s0", "series_parallel-n1000-s3"])
def test_topological_order_is_networkx_lexicographic_by_file_position(name):
    import networkx as nx
    g = placer.datasets.graph(name)
    position = {op: i for i, op in enumerate(g.ids)}
    assert g.topological_order() == list(nx.lexicographical_topological_sort(
        g.nx, key=position.__getitem__))


def test_coarsened_search_is_deterministic_under_an_evaluation_budget():
    g = placer.datasets.graph("random_dag-n1200-w8-s0")
    cluster = placer.Cluster.preset("hetero-lab")
    plans = [placer.optimize(g, cluster, "evolution", seed=1, time_budget=None,
                             evaluations=600, coarsen=100, final_cost_model="analytical")
             for _ in range(2)]
    assert dict(plans[0].placement) == dict(plans[1].placement)
    assert plans[0].predicted["search"]["evaluations"] <= 600


def test_coarsened_evolution_ranks_its_starts_by_its_final_model(monkeypatch):
    """Evolution ranks its finalists by the simulator; on a coarsened graph
    the refined plan and the whole-graph heuristics' plans are ranked so
    too, and the result is the simulator's best of them."""
    import placer.search.common as common
    seen = []

    def recording_rank(model, problem, plans, budget=None, pool=None):
        seen.append((model.name, list(plans)))
        return real(model, problem, plans, budget, pool=pool)
    real = common.rank
    monkeypatch.setattr(common, "rank", recording_rank)
    g = placer.datasets.graph("random_dag-n1200-w8-s0")
    cluster = placer.Cluster.preset("hetero-lab")
    plan = placer.optimize(g, cluster, "evolution", seed=1, time_budget=None,
                           evaluations=600, coarsen=100)
    name, starts = seen[-1]         # the multilevel ranking comes last
    assert name == "simulator" and len(starts) >= 3    # refined, heft, pipeline_dp, ...
    sim, problem = get_cost_model("simulator"), Problem(g, cluster)
    values = [sim.estimate(problem, p).objective for p in starts]
    assert sim.estimate(problem, plan).objective == pytest.approx(min(values))
    info = plan.extra["search"]["coarsened"]
    assert info["ranked_by"] == ("simulator" if values.index(min(values)) else None)

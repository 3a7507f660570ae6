"""Hand-checked cases of the built-in heuristics and the registry."""

import itertools

import numpy as np
import pytest

import placer
from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import Problem, get_cost_model
from placer.errors import StrategyError
from placer.search import Budget, Strategy, get_strategy, register_strategy, strategies
from placer.search.base import unregister_strategy
from placer.search.listsched import HEFT
from placer.search.pipeline_dp import Space


def _two(bandwidth):
    devs = [Device("x", 1e9, 1e12, efficiency=1.0), Device("y", 1e9, 1e12, efficiency=1.0)]
    return Cluster.from_rules("pair", devs, default=(bandwidth, 0.0))


def _fork_join():
    # a (1 s) -> b (2 s), c (2 s) -> d (1 s) on 1 GFLOP/s devices, 1 MB tensors
    ops = [Op("a", flops=1e9), Op("b", flops=2e9), Op("c", flops=2e9), Op("d", flops=1e9)]
    edges = [Edge("a", "b", 1e6), Edge("a", "c", 1e6), Edge("b", "d", 1e6),
             Edge("c", "d", 1e6)]
    return Graph("fork-join", ops, edges, training=False)


def _place(problem, strategy):
    dev = strategy.place(problem)
    return {op: problem.devices[d] for op, d in zip(problem.ids, dev.tolist())}


def test_heft_runs_the_branches_in_parallel_on_fast_links():
    problem = Problem(_fork_join(), _two(1e12), op_overhead=0.0)
    # ranks a > b = c > d; a on x; b on x (ties to the first device); c on y
    # finishes at 3 s + 1 us instead of 5 s on x; d then finishes at
    # 4 s + 1 us on y (b's tensor arrives as y frees up) and 4 s + 2 us on x
    assert _place(problem, HEFT()) == {"a": "x", "b": "x", "c": "y", "d": "y"}


def test_heft_keeps_everything_on_one_device_over_slow_links():
    problem = Problem(_fork_join(), _two(1e5), op_overhead=0.0)   # 10 s per tensor
    assert set(_place(problem, HEFT()).values()) == {"x"}


def test_heft_insertion_fills_a_gap():
    problem = Problem(_fork_join(), _two(1e12), op_overhead=0.0)
    assert _place(problem, HEFT(insertion=True)) == _place(problem, HEFT(insertion=False))


def test_single_picks_the_fastest_device_that_fits():
    g = placer.datasets.layered(30, width=3, seed=4)
    need = Problem(g, _two(1e9))
    model = get_cost_model("analytical")
    devs = [Device("fast", 4e14, 1e3), Device("mid", 2e14, 1e13), Device("slow", 1e14, 1e13)]
    cluster = Cluster.from_rules("three", devs, default=(1e10, 1e-5))
    plan = get_strategy("single").search(Problem(g, cluster), model, Budget())
    assert plan.devices_used() == {"mid"} and plan.predicted["feasible"]
    devs[0] = Device("fast", 4e14, 1e13)
    cluster = Cluster.from_rules("three", devs, default=(1e10, 1e-5))
    plan = get_strategy("single").search(Problem(g, cluster), model, Budget())
    assert plan.devices_used() == {"fast"}
    assert need.n_ops == 30


def _brute_force(space: Space, m: int) -> float:
    best = float("inf")

    def rec(s, p, fills, busies):
        nonlocal best
        if s == space.L:
            if fills:
                best = min(best, Space.objective(fills, busies, m))
            return
        for e in range(s, space.L):
            for k in space.sizes:
                if p + k <= space.D:
                    f, b = space.stage_times(s, e, p, k, m)
                    if np.isfinite(f):
                        rec(e + 1, p + k, fills + [f], busies + [b])

    for p0 in range(space.D):
        rec(0, p0, [], [])
    return best


@pytest.mark.parametrize("m", [1, 2, 4, 16])
def test_pipeline_dp_equals_brute_force_on_a_chain(m):
    rng = np.random.default_rng(7)
    ops = [Op(f"l{i}", "linear", flops=float(rng.uniform(1e11, 1e12)),
              param_bytes=float(rng.uniform(1e8, 2e9)), output_bytes=float(rng.uniform(1e7, 1e9)))
           for i in range(5)]
    g = Graph("chain5", ops, [Edge(f"l{i}", f"l{i + 1}", ops[i].output_bytes) for i in range(4)])
    devs = [Device("a", 3e14, 2e10, site="s"), Device("b", 1e14, 1.6e10, site="s"),
            Device("c", 2e14, 8e9, site="t")]
    cluster = Cluster.from_rules("three", devs, default=(1e10, 1e-4),
                                 sites=[("s", "t", 1e9, 5e-3)])
    space = Space(Problem(g, cluster), max_layers=5)
    assert space.L == 5 and space.sizes == [1, 2, 3]
    fill, busy = space.table(m)
    for s, e, p, q in itertools.product(range(5), range(5), range(3), range(3)):
        k = space.sizes[q]
        if e >= s and p + k <= 3:
            f, b = space.stage_times(s, e, p, k, m)
            assert fill[s, e, p, q] == pytest.approx(f, rel=1e-9)
            assert busy[s, e, p, q] == pytest.approx(b, rel=1e-9)
            assert b <= f or not np.isfinite(f)
    expect = _brute_force(space, m)
    value, stages = space.solve(m)
    assert np.isfinite(expect)
    assert value == pytest.approx(expect, rel=1e-12)
    times = [space.stage_times(s, e, p, k, m) for s, e, p, k in stages]
    assert Space.objective(*zip(*times), m) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("m", [2, 8])
def test_pipeline_dp_overlaps_transfers_with_compute(m):
    """A stage's busy time is the larger of its compute and its input
    transfer, not their sum (the link works while the devices compute);
    both count in its fill."""
    ops = [Op("a", "linear", flops=1e12), Op("b", "linear", flops=1e12)]
    g = Graph("pair", ops, [Edge("a", "b", 1e9)], training=False)
    devs = [Device("x", 1e12, 1e12, efficiency=1.0), Device("y", 1e12, 1e12, efficiency=1.0)]
    cluster = Cluster.from_rules("two", devs, default=(1e9, 0.0))
    space = Space(Problem(g, cluster, op_overhead=0.0), max_layers=2, sizes=[1])
    f, b = space.stage_times(1, 1, 1, 1, m)
    assert f == pytest.approx(2.0 / m) and b == pytest.approx(1.0 / m)


def _memory_problem(seed):
    g = placer.datasets.random_dag(80, width=6, seed=seed)
    p = Problem(g, _two(1e9))
    total = float((p.param_bytes * 4 + p.output_bytes).sum() + p.edge_bytes.sum()
                  + p.workspace_bytes.max())
    devs = [Device(f"g{i}", 1e14 * (1 + i % 2), 0.45 * total, site=f"s{i // 2}")
            for i in range(4)]
    cluster = Cluster.from_rules("tight4", devs, default=(1e10, 1e-5),
                                 sites=[("s0", "s1", 1e8, 0.01)])
    return Problem(g, cluster)


@pytest.mark.parametrize("name", ["m_etf", "m_sct", "m_topo", "heft"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_memory_constrained_list_schedulers_stay_within_memory(name, seed):
    problem = _memory_problem(seed)
    plan = get_strategy(name).search(problem, get_cost_model("analytical"), Budget())
    for model in ("analytical", "simulator"):
        report = get_cost_model(model).estimate(problem, plan)
        assert report.feasible, (name, model, report.memory_excess)


def test_m_sct_favourite_children_form_a_matching():
    problem = _memory_problem(0)
    from placer.search.common import context
    fav = get_strategy("m_sct").urgent(context(problem))
    chosen = fav[fav >= 0]
    assert len(chosen) == len(set(chosen.tolist())) > 0


@pytest.mark.parametrize("refine", ["acyclic", "kl"])
def test_partition_uses_devices_and_acyclic_refinement_is_acyclic(refine):
    import networkx as nx
    g = placer.datasets.series_parallel(120, seed=1)
    problem = Problem(g, Cluster.preset("hetero-lab"))
    plan = get_strategy("partition", refine=refine).search(
        problem, get_cost_model("analytical"), Budget())
    plan.validate(g, problem.cluster, check_fingerprints=False)
    if refine == "acyclic":
        part = get_strategy("partition")
        from placer.search.common import device_order
        assign = part.partition(problem, device_order(problem), np.random.default_rng(0))
        q = nx.DiGraph()
        q.add_nodes_from(set(assign.tolist()))
        q.add_edges_from((int(assign[u]), int(assign[v]))
                         for u, v in zip(problem.edge_src, problem.edge_dst)
                         if assign[u] != assign[v])
        assert nx.is_directed_acyclic_graph(q) and len(q) > 1


def test_large_graph_gives_valid_plans():
    # speed on large graphs is measured by `placer bench search`, not here
    g = placer.datasets.random_dag(10000, width=8, seed=0)
    cluster = Cluster.preset("two-sites")
    problem = Problem(g, cluster)
    model = get_cost_model("analytical")
    for name in ("heft", "m_sct", "partition", "pipeline_dp", "even_pipeline"):
        plan = get_strategy(name).search(problem, model, Budget())
        plan.validate(g, cluster, check_fingerprints=False)


def test_registry_errors_and_plugins():
    with pytest.raises(StrategyError, match="unknown strategy 'nope'.*heft"):
        get_strategy("nope")
    with pytest.raises(StrategyError, match="bad options"):
        get_strategy("heft", colour="red")

    @register_strategy
    class Everything(Strategy):
        name = "test-everything-first"

        def search(self, problem, cost_model, budget, seed=0, progress=None):
            plan = Plan({op: [problem.devices[0]] for op in problem.ids})
            return self.finalize(problem, cost_model, budget, plan)

    try:
        assert "test-everything-first" in strategies()
        assert isinstance(get_strategy("test-everything-first"), Everything)
    finally:
        unregister_strategy("test-everything-first")
    assert "test-everything-first" not in strategies()
    with pytest.raises(StrategyError):
        register_strategy(type("Nameless", (Strategy,), {"search": lambda *a: None}))


def test_budget():
    b = Budget(evaluations=3)
    assert b.allow(10) == 3 and not b.exhausted()
    b.charge(3)
    assert b.exhausted() and b.allow(1) == 0
    b = Budget(time=1e-9)
    assert b.exhausted() and b.allow(5) == 1      # one plan may always be scored
    with pytest.raises(StrategyError):
        Budget(time=-1)
    with pytest.raises(StrategyError):
        Budget(evaluations=0)
    b = Budget()
    b.stop()
    assert b.exhausted()

"""The simulator at the runtime's granularity (``Problem(granularity=
"piece")``): a piece starts once all its inputs are there and sends its
outputs when it ends; ``"op"`` (the default) may start part of it earlier."""

from __future__ import annotations

import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import Problem, get_cost_model
from placer.cost.simulator import executed_orders
from placer.errors import StrategyError


def _fork(training: bool) -> tuple[Graph, Cluster, Plan]:
    # s -> p, s -> t, t -> q, p -> q; x runs s, t and y runs p, q: the
    # runtime merges each device's two runs into one piece (no path
    # between them through the other device)
    ops = [Op(n, flops=1e9, bwd_flops=2e9) for n in ("s", "p", "t", "q")]
    g = Graph("fork", ops, [Edge("s", "p", 1e3), Edge("s", "t", 1e3), Edge("t", "q", 1e3),
                            Edge("p", "q", 1e3)], training=training)
    devs = [Device(n, 1e12, 1e10, efficiency=1.0) for n in ("x", "y")]
    c = Cluster.from_rules("two", devs, default=(1e15, 0.0))
    return g, c, Plan({"s": ["x"], "p": ["y"], "t": ["x"], "q": ["y"]})


@pytest.mark.parametrize("training,op_ms,piece_ms", [(False, 3.0, 4.0), (True, 9.0, 12.0)])
def test_a_piece_waits_for_all_its_inputs(training, op_ms, piece_ms):
    # by hand (1 ms an op forward, 2 ms backward, free links): ops start p
    # after s while x runs t; pieces run y's {p, q} after x's {s, t} ends,
    # and the backward of {s, t} after that of {p, q}
    g, c, plan = _fork(training)
    sim = get_cost_model("simulator")
    steps = {gran: sim.estimate(Problem(g, c, op_overhead=0.0, merge=0.0,
                                        granularity=gran), plan).step_time
             for gran in ("op", "piece")}
    assert steps["op"] == pytest.approx(op_ms * 1e-3, rel=1e-6)
    assert steps["piece"] == pytest.approx(piece_ms * 1e-3, rel=1e-6)


def test_piece_tasks_are_the_runtimes_pieces():
    g, c, plan = _fork(True)
    orders = executed_orders(Problem(g, c, granularity="piece"), plan)
    assert orders == {"x": [("F", 0, ("s", "t")), ("B", 0, ("s", "t"))],
                      "y": [("F", 0, ("p", "q")), ("B", 0, ("p", "q"))]}


def test_a_pipeline_is_the_same_at_both_granularities():
    # one run per device: pieces are the runs; only when its outputs
    # leave differs, and on a chain the last op sends them anyway
    ops = [Op(f"o{i}", flops=1e9, bwd_flops=2e9) for i in range(6)]
    g = Graph("chain", ops, [Edge(f"o{i}", f"o{i + 1}", 1e6) for i in range(5)])
    devs = [Device(n, 1e12, 1e10, efficiency=1.0) for n in ("x", "y")]
    c = Cluster.from_rules("two", devs, default=(1e9, 1e-4))
    plan = Plan({o.id: ["x"] if i < 3 else ["y"] for i, o in enumerate(ops)}, microbatches=4)
    sim = get_cost_model("simulator")
    a, b = (sim.estimate(Problem(g, c, granularity=k), plan).step_time for k in ("op", "piece"))
    assert a == pytest.approx(b)


def test_unknown_granularity_is_one_clear_error():
    g, c, _ = _fork(True)
    with pytest.raises(StrategyError, match="granularity"):
        Problem(g, c, granularity="layer")


def _merge_runs_by_contraction(dag, runs: list) -> dict[int, int]:
    """The reference: contract each later run into the first earlier run of
    its group whose contraction keeps the DAG acyclic (networkx), pieces
    numbered in the lexicographic topological order."""
    import networkx as nx
    rep = {r: r for r in range(len(runs))}
    g = dag.copy()
    for j in range(len(runs)):
        for i in range(j):
            if rep[i] != i or runs[i] != runs[j] or rep[j] != j:
                continue
            g2 = nx.contracted_nodes(g, i, j, self_loops=False)
            if nx.is_directed_acyclic_graph(g2):
                g = g2
                for r, v in rep.items():
                    if v == j:
                        rep[r] = i
                break
    order = {r: k for k, r in enumerate(nx.lexicographical_topological_sort(g, key=int))}
    return {r: order[rep[r]] for r in range(len(runs))}


def test_merge_runs_matches_contraction_by_networkx():
    import random

    import networkx as nx

    from placer.pieces import merge_runs
    rng = random.Random(0)
    for _ in range(200):
        R = rng.randint(1, 14)
        groups = [rng.randrange(3) for _ in range(R)]
        edges = [(a, b) for a in range(R) for b in range(a + 1, R) if rng.random() < 0.25]
        dag = nx.DiGraph()
        dag.add_nodes_from(range(R))
        dag.add_edges_from(edges)
        want = _merge_runs_by_contraction(dag, groups)
        assert merge_runs(groups, edges) == [want[r] for r in range(R)]

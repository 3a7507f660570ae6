"""Measured per-op times (``op.extra["measured"]``, as ``placer profile``
writes them) drive both cost models directly, like a calibrated graph."""

import numpy as np
import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import Analytical, Problem, Simulator
from placer.cost.problem import measured_times

OVH = 2e-5


def _cluster(kinds=("cpu", "cpu", "cpu"), share=1.0):
    devices = [Device(f"d{i}", 1e12, 1e10, efficiency=0.5, kind=k,
                      extra={"cpu_share": share} if share != 1.0 else {})
               for i, k in enumerate(kinds)]
    return Cluster.from_rules("c", devices, default=(1e9, 1e-5))


def _graph(key, n=6, seed=0):
    rng = np.random.default_rng(seed)
    ops = []
    for i in range(n):
        fwd, bwd = float(rng.uniform(1e-3, 5e-3)), float(rng.uniform(2e-3, 9e-3))
        figures = {"fwd": fwd, "bwd": bwd, "fwd_half": fwd / 2, "bwd_half": bwd / 2,
                   "batch": 8}
        measured = figures if key is None else {key: figures}
        ops.append(Op(f"o{i}", flops=1e9 * (i + 1), bwd_flops=2e9 * (i + 1),
                      param_bytes=1e6, output_bytes=1e6, extra={"measured": measured}))
    edges = [Edge(f"o{i}", f"o{i + 1}", 1e6) for i in range(n - 1)]
    edges.append(Edge("o0", f"o{n - 1}", 5e5))
    return Graph("measured", ops, edges)


def _plans(cluster, n=6):
    names = cluster.names
    return [Plan({f"o{i}": [names[0]] for i in range(n)}, 4, "1f1b"),
            Plan({f"o{i}": [names[i * 2 // n]] for i in range(n)}, 4, "gpipe"),
            Plan({f"o{i}": [names[i % 2]] for i in range(n)}, 2, "1f1b"),
            Plan({f"o{i}": names[:2] if i < 3 else [names[2]] for i in range(n)}, 4, "1f1b")]


def _steps(graph, cluster, plans):
    p = Problem(graph, cluster, op_overhead=OVH)
    sim = [Simulator().estimate(p, plan).step_time for plan in plans]
    ana = [r.step_time for r in Analytical().estimate_many(p, plans)]
    return sim, ana


@pytest.mark.parametrize("key,share", [("cpu", 1.0), (None, 1.0), ("cpu", 0.6)])
def test_measured_times_predict_like_the_calibrated_graph(key, share):
    # by device kind, or one figure for every device: all three devices
    # are alike, so the calibrated graph of d0 holds for all of them (a
    # process's share of a core slows its measured times alike)
    from placer.runtime.profile import calibrated_graph
    c = _cluster(share=share)
    g = _graph(key)
    calibrated = calibrated_graph(_graph("d0"), c, "d0", overhead=OVH)
    for op in calibrated:
        op.extra.pop("measured", None)
    plans = _plans(c)
    sim, ana = _steps(g, c, plans)
    sim_c, ana_c = _steps(calibrated, c, plans)
    assert sim == pytest.approx(sim_c, rel=1e-9)
    assert ana == pytest.approx(ana_c, rel=1e-9)


def test_measured_by_device_name_only_applies_there():
    c = _cluster(("cpu", "gpu", "gpu"))
    g = _graph("d0")
    times = Problem(g, c, op_overhead=OVH).times
    assert times.cls[1] == times.cls[2] != times.cls[0]
    fwd = np.array([op.extra["measured"]["d0"]["fwd"] for op in g]) - OVH
    assert times.forward[:, times.cls[0]] == pytest.approx(fwd)
    # elsewhere FLOPs / sustained rate, as without measurements
    assert times.forward[:, times.cls[1]] == pytest.approx(
        [op.flops / 5e11 for op in g])
    # a plan on d1 only costs what it costs without any measurement
    plan = Plan({op.id: ["d1"] for op in g}, 4)
    bare = Graph("bare", [Op(op.id, flops=op.flops, bwd_flops=op.bwd_flops,
                             param_bytes=op.param_bytes, output_bytes=op.output_bytes)
                          for op in g], g.edges)
    for with_times, without in zip(_steps(g, c, [plan]), _steps(bare, c, [plan])):
        assert with_times == pytest.approx(without, rel=1e-12)


def test_both_models_read_the_same_seconds():
    # one device, m microbatches: each op's measured forward and backward
    # once, plus a launch per op, phase and microbatch beyond the first
    c = _cluster()
    g = _graph("cpu")
    plan = _plans(c)[0]
    sim, ana = _steps(g, c, [plan])
    measured = sum(op.extra["measured"]["cpu"]["fwd"] + op.extra["measured"]["cpu"]["bwd"]
                   for op in g)
    expected = measured + (plan.microbatches - 1) * 2 * OVH * len(g)
    assert sim[0] == pytest.approx(expected, rel=1e-9)
    assert ana[0] == pytest.approx(expected, rel=1e-9)


def test_a_number_is_forward_seconds_and_backward_scales_like_flops():
    ops = [Op("a", flops=1e9, bwd_flops=3e9, extra={"measured": 0.004}),
           Op("b", extra={"measured": {"d0": {"fwd": 0.001}}})]
    g = Graph("n", ops, [Edge("a", "b", 1e3)])
    times = measured_times(Problem(g, _cluster(), op_overhead=0.0))
    k = times.cls[0]
    assert times.forward[:, k].tolist() == pytest.approx([0.004, 0.001])
    assert times.backward[:, k].tolist() == pytest.approx([0.012, 0.002])
    assert Problem(Graph("plain", [Op("a", flops=1e9)]), _cluster()).times is None

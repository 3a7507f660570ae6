"""The analytical model charges what the runtime pays: a task per piece
(``granularity="piece"``: runs of one device merged into one piece are one
task) and no gradient message back for a value that requires none."""

from __future__ import annotations

import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import Problem, get_cost_model


def _two_devices(name: str, edges: list[tuple[str, str]],
                 placement: dict[str, str]) -> tuple[Graph, Cluster, Plan]:
    """Ops of 1 + 2 GFLOP (forward, backward) in ``placement``'s order,
    1 kB tensors, on two 1-TFLOP devices joined by an instant link."""
    ops = [Op(n, flops=1e9, bwd_flops=2e9) for n in placement]
    g = Graph(name, ops, [Edge(a, b, 1e3) for a, b in edges], training=True)
    devs = [Device(n, 1e12, 1e10, efficiency=1.0) for n in sorted(set(placement.values()))]
    return g, Cluster.from_rules("two", devs, default=(1e15, 0.0)), \
        Plan({op: [d] for op, d in placement.items()})


def _fork() -> tuple[Graph, Cluster, Plan]:
    # s -> p, s -> t, t -> q, p -> q; x runs s and t (two runs, one piece),
    # y runs p and q (likewise)
    return _two_devices("fork", [("s", "p"), ("s", "t"), ("t", "q"), ("p", "q")],
                        {"s": "x", "p": "y", "t": "x", "q": "y"})


def test_a_task_per_piece_not_per_run():
    g, c, plan = _fork()
    analytical = get_cost_model("analytical")

    def compute(granularity, task):
        p = Problem(g, c, op_overhead=0.0, task_overhead=task, granularity=granularity)
        return analytical.estimate(p, plan).compute

    # 1 + 2 ms of ops a device and microbatch; a 1 ms task per run and phase
    # (two runs a device) or per piece and phase (one piece a device)
    assert compute("op", 0.0) == pytest.approx({"x": 6e-3, "y": 6e-3})
    assert compute("op", 1e-3) == pytest.approx({"x": 10e-3, "y": 10e-3})
    assert compute("piece", 1e-3) == pytest.approx({"x": 8e-3, "y": 8e-3})
    # the simulator's tasks at that granularity cost the same
    sim = get_cost_model("simulator").estimate(
        Problem(g, c, op_overhead=0.0, task_overhead=1e-3, granularity="piece"), plan)
    bars = {}
    for e in sim.events():
        if e.category in ("forward", "backward"):
            bars[e.lane] = bars.get(e.lane, 0.0) + e.duration
    assert bars == pytest.approx({"x": 8e-3, "y": 8e-3})


def test_no_gradient_message_back_for_a_value_that_requires_none():
    # a's output (a holds parameters): integer indices, no gradient, or
    # floats, a gradient goes back; a message costs each end 0.1 ms
    def step(dtype):
        g = Graph("two", [Op("a", flops=1e9, param_bytes=4.0, extra={"dtype": dtype}),
                          Op("b", flops=2e9, param_bytes=4.0, extra={"dtype": "float32"})],
                  [Edge("a", "b", 1e6)], training=True)
        devs = [Device(n, 1e12, 1e10, efficiency=1.0) for n in ("d0", "d1")]
        c = Cluster.from_rules("two", devs, default=(1e9, 5e-4))
        p = Problem(g, c, op_overhead=0.0, message_overhead=1e-4)
        plan = Plan({"a": ["d0"], "b": ["d1"]})
        return get_cost_model("analytical").estimate(p, plan), \
            get_cost_model("simulator").estimate(p, plan)

    (a_int, s_int), (a_float, s_float) = step("int64"), step("float32")
    # the gradient's message costs each end 0.1 ms more in the backward, and
    # its trip back (0.1 + 1 + 0.5 + 0.1 ms) lengthens the step
    assert a_float.compute["d1"] - a_int.compute["d1"] == pytest.approx(1e-4)
    assert a_float.compute["d0"] - a_int.compute["d0"] == pytest.approx(1e-4)
    assert a_float.step_time - a_int.step_time == pytest.approx(1.7e-3)
    # the simulator agrees on the difference's direction
    assert s_int.step_time < s_float.step_time


def _merged_piece() -> tuple[Graph, Cluster, Plan]:
    # x -> p, x -> q, p -> s, q -> s in the order x p q s: d1 runs p and s,
    # two runs with q on d0 between them, merged into one piece (no path of
    # two steps joins p to s), which starts once q's output is there too
    return _two_devices("merged", [("x", "q"), ("x", "p"), ("p", "s"), ("q", "s")],
                        {"x": "d0", "p": "d1", "q": "d0", "s": "d1"})


@pytest.mark.parametrize("m", [1, 2])
def test_a_piece_waits_for_all_its_inputs_and_the_backward_goes_back(m):
    g, c, plan = _merged_piece()
    plan = Plan(plan.placement, microbatches=m)
    p = Problem(g, c, op_overhead=0.0, granularity="piece")
    ana = get_cost_model("analytical").estimate(p, plan).step_time
    sim = get_cost_model("simulator").estimate(p, plan).step_time
    if m == 1:
        # forward x q (2 ms), then d1's piece p s (2), its backward (4), then
        # q's and x's backward (4): 12 ms, all in a row
        assert sim == pytest.approx(12e-3, rel=1e-3)
    assert ana == pytest.approx(sim, rel=0.05)
    # ops one at a time, p starts on x's output alone and runs beside q
    op = get_cost_model("analytical").estimate(Problem(g, c, op_overhead=0.0), plan).step_time
    assert op < 0.9 * ana

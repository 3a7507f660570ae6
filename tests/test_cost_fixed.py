"""An op's fixed cost (``fixed_flops``): paid whole by every microbatch and
replica, by both cost models alike; absent, nothing changes."""

from __future__ import annotations

import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import Problem, get_cost_model

MODELS = ("simulator", "analytical")


def _graph(fixed: bool) -> Graph:
    ops = [Op(f"o{i}", flops=1e9, bwd_flops=2e9) for i in range(6)]
    if fixed:
        for op in ops:
            op.extra["fixed_flops"] = [5e8, 1e9]
    return Graph("chain", ops, [Edge(f"o{i}", f"o{i + 1}", 1e3) for i in range(5)])


def _cluster() -> Cluster:
    devs = [Device(n, 1e12, 1e10, efficiency=1.0) for n in ("x", "y")]
    return Cluster.from_rules("two", devs, default=(1e9, 0.0))


def _plans(g: Graph, m: int) -> dict:
    ids = g.ids
    return {"one": Plan({o: ["x"] for o in ids}, microbatches=m),
            "pipeline": Plan({o: (["x"] if i < 3 else ["y"]) for i, o in enumerate(ids)},
                             microbatches=m),
            "dp": Plan({o: ["x", "y"] for o in ids}, microbatches=m)}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_one_device_pays_the_fixed_part_per_microbatch(name, m):
    # by hand: per op and microbatch 1.5 ms fixed (fwd + bwd) and 1.5 ms / m
    g = _graph(True)
    p = Problem(g, _cluster(), op_overhead=0.0)
    step = get_cost_model(name).estimate(p, _plans(g, m)["one"]).step_time
    assert step == pytest.approx(6 * m * (1.5e-3 + 1.5e-3 / m))


@pytest.mark.parametrize("name", MODELS)
def test_replicas_pay_the_fixed_part_whole(name):
    g = _graph(True)
    p = Problem(g, _cluster(), op_overhead=0.0, bucket_bytes=1e12)
    # no parameters: no all-reduce; each replica runs half the rows
    step = get_cost_model(name).estimate(p, _plans(g, 1)["dp"]).step_time
    assert step == pytest.approx(6 * (1.5e-3 + 1.5e-3 / 2), rel=1e-6)


@pytest.mark.parametrize("m", [1, 2, 4])
def test_without_fixed_flops_nothing_changes_and_models_agree(m):
    plain, fixed = _graph(False), _graph(True)
    for g in (plain, fixed):
        g_fixed = Problem(g, _cluster(), op_overhead=0.0)
        assert g_fixed.has_fixed == (g is fixed)
    for key in ("one", "pipeline", "dp"):
        steps = {}
        for g in (plain, fixed):
            p = Problem(g, _cluster(), op_overhead=0.0)
            steps[g is fixed] = [get_cost_model(n).estimate(p, _plans(g, m)[key]).step_time
                                 for n in MODELS]
        if m == 1 and key != "dp":
            # one microbatch, whole ops: the fixed part changes nothing
            assert steps[True] == pytest.approx(steps[False])
        else:
            assert all(f > s for f, s in zip(steps[True], steps[False]))
        # both models move alike on the chain
        assert steps[True][0] == pytest.approx(steps[True][1], rel=0.02)


def test_bad_fixed_flops_is_one_clear_error():
    from placer.errors import GraphError
    g = _graph(False)
    g.op("o2").extra["fixed_flops"] = [1.0]
    with pytest.raises(GraphError, match="o2.*fixed_flops"):
        Problem(g, _cluster())

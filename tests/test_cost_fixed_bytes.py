"""An edge's fixed bytes (``fixed_bytes``): sent whole by every microbatch,
priced alike by both cost models; absent, nothing changes."""

from __future__ import annotations

import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import Problem, get_cost_model

MODELS = ("simulator", "analytical")


def _graph(fixed: float | None) -> Graph:
    edge = Edge("a", "b", 1e6)
    if fixed is not None:
        edge.extra["fixed_bytes"] = fixed
    return Graph("two", [Op("a", flops=1.0), Op("b", flops=1.0)], [edge], training=False)


def _cluster() -> Cluster:
    devs = [Device(n, 1e12, 1e10, efficiency=1.0) for n in ("x", "y")]
    return Cluster.from_rules("two", devs, default=(1e9, 0.0))


def _step(name: str, g: Graph, m: int) -> float:
    p = Problem(g, _cluster(), op_overhead=0.0)
    plan = Plan({"a": ["x"], "b": ["y"]}, microbatches=m)
    return get_cost_model(name).estimate(p, plan).step_time


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("fixed, m, seconds", [
    (None, 4, 1e-3),              # 1 MB split over 4 microbatches: 1 ms on the link
    (1e6, 4, 4e-3),               # the whole 1 MB with every microbatch
    (5e5, 4, 4 * 0.625e-3),       # 0.5 MB whole + 0.5 MB / 4, four times
    (1e6, 1, 1e-3),               # one microbatch: fixed or not, the same
    (5e6, 2, 2e-3),               # more than the edge's bytes: all of them
])
def test_fixed_bytes_go_with_every_microbatch(name, fixed, m, seconds):
    assert _step(name, _graph(fixed), m) == pytest.approx(seconds, rel=0.02)


def test_simulator_sends_what_the_edge_says_per_microbatch():
    import placer
    g = _graph(4e5)
    report = placer.simulate(g, _cluster(), Plan({"a": ["x"], "b": ["y"]}, microbatches=4))
    sent = [e.args["bytes"] for e in report.events() if e.category == "transfer"]
    assert sent == pytest.approx([4e5 + 6e5 / 4] * 4)


def test_without_fixed_bytes_the_problem_has_none():
    assert not Problem(_graph(None), _cluster()).has_edge_fixed
    assert Problem(_graph(1.0), _cluster()).has_edge_fixed


@pytest.mark.parametrize("bad", ["many", -1.0, float("nan")])
def test_bad_fixed_bytes_is_one_clear_error(bad):
    from placer.errors import GraphError
    with pytest.raises(GraphError, match="'a' -> 'b': fixed_bytes"):
        Problem(_graph(bad), _cluster())


def test_fixed_bytes_survive_the_graph_file(tmp_path):
    import warnings
    g = _graph(3e5)
    path = tmp_path / "g.json"
    g.save(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # a documented key: no unknown-key warning
        back = Graph.load(str(path))
    assert back.edges[0].extra["fixed_bytes"] == 3e5

import json

import pytest

from placer import Cluster, Edge, Graph, Op, Plan
from placer.errors import PlanError


@pytest.fixture
def cluster():
    return Cluster.preset("two-sites")


def good_plan(graph, cluster):
    return Plan({op.id: ["a0"] for op in graph}, microbatches=4, schedule="gpipe",
                method="manual", predicted={"step_time": 1.5}).bind(graph, cluster)


def test_roundtrip(tmp_path, tiny_graph, cluster):
    plan = good_plan(tiny_graph, cluster)
    plan.placement["fc2"] = ["b0", "b1"]
    plan.extra["note"] = "kept"
    path = tmp_path / "p.json"
    plan.save(path)
    back = Plan.load(path)
    assert back == plan
    data = json.loads(path.read_text())
    assert data["format"] == "placer.plan/v1" and data["graph"] == tiny_graph.fingerprint()
    back.validate(tiny_graph, cluster)


@pytest.mark.parametrize("mutate, words", [
    (lambda p: p.placement.pop("fc1"), "not placed"),
    (lambda p: p.placement.__setitem__("ghost", ["a0"]), "not in graph"),
    (lambda p: p.placement.__setitem__("fc1", []), "no devices"),
    (lambda p: p.placement.__setitem__("fc1", ["a0", "a0"]), "listed twice"),
    (lambda p: p.placement.__setitem__("fc1", ["zz9"]), "unknown device"),
    (lambda p: setattr(p, "graph", "0" * 64), "another graph"),
    (lambda p: setattr(p, "cluster", "0" * 64), "another cluster"),
])
def test_validate_rejects(tiny_graph, cluster, mutate, words):
    plan = good_plan(tiny_graph, cluster)
    mutate(plan)
    with pytest.raises(PlanError, match=words):
        plan.validate(tiny_graph, cluster)


def test_colocation(cluster):
    g = Graph("tied", [Op("emb", colocate="w"), Op("mid"), Op("head", colocate="w")],
              [Edge("emb", "mid"), Edge("mid", "head")])
    plan = Plan({"emb": ["a0"], "mid": ["a1"], "head": ["a1"]})
    with pytest.raises(PlanError, match="colocate group 'w'"):
        plan.validate(g, cluster)
    plan.placement["head"] = ["a0"]
    plan.validate(g, cluster)


@pytest.mark.parametrize("text, words", [
    ('{"format": "placer.plan/v1", "placement": {"a": 3}}', "placement.a: expected a list"),
    ('{"format": "placer.plan/v1", "placement": {}, "schedule": "zigzag"}', "unknown schedule"),
    ('{"format": "placer.plan/v1", "placement": {}, "microbatches": 0}', "microbatches: must be > 0"),
    ('{"format": "placer.plan/v1", "placement": {}, "microbatches": 2.5}', "whole number"),
    ('{"format": "placer.plan/v1"}', "placement: missing"),
    ('{"format": "placer.plan/v1", "placement": {}, "graph": 5}', "graph: expected a sha256"),
    ('{"placement": {}}', "format: missing"),
])
def test_bad_plan_files(tmp_path, text, words):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(PlanError) as info:
        Plan.load(path)
    assert words in str(info.value) and str(path) in str(info.value)

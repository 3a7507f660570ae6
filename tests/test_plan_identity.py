"""scripts/plan_identity.py: a fixed-seed search gives the same line twice."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "plan_identity.py"


def _script():
    spec = importlib.util.spec_from_file_location("plan_identity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_seeded_search_repeats_its_digest():
    script = _script()
    graph, cluster = script.PROBLEMS[0]
    first = script.run("evolution", graph, cluster, 0, 120)
    method, problem, seed, digest, step = first.split()
    assert (method, problem, seed) == ("evolution", f"{graph}@{cluster}", "0")
    assert len(digest) == 16 and float(step) > 0
    assert script.run("evolution", graph, cluster, 0, 120) == first


def test_the_digest_sees_placement_microbatches_and_schedule():
    from placer import Plan
    script = _script()
    plan = Plan({"a": ["x"], "b": ["y"]}, microbatches=2)
    others = [Plan({"a": ["x"], "b": ["x"]}, microbatches=2),
              Plan({"a": ["x"], "b": ["y"]}, microbatches=4),
              Plan({"a": ["x"], "b": ["y"]}, microbatches=2, schedule="gpipe")]
    assert script.digest(plan) == script.digest(Plan({"b": ["y"], "a": ["x"]}, microbatches=2))
    assert all(script.digest(o) != script.digest(plan) for o in others)

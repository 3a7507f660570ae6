"""placer.cache: what modules derive from a Problem (or the policy's encoded
problem) is kept in its ``cache``, by "<module>.<what>" key, not written
into the object's attributes."""
import copy
import pickle

import pytest

from placer import Plan, generators
from placer.cache import Cache
from placer.cost import Problem, get_cost_model


def test_an_entry_is_built_once_per_key():
    cache, calls = Cache(), []

    def build():
        calls.append(1)
        return {"n": len(calls)}

    first = cache.get_or_build("test.entry", build)
    assert cache.get_or_build("test.entry", build) is first and len(calls) == 1
    assert cache.get_or_build("test.other", build) == {"n": 2}
    assert "test.entry" in cache and "test.missing" not in cache and len(cache) == 2
    assert "test.entry" in repr(cache)


def plans(problem):
    devices = problem.devices
    one = Plan({op: [devices[i * len(devices) // problem.n_ops]]
                for i, op in enumerate(problem.ids)}, microbatches=2)
    dp = Plan({op: devices[:2] for op in problem.ids}, microbatches=1)
    return [one, dp]


def test_cost_models_and_searches_cache_in_problem_cache_not_in_its_attributes():
    from placer.search.common import context

    g, c = generators.graph("experts-e3-l2-s0"), generators.cluster("classes-d4-s0")
    problem = Problem(g, c)
    attributes = set(vars(problem))
    before = {m: [get_cost_model(m).estimate(problem, p).step_time for p in plans(problem)]
              for m in ("simulator", "analytical")}
    ctx = context(problem)
    assert context(problem) is ctx
    assert set(vars(problem)) == attributes, "a module wrote into the problem's attributes"
    for key in ("simulator.allreduce", "analytical.precomputed", "analytical.group_tables",
                "analytical.edges_by_source", "analytical.allreduce_coefficients",
                "search.context"):
        assert key in problem.cache, key
    # a fresh problem (empty cache) and a pickled copy (entries carried)
    # estimate the same
    for other in (Problem(g, c), pickle.loads(pickle.dumps(problem)), copy.deepcopy(problem)):
        again = {m: [get_cost_model(m).estimate(other, p).step_time for p in plans(other)]
                 for m in ("simulator", "analytical")}
        assert again == before
    # a replaced problem starts empty: its entries would be another graph's
    assert len(problem.replace(recompute=True).cache) == 0


def test_the_policy_caches_its_adjacency_on_the_encoded_problem():
    pytest.importorskip("torch_geometric")
    from gnn.features import encode_problem
    from gnn.model import _adjacency, _np_adjacency

    problem = Problem(generators.graph("rnn-t3-l2-s0"), generators.cluster("classes-d3-s0"))
    pg = encode_problem(problem, max_units=32)
    fields = set(vars(pg))
    assert _adjacency(pg) is _adjacency(pg)
    assert _np_adjacency(pg) is _np_adjacency(pg)
    assert set(vars(pg)) == fields
    assert "model.adjacency" in pg.cache and "model.np_adjacency" in pg.cache
    assert "cache" not in repr(pg)

"""CostOptions: one frozen dataclass for the Problem's options, validated in
one place, read like the keyword dict it replaced."""
import dataclasses
import pickle

import numpy as np
import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import CostOptions, Problem, get_cost_model
from placer.errors import StrategyError


def small():
    g = Graph("t", [Op("a", flops=1e9, param_bytes=1e6), Op("b", flops=2e9, param_bytes=1e6)],
              [Edge("a", "b", 1e6)])
    c = Cluster.from_rules("c", [Device("x", 1e12, 1e10), Device("y", 1e12, 1e10)],
                           default=(1e9, 1e-4))
    return g, c


@pytest.mark.parametrize("field, value, message", [
    ("objective", "speed", "unknown objective 'speed'.*step_time, throughput, memory"),
    ("default_efficiency", 0.0, r"default_efficiency must be in \(0, 1\]"),
    ("default_efficiency", 1.5, r"default_efficiency must be in \(0, 1\]"),
    ("optimizer_bytes_per_param", -1.0, "optimizer_bytes_per_param must be >= 0"),
    ("gradient_bytes_per_param", float("nan"), "gradient_bytes_per_param must be >= 0"),
    ("op_overhead", -1e-6, "op_overhead must be >= 0"),
    ("task_overhead", -1.0, "task_overhead must be >= 0"),
    ("message_overhead", -1.0, "message_overhead must be >= 0"),
    ("resume_overhead", -1.0, "resume_overhead must be >= 0"),
    ("collective_efficiency", float("inf"), "collective_efficiency must be > 0 and finite"),
    ("collective_efficiency", 0.0, "collective_efficiency must be > 0 and finite"),
    ("granularity", "module", "unknown granularity 'module'.*op, piece"),
    ("nic", "fast", "unknown nic mode 'fast'.*max_link"),
    ("message_copy_rate", 0.0, r"message_copy_rate must be > 0 \(inf: free\)"),
])
def test_a_bad_field_is_one_error_naming_it(field, value, message):
    for make in (lambda: CostOptions(**{field: value}),
                 lambda: Problem(*small(), **{field: value}),
                 lambda: CostOptions().replace(**{field: value}),
                 lambda: Problem(*small()).replace(**{field: value})):
        with pytest.raises(StrategyError, match=message):
            make()


def test_keywords_options_and_a_dict_make_the_same_problem():
    g, c = small()
    by_keywords = Problem(g, c, recompute=True, op_overhead=1e-5, granularity="piece")
    options = CostOptions(recompute=True, op_overhead=1e-5, granularity="piece")
    by_options = Problem(g, c, options=options)
    by_dict = Problem(g, c, options=dict(options))
    assert by_keywords.options == by_options.options == by_dict.options == options
    assert by_options.options is options
    # keywords beside options replace its fields
    mixed = Problem(g, c, options=options, granularity="op")
    assert mixed.granularity == "op" and mixed.recompute is True
    plan = Plan({"a": ["x"], "b": ["y"]}, microbatches=2)
    sim = get_cost_model("simulator")
    times = {sim.estimate(p, plan).step_time for p in (by_keywords, by_options, by_dict)}
    assert len(times) == 1


def test_fields_are_stored_as_their_types_and_frozen():
    o = CostOptions(op_overhead=0, recompute=1, bucket_bytes=10)
    assert type(o.op_overhead) is float and type(o.bucket_bytes) is float
    assert o.recompute is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.recompute = False
    # every field has a default: CostOptions() are the defaults Problem had
    assert CostOptions()["objective"] == "step_time" and CostOptions().merge == 0.02


def test_options_read_like_the_keyword_dict_they_replace():
    g, c = small()
    p = Problem(g, c, allreduce_overlap=False, nic="none")
    names = [f.name for f in dataclasses.fields(CostOptions)]
    assert list(p.options) == names and len(p.options) == len(names)
    as_dict = dict(p.options)
    assert as_dict["allreduce_overlap"] is False and as_dict["nic"] == "none"
    assert p.options == as_dict and p.options != {**as_dict, "nic": "max_link"}
    assert Problem(g, c, **p.options).options == p.options
    assert hash(CostOptions(merge=0)) == hash(CostOptions(merge=0.0))
    assert p.options.get("missing", 7) == 7 and "merge" in p.options
    with pytest.raises(KeyError):
        p.options["missing"]
    # every option is an attribute of the problem too
    for name in names:
        assert getattr(p, name) == p.options[name]


def test_replace_keeps_the_rest_and_the_problem_pickles():
    g, c = small()
    p = Problem(g, c, recompute=True, objective="memory")
    q = p.replace(merge=0.0)
    assert (q.graph, q.cluster, q.recompute, q.objective, q.merge) == (g, c, True, "memory", 0.0)
    assert p.merge == 0.02
    other = Graph("u", [Op("a", flops=1.0)])
    r = p.replace(other)
    assert r.graph is other and r.options == p.options and r.ids == ["a"]
    back = pickle.loads(pickle.dumps(p))
    assert back.options == p.options and np.array_equal(back.flops, p.flops)


def test_an_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="typo"):
        Problem(*small(), typo=1)


def test_the_runtimes_overrides_are_cost_options():
    from placer.runtime.run import RUNTIME_OPTIONS
    options = CostOptions(**RUNTIME_OPTIONS)
    assert all(options[k] == v for k, v in RUNTIME_OPTIONS.items())

"""The data-parallel all-reduce bucket size as a plan choice: the plan
field, its pricing by the simulator, its search, and the runtime's use."""

import json

import numpy as np
import pytest
import torch

import placer
from evolution.dtfm import even_allocation, scale_batch
from placer import Plan, zoo
from placer.cost import Problem, get_cost_model
from placer.errors import PlanError
from placer.runtime import run
from placer.runtime.engine import _buckets
from placer.search.buckets import choose_buckets

from runtime_helpers import assert_close_result, reference


def test_plan_field_round_trips_and_rejects_bad_values(tmp_path):
    plan = Plan({"x": ["a0", "a1"]}, allreduce={"bucket_bytes": 1e8, "overlap": False})
    path = tmp_path / "p.json"
    plan.save(path)
    back = Plan.load(path)
    assert back.allreduce == {"bucket_bytes": 1e8, "overlap": False} and back.extra == {}
    assert "allreduce" not in Plan({"x": ["a0"]}).to_dict()      # default: absent
    doc = json.loads(path.read_text())
    for bad, words in (({"bucket_bytes": 0}, "allreduce.bucket_bytes"),
                       ({"buckets": 3}, "allreduce.buckets"),
                       ({"overlap": "yes"}, "allreduce.overlap")):
        path.write_text(json.dumps(dict(doc, allreduce=bad)))
        with pytest.raises(PlanError, match=words) as err:
            Plan.load(path)
        assert "p.json" in str(err.value)


@pytest.fixture(scope="module")
def worldwide():
    g = scale_batch(placer.datasets.graph("gpt-1.3b.module"), 122)
    return Problem(g, placer.Cluster.preset("dtfm-worldwide"))


def test_simulator_prices_the_bucket_size(worldwide):
    # DT-FM's layout: data-parallel groups across the eight cities
    order = np.arange(64).reshape(8, 8).T.ravel().tolist()
    plan = even_allocation(worldwide, 8, 8, 61, order=order)
    sim = get_cost_model("simulator")
    base = sim.estimate(worldwide, plan)
    one = Plan(dict(plan.placement), 61, plan.schedule, allreduce={"bucket_bytes": 1e10})
    big = sim.estimate(worldwide, one)
    # each 25 MB bucket pays the ring's latency 14 times over links of up
    # to 238 ms: one bucket is about three times faster
    assert base.step_time > 2.5 * big.step_time
    chosen, report = choose_buckets(worldwide, plan, sim, base)
    assert chosen.allreduce["bucket_bytes"] > 1e8
    assert report.step_time <= big.step_time * 1.001
    assert plan.allreduce is None                          # the input is left alone


def test_no_search_on_fast_links():
    g = placer.datasets.graph("gpt-125m.module")
    problem = Problem(g, placer.Cluster.preset("a100x8"))
    plan = Plan({op: ["gpu0", "gpu1"] for op in g.ids}, microbatches=2)
    chosen, _ = choose_buckets(problem, plan, get_cost_model("simulator"))
    assert chosen is plan and plan.allreduce is None


def test_buckets_are_views_covering_the_gradient():
    flats = {"a": torch.arange(10.0), "b": torch.arange(10.0) * 2}
    pieces = _buckets(flats, 3 * 4)            # 3 float32 values each
    assert [p["a"].numel() for p in pieces] == [3, 3, 3, 1]
    pieces[1]["b"].zero_()
    assert flats["b"][3:6].abs().sum() == 0     # views, not copies
    assert len(_buckets(flats, None)) == 1


def test_runtime_all_reduces_in_the_plans_buckets(monkeypatch):
    from placer.runtime.engine import LocalTransport
    sizes = []
    inner = LocalTransport.allreduce

    def counted(self, tensors, holders):
        sizes.append(next(iter(tensors.values())).numel())
        return inner(self, tensors, holders)
    monkeypatch.setattr(LocalTransport, "allreduce", counted)
    model, inputs = zoo.build("gpt-125m", tiny=True, batch=4)
    graph = placer.trace(model, inputs)
    out, loss, grads = reference(model, inputs)
    plan = Plan({op: ["a", "b"] for op in graph.ids}, microbatches=2,
                allreduce={"bucket_bytes": 4096})
    result = run(model, plan, inputs, steps=1, warmup=0, graph=graph)
    assert_close_result(result, out, loss, grads)
    n_params = sum(p.numel() for p in model.parameters())
    assert max(sizes) == 1024 and sum(sizes) == n_params   # 4 KB of float32 each

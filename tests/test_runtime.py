"""The single-process runtime: placed runs match the unplaced model."""

from __future__ import annotations

import functools

import pytest
import torch

import placer
from placer import Plan, zoo
from placer.errors import PlanError
from placer.runtime import run

from runtime_helpers import (assert_close_result, meta_build, meta_reference,  # noqa: F401
                             one_thread, random_plan, reference)

DEVICES = ["a", "b", "c"]


@functools.lru_cache(maxsize=None)
def _model(name: str, batch: int = 4):
    model, inputs = zoo.build(name, tiny=True, batch=batch)
    graph = placer.trace(model, inputs)
    return model, inputs, graph


@pytest.mark.parametrize("name,seed,microbatches,schedule", [
    ("gpt-125m", 0, 2, "1f1b"), ("gpt-125m", 1, 4, "gpipe"), ("gpt-125m", 5, 2, "gpipe"),
    ("bert-base", 2, 2, "1f1b"), ("bert-base", 3, 1, "gpipe"),
    ("dlrm", 4, 2, "1f1b"), ("utransformer", 6, 2, "1f1b"),
])
def test_random_plans_match_unplaced(name, seed, microbatches, schedule):
    model, inputs, graph = _model(name)
    out, loss, grads = reference(model, inputs)
    plan = random_plan(graph, DEVICES, seed=seed, microbatches=microbatches, schedule=schedule)
    result = run(model, plan, inputs, steps=1, warmup=0, graph=graph)
    assert_close_result(result, out, loss, grads)
    assert result.report.step_time > 0


@pytest.mark.parametrize("name", ["resnet50", "inception"])
def test_batchnorm_models_keep_statistics_whole(name):
    # BatchNorm sees the whole batch only without microbatches; its pieces
    # stay unsharded even when the plan replicates them.
    model, inputs, graph = _model(name)
    out, loss, grads = reference(model, inputs)
    plan = random_plan(graph, DEVICES, seed=0, microbatches=1, dp=1.0)
    result = run(model, plan, inputs, steps=1, warmup=0, graph=graph)
    assert_close_result(result, out, loss, grads)
    assert any("mixes the batch" in n for n in result.notes)


def test_data_parallel_everything_matches():
    model, inputs, graph = _model("gpt-125m")
    out, loss, grads = reference(model, inputs)
    plan = Plan({op: ["a", "b"] for op in graph.ids}, microbatches=2)
    result = run(model, plan, inputs, steps=1, warmup=0, graph=graph)
    assert_close_result(result, out, loss, grads)
    assert not result.notes


def test_sum_loss_and_targets():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    x, y = torch.randn(6, 8), torch.randint(0, 3, (6,))
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    ref = loss_fn(model(x), y)
    ref.backward()
    graph = placer.trace(model, x)
    plan = Plan(dict(zip(graph.ids, [["a"], ["a", "b"], ["b"], ["c"]])), microbatches=3)
    result = run(model, plan, x, steps=1, warmup=0, loss_fn=loss_fn, targets=y,
                 loss_reduction="sum", graph=graph)
    assert abs(result.loss - float(ref.detach())) < 1e-4
    for name, p in model.named_parameters():
        torch.testing.assert_close(result.gradients[name], p.grad, atol=1e-5, rtol=1e-4)


def test_training_steps_match_sgd_and_leave_model_alone():
    model, inputs, graph = _model("gpt-125m")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = random_plan(graph, DEVICES, seed=7, microbatches=2)
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    result = run(model, plan, inputs, steps=2, warmup=0, optimizer=sgd, graph=graph)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    import copy
    ref = copy.deepcopy(model)
    opt = sgd(ref.parameters())
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = placer.runtime.default_loss(ref(*inputs))
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
    assert result.losses == pytest.approx(losses, rel=1e-4, abs=1e-5)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(result.parameters[name], p.detach(), atol=1e-5, rtol=1e-4)


def test_inference_outputs():
    model, inputs, graph = _model("bert-base")
    with torch.no_grad():
        out = model(*inputs)
    plan = random_plan(graph, DEVICES, seed=3, microbatches=2)
    result = run(model, plan, inputs, steps=1, warmup=0, training=False, graph=graph)
    torch.testing.assert_close(result.outputs, out, atol=1e-5, rtol=1e-4)
    assert result.loss is None and result.gradients == {}


def test_report_has_measured_and_predicted():
    model, inputs, graph = _model("gpt-125m")
    cluster = placer.Cluster.from_rules("three", [placer.Device(d, 1e11, 1e10) for d in DEVICES],
                                        default=(1e9, 1e-4))
    plan = random_plan(graph, DEVICES, seed=1, microbatches=2)
    result = run(model, plan, inputs, steps=2, warmup=1, graph=graph, cluster=cluster)
    report = result.report
    assert report.predicted is not None and report.predicted > 0
    assert set(report.busy) == set(report.peak_memory) <= set(DEVICES)
    assert all(v > 0 for v in report.peak_memory.values())
    assert len(report.step_times) == 2
    assert report.error() is not None


def test_measured_step_has_a_timeline_and_trace(tmp_path):
    import json
    model, inputs, graph = _model("gpt-125m")
    plan = random_plan(graph, DEVICES, seed=2, microbatches=2, dp=0.3)
    report = run(model, plan, inputs, steps=2, warmup=1, graph=graph).report
    events = report.events()
    pairs = {(e.category, e.args["microbatch"], e.name.split(" ", 1)[1], e.lane)
             for e in events if e.category in ("forward", "backward")}
    fwd = {(m, what, lane) for cat, m, what, lane in pairs if cat == "forward"}
    bwd = {(m, what, lane) for cat, m, what, lane in pairs if cat == "backward"}
    assert fwd and bwd <= fwd and {m for m, _, _ in fwd} == {0, 1}
    assert {e.lane for e in events} <= set(DEVICES)
    assert all(e.start >= 0 and e.duration >= 0 for e in events)
    assert max(e.start + e.duration for e in events) <= max(report.step_times) * 1.5
    if any(len(devs) > 1 for devs in plan.placement.values()):
        assert any(e.category == "allreduce" for e in events)
    report.to_chrome_trace(tmp_path / "t.json")
    lanes = {ev["args"]["name"] for ev in json.loads((tmp_path / "t.json").read_text())
             ["traceEvents"] if ev.get("name") == "process_name"}
    assert {f"device {e.lane}" for e in events} <= lanes


def test_plan_for_other_model_is_rejected():
    model, inputs, graph = _model("gpt-125m")
    with pytest.raises(PlanError):
        run(model, Plan({"nope": ["a"]}), inputs, steps=1)


def test_deterministic():
    model, inputs, graph = _model("dlrm")
    plan = random_plan(graph, DEVICES, seed=2, microbatches=2)
    a = run(model, plan, inputs, steps=1, warmup=0, graph=graph)
    b = run(model, plan, inputs, steps=1, warmup=0, graph=graph)
    assert a.loss == b.loss
    for k in a.gradients:
        assert torch.equal(a.gradients[k], b.gradients[k])


class _Pair(torch.nn.Module):
    """A module returning a tuple."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x), torch.relu(self.b(x))


class _TupleModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.two = _Pair()
        self.p = torch.nn.Linear(8, 8)
        self.q = torch.nn.Linear(8, 8)

    def forward(self, x):
        u, v = self.two(x)
        return self.p(u) + self.q(v), v


@pytest.mark.parametrize("granularity,placement", [
    # the tuple's producer on b, its parts used on a (replicated) and on b
    ("module", {"x": ["a"], "two": ["b"], "p": ["a", "b"], "q": ["b"], "add": ["a", "b"]}),
    # a piece merged from two runs (two.a, relu on a+b) needs a piece (two.b
    # on b) whose node comes between them: pieces are built in dependency order
    ("op", {"x": ["a", "b"], "two.a": ["a", "b"], "two.b": ["b"], "relu": ["a", "b"],
            "p": ["b"], "q": ["a", "b"], "add": ["a"]}),
])
def test_tuple_outputs_crossing_devices_match_unplaced(granularity, placement):
    model, x = _TupleModel(), torch.randn(4, 8)
    graph = placer.trace(model, (x,), granularity=granularity)
    assert sorted(graph.ids) == sorted(placement)
    out, loss, grads = reference(model, (x,))
    result = run(model, Plan(placement, microbatches=2), (x,), steps=1, warmup=0, graph=graph)
    assert_close_result(result, out, loss, grads)


@pytest.mark.parametrize("name,seed,microbatches", [("gpt-125m", 0, 2), ("resnet50", 1, 1),
                                                    ("dlrm", 2, 2)])
def test_meta_model_matches_materialized_model(name, seed, microbatches):
    # weights left on meta are built where their piece runs, as
    # zoo.materialize builds the whole model: same losses and gradients
    meta, inputs = meta_build(name)
    full, _ = meta_reference(name)
    graph = placer.trace(full, inputs)
    out, loss, grads = reference(full, inputs)
    plan = random_plan(graph, DEVICES, seed=seed, microbatches=microbatches, dp=0.3)
    result = run(meta, plan, inputs, steps=1, warmup=0, graph=graph)
    assert_close_result(result, out, loss, grads)
    assert all(p.is_meta for p in meta.parameters())        # the model is left alone


def test_meta_model_builds_only_each_devices_pieces():
    from placer.runtime.run import Runner
    meta, inputs = meta_build("gpt-125m")
    full, _ = meta_reference("gpt-125m")
    graph = placer.trace(full, inputs)
    order = graph.topological_order()
    plan = Plan({op: ["a" if i < len(order) // 2 else "b"] for i, op in enumerate(order)})
    runner = Runner(meta, plan, inputs, graph=graph)
    names = {d: set(table) for d, table in runner.engine.copies.items()}
    everything = {n for n, _ in full.named_parameters()} | {n for n, _ in full.named_buffers()}
    assert names["a"] | names["b"] == everything
    assert len(names["a"]) < len(everything) and len(names["b"]) < len(everything)
    whole = dict(full.named_parameters()) | dict(full.named_buffers())
    for table in runner.engine.copies.values():
        for n, t in table.items():
            assert not t.is_meta
            torch.testing.assert_close(t, whole[n], rtol=0, atol=0)


def test_meta_weight_without_reset_parameters_is_a_clear_error():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.empty(4))

        def forward(self, x):
            return x * self.w

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), Scale())
    x = torch.randn(2, 4)
    graph = placer.trace(torch.nn.Sequential(torch.nn.Linear(4, 4), Scale()), x)
    plan = Plan({op: ["a"] for op in graph.ids})
    with pytest.raises(PlanError, match="no reset_parameters"):
        run(model, plan, x, steps=1, warmup=0, graph=graph)

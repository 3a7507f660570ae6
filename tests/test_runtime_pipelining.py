"""The pipelining engine (torch.distributed.pipelining) and the built-in one
give the unplaced model's loss and gradients on the same plans."""

from __future__ import annotations

import functools

import pytest
import torch

import placer
from placer import Plan, zoo
from placer.cli import main
from placer.errors import PlanError
from placer.runtime.dist import launch

from runtime_helpers import one_thread, reference  # noqa: F401

RTOL = 1e-5


@pytest.fixture(scope="module")
def gpt():
    build = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=4)
    model, inputs = build()
    graph = placer.trace(model, inputs, granularity="module")
    return build, model, inputs, graph, reference(model, inputs)


def _plan(graph, devices_of, microbatches=2, schedule="1f1b"):
    """``devices_of(k)``: the device group of the k-th op in topological order."""
    return Plan({op: list(devices_of(k)) for k, op in enumerate(graph.topological_order())},
                microbatches=microbatches, schedule=schedule)


#: GPT tiny, module ops: idx wte arange wpe add blocks.0 blocks.1 ln_f lm_head
PLANS = {
    "gpipe": (lambda k: ["a" if k < 6 else "b"], "gpipe", "ScheduleLoopedBFS"),
    "1f1b": (lambda k: ["a" if k < 6 else "b"], "1f1b", "ScheduleInterleaved1F1B"),
    # a and b hold two stages each (wte..add, blocks.1 | blocks.0, ln_f..)
    "interleaved": (lambda k: [["a", "b", "a", "b"][min(3, max(0, k - 4))]], "1f1b",
                    "ScheduleInterleaved1F1B"),
    "data-parallel": (lambda k: ["a", "b"] if k < 6 else ["c", "d"], "1f1b",
                      "ScheduleInterleaved1F1B"),
}


def _close(loss, grads, ref_loss, ref_grads):
    assert abs(loss - ref_loss) <= RTOL * abs(ref_loss), (loss, ref_loss)
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=RTOL, atol=1e-7,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("name", list(PLANS))
def test_both_engines_match_unplaced_in_one_process(gpt, name):
    _, model, inputs, graph, (out, loss, grads) = gpt
    devices_of, schedule, cls = PLANS[name]
    plan = _plan(graph, devices_of, schedule=schedule)
    for engine in ("builtin", "pipelining"):
        result = placer.run(model, plan, inputs, steps=1, warmup=0, graph=graph, engine=engine)
        _close(result.loss, result.gradients, loss, grads)
        torch.testing.assert_close(result.outputs, out, rtol=1e-4, atol=1e-5)
        assert result.report.step_time > 0
    # one process holds every stage: torch's multi-stage schedule for the plan's
    assert result.report.extra == {"engine": "pipelining", "schedule_class": cls}


class _Skip(torch.nn.Module):
    """A value made in the first stage is read again in the last."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(6, 6) for _ in range(3))

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.c(torch.tanh(self.b(h))) + h * x


def test_values_skip_stages_and_sum_loss():
    torch.manual_seed(0)
    model, x = _Skip(), torch.randn(6, 6)
    graph = placer.trace(model, (x,), granularity="module")
    plan = Plan({op: ["p" if op in ("x", "a", "relu") else "q" if op in ("b", "tanh") else "r"]
                 for op in graph.ids}, microbatches=3, schedule="gpipe")
    loss_fn = lambda out: out.pow(2).sum()   # noqa: E731
    out, ref_loss, ref_grads = reference(model, (x,), loss_fn)
    result = placer.run(model, plan, (x,), steps=1, warmup=0, graph=graph, loss_fn=loss_fn,
                        loss_reduction="sum", engine="pipelining")
    _close(result.loss, result.gradients, ref_loss, ref_grads)
    torch.testing.assert_close(result.outputs, out)


def test_optimizer_steps_like_the_builtin_engine(gpt):
    _, model, inputs, graph, _ = gpt
    plan = _plan(graph, PLANS["interleaved"][0])
    sgd = functools.partial(torch.optim.SGD, lr=0.5)
    runs = [placer.run(model, plan, inputs, steps=2, warmup=0, graph=graph, optimizer=sgd,
                       engine=e) for e in ("builtin", "pipelining")]
    assert runs[0].losses[1] != runs[0].losses[0]
    for a, b in zip(runs[0].losses, runs[1].losses):
        assert abs(a - b) <= RTOL * abs(a)
    for name, value in runs[0].parameters.items():
        torch.testing.assert_close(runs[1].parameters[name], value, rtol=1e-5, atol=1e-6)


def test_ranks_interleaved_match_unplaced(gpt):
    build, _, _, graph, (out, loss, grads) = gpt
    plan = _plan(graph, PLANS["interleaved"][0])
    result = launch(plan, build, steps=1, warmup=0, timeout=180, engine="pipelining",
                    graph=graph)
    _close(result["loss"], result["gradients"], loss, grads)
    torch.testing.assert_close(result["outputs"], out, rtol=1e-4, atol=1e-5)
    assert result["report"]["schedule_class"] == "ScheduleInterleaved1F1B"
    assert result["report"]["step_time"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name,cls", [("gpipe", "ScheduleGPipe"),
                                      ("data-parallel", "Schedule1F1B")])
def test_ranks_match_unplaced(gpt, name, cls):
    build, _, _, graph, (out, loss, grads) = gpt
    devices_of, schedule, _ = PLANS[name]
    plan = _plan(graph, devices_of, schedule=schedule)
    result = launch(plan, build, steps=1, warmup=0, timeout=180, engine="pipelining",
                    graph=graph)
    _close(result["loss"], result["gradients"], loss, grads)
    assert result["report"]["schedule_class"] == cls


@pytest.mark.parametrize("devices_of,words", [
    (lambda k: ["a"] if k < 6 else ["b", "c"], "unequal data-parallel degrees"),
    (lambda k: [["a", "b", "c", "a"][min(3, max(0, k - 4))]], "round-robin"),
])
def test_plans_it_cannot_run_are_one_line(gpt, devices_of, words):
    _, model, inputs, graph, _ = gpt
    with pytest.raises(PlanError, match=words) as info:
        placer.run(model, _plan(graph, devices_of), inputs, steps=1, graph=graph,
                   engine="pipelining")
    assert "\n" not in str(info.value)


def test_unknown_engine_and_inference_are_refused(gpt):
    _, model, inputs, graph, _ = gpt
    plan = _plan(graph, PLANS["gpipe"][0])
    with pytest.raises(PlanError, match="unknown engine"):
        placer.run(model, plan, inputs, graph=graph, engine="deepspeed")
    with pytest.raises(PlanError, match="training"):
        placer.run(model, plan, inputs, graph=graph, engine="pipelining", training=False)


def test_cli_run_with_the_pipelining_engine(tmp_path, capsys, gpt):
    _, _, _, graph, (_, loss, _) = gpt
    path = tmp_path / "plan.json"
    _plan(graph, PLANS["interleaved"][0]).save(path)
    args = ["run", str(path), "--model", "gpt-125m", "--tiny", "--batch", "4",
            "--steps", "1", "--warmup", "0", "--engine", "pipelining"]
    assert main(args) == 0
    line = capsys.readouterr().out
    assert "measured" in line and f"loss {loss:.6g}" in line
    _plan(graph, lambda k: ["a"] if k < 6 else ["b", "c"]).save(path)
    assert main(args) == 2
    # progress lines ("... ...") come on a slow host; the error is one line
    lines = [ln for ln in capsys.readouterr().err.strip().splitlines()
             if not ln.endswith(" ...")]
    assert len(lines) == 1
    assert lines[0].startswith("placer run: error:") and "data-parallel" in lines[0]


def test_integers_cross_stages_with_static_shapes():
    # DLRM's sparse ids leave the first stage as int64: torch's own shape
    # inference would run the next stage on uninitialised indices
    model, inputs = zoo.build("dlrm", tiny=True, batch=4)
    graph = placer.trace(model, inputs, granularity="module")
    order = graph.topological_order()
    plan = _plan(graph, lambda k: [["a", "b", "a", "b"][min(3, 4 * k // len(order))]])
    _, loss, grads = reference(model, inputs)
    result = placer.run(model, plan, inputs, steps=1, warmup=0, graph=graph,
                        engine="pipelining")
    _close(result.loss, result.gradients, loss, grads)
    uneven = _plan(graph, lambda k: ["a" if k < len(order) // 2 else "b"], microbatches=3)
    with pytest.raises(PlanError, match="equal microbatches"):
        placer.run(model, uneven, inputs, steps=1, graph=graph, engine="pipelining")


def test_unequal_microbatches_of_floats(gpt):
    _, model, inputs, graph, (_, loss, grads) = gpt
    plan = _plan(graph, PLANS["gpipe"][0], microbatches=3, schedule="gpipe")   # rows 2, 1, 1
    result = placer.run(model, plan, inputs, steps=1, warmup=0, graph=graph,
                        engine="pipelining")
    _close(result.loss, result.gradients, loss, grads)


@pytest.mark.slow
def test_a_dead_rank_is_named_by_this_engine_rank_order(gpt, monkeypatch):
    from placer.runtime.dist import RankError
    build, _, _, graph, _ = gpt
    plan = _plan(graph, PLANS["data-parallel"][0])     # ranks a, c | b, d
    monkeypatch.setenv("PLACER_TEST_FAULT", "1:0:exit")
    with pytest.raises(RankError, match=r"rank 1 \(device c\)"):
        launch(plan, build, steps=1, warmup=0, timeout=180, engine="pipelining", graph=graph)


@pytest.mark.slow
def test_ranks_send_integer_slices():
    # DLRM's sparse ids cross ranks as a non-contiguous int64 slice
    build = functools.partial(zoo.build, "dlrm", tiny=True, batch=4)
    model, inputs = build()
    graph = placer.trace(model, inputs, granularity="module")
    order = graph.topological_order()
    plan = _plan(graph, lambda k: [["a", "b", "a", "b"][min(3, 4 * k // len(order))]])
    _, loss, grads = reference(model, inputs)
    result = launch(plan, build, steps=1, warmup=0, timeout=180, engine="pipelining",
                    graph=graph)
    _close(result["loss"], result["gradients"], loss, grads)


def test_targets_split_with_the_inputs(gpt):
    _, model, inputs, graph, _ = gpt
    targets = torch.randint(0, 128, inputs[0].shape, generator=torch.Generator().manual_seed(1))

    def loss_fn(out, tgt):
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), tgt.flatten())

    model.zero_grad(set_to_none=True)
    ref = loss_fn(model(*inputs), targets)
    ref.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    plan = _plan(graph, PLANS["data-parallel"][0])
    result = placer.run(model, plan, inputs, steps=1, warmup=0, graph=graph, loss_fn=loss_fn,
                        targets=targets, engine="pipelining")
    _close(result.loss, result.gradients, float(ref), grads)

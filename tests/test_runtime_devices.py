"""Which torch device runs a plan device, the backend of the ranks, and the
line said when a device named as a GPU runs on the CPU (no GPU needed)."""

from __future__ import annotations

import functools

import pytest
import torch

import placer
from placer import Plan, zoo
from placer.runtime import devices as devmod
from placer.runtime.devices import choose_backend, cpu_fallback_line, gpu_named, torch_device

from runtime_helpers import branchy_build, one_thread  # noqa: F401


def test_gpu_names_and_kinds():
    for name in ("a100-0", "A100_3", "h100", "gpu0", "cuda:1", "v100-2", "mi250x-1", "l40s-0",
                 "rtx3090"):
        assert gpu_named(name), name
    for name in ("a", "cpu", "host1", "alpha", "b0", "node-a100x", "tpu0", "worker-gpu"):
        assert not gpu_named(name), name
    cluster = placer.Cluster.from_rules(
        "c", [placer.Device("w0", 1e12, 1e10, kind="A100-80GB"),
              placer.Device("w1", 1e12, 1e10, kind="cpu")], default=(1e9, 1e-4))
    assert gpu_named("w0", cluster) and not gpu_named("w1", cluster)


def test_torch_device_and_backend_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_device("a100-0") == torch.device("cpu")
    assert torch_device("cpu") == torch.device("cpu")
    assert choose_backend(["cpu", "cpu"]) == "gloo"


def test_backend_choice_with_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(devmod, "nccl_available", lambda: True)
    # devices named as GPUs go to the host's GPUs in turn
    assert [torch_device(n, k) for k, n in enumerate(["a100-0", "a100-1", "a100-2"])] == \
        [torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda", 0)]
    assert torch_device("x") == torch.device("cpu")
    assert choose_backend([torch.device("cuda", 0), torch.device("cuda", 1)]) == "nccl"
    assert choose_backend([torch.device("cuda", 0), torch.device("cpu")]) == "gloo"
    monkeypatch.setattr(devmod, "nccl_available", lambda: False)
    assert choose_backend([torch.device("cuda", 0)]) == "gloo"
    from placer.runtime.dist import launch_backend
    monkeypatch.setattr(devmod, "nccl_available", lambda: True)
    import placer.runtime.ranks as ranksmod
    monkeypatch.setattr(ranksmod, "choose_backend", devmod.choose_backend)
    assert launch_backend(Plan({"x": ["a100-0"], "y": ["a100-1"]})) == "nccl"
    assert launch_backend(Plan({"x": ["a100-0"], "y": ["b"]})) == "gloo"


def test_cpu_fallback_line_names_the_devices():
    line = cpu_fallback_line(["a100-0", "a100-1"])
    assert "\n" not in line and "a100-0, a100-1" in line and "CPU" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU-named devices run on the GPU here")
def test_run_says_when_a_gpu_named_device_runs_on_the_cpu(capsys):
    model, inputs = branchy_build()
    graph = placer.trace(model, inputs)
    order = graph.topological_order()
    plan = Plan({op: ["a100-0" if i < len(order) // 2 else "cpu"] for i, op in enumerate(order)})
    plan.placement["linear"] = list(plan.placement["stem"])
    cluster = placer.Cluster.from_rules(
        "c", [placer.Device("a100-0", 3e14, 8e10, kind="A100-80GB"),
              placer.Device("cpu", 1e11, 1e10, kind="cpu")], default=(1e10, 1e-5))
    result = placer.run(model, plan, inputs, steps=1, graph=graph, cluster=cluster)
    err = capsys.readouterr().err.strip().splitlines()
    assert len([x for x in err if "named as a GPU" in x]) == 1 and "a100-0" in err[-1]
    report = result.report
    assert report.extra["cpu_fallback"] == ["a100-0"]
    assert report.predicted is None and report.error() is None
    assert report.prediction is not None       # made, but not compared
    assert report.to_dict()["prediction_compared"] is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU-named devices run on the GPU here")
def test_ranks_say_when_a_gpu_named_device_runs_on_the_cpu():
    from placer.runtime.dist import launch
    build = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=4)
    model, inputs = build()
    graph = placer.trace(model, inputs)
    order = graph.topological_order()
    plan = Plan({op: ["a100-0" if i < len(order) // 2 else "b"] for i, op in enumerate(order)})
    for members in graph.colocation_groups().values():
        for op in members[1:]:
            plan.placement[op] = list(plan.placement[members[0]])
    result = launch(plan, build, steps=1, warmup=0, timeout=120)
    assert result["backend"] == "gloo"
    assert result["cpu_fallback"] == ["a100-0"]
    assert result["report"]["cpu_fallback"] == ["a100-0"]
    assert result["report"]["predicted"] is None

"""``placer export``: what torch pipelining, accelerate and DeepSpeed consume."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import placer
from placer import Plan
from placer.cli import main
from placer.errors import PlanError
from placer.export import export, pipelining_snippet, stage_layout


@pytest.fixture(scope="module")
def gpt():
    model, inputs = placer.datasets.model("gpt-125m", batch=4, seq=8, tiny=True)
    return (model, inputs, placer.trace(model, inputs, granularity="module"),
            placer.trace(model, inputs, granularity="op"))


def _plan(graph, devices_of, microbatches=2, schedule="1f1b"):
    return Plan({op: list(devices_of(k)) for k, op in enumerate(graph.topological_order())},
                microbatches=microbatches, schedule=schedule)


#: module ops: idx wte arange wpe add blocks.0 blocks.1 ln_f lm_head
TWO = lambda k: ["a" if k < 6 else "b"]                                      # noqa: E731
LOOPED = lambda k: [["a", "b", "a", "b"][min(3, max(0, k - 4))]]              # noqa: E731


def test_pipeline_accepts_the_split_spec(gpt):
    from torch.distributed.pipelining import SplitPoint, pipeline
    model, inputs, graph, _ = gpt
    spec = export(graph, _plan(graph, LOOPED), "pipelining")
    assert spec["split_spec"] == {"blocks.0": "BEGINNING", "blocks.1": "BEGINNING",
                                  "ln_f": "BEGINNING"}
    assert spec["schedule_class"] == "ScheduleInterleaved1F1B"
    assert spec["stages_per_device"] == 2 and spec["pipelines"] == [["a", "b"]]
    assert [s["rank"] for s in spec["stages"]] == [0, 1, 0, 1]
    chunk = tuple(t[:2] for t in inputs)
    pipe = pipeline(model, mb_args=chunk,
                    split_spec={k: getattr(SplitPoint, v) for k, v in spec["split_spec"].items()})
    assert pipe.num_stages == spec["num_stages"] == 4
    # the stages hold the modules the plan put there
    names = [n for n, _ in pipe.get_stage_module(1).named_parameters()]
    assert names and all(n.startswith("blocks.0.") for n in names)
    assert all(n.startswith("blocks.1.") for n, _ in pipe.get_stage_module(2).named_parameters())


def test_schedule_classes_and_snippet(gpt):
    _, _, graph, _ = gpt
    two = export(graph, _plan(graph, TWO, schedule="gpipe"), "pipelining")
    assert two["split_spec"] == {"blocks.1": "BEGINNING"}
    assert two["schedule_class"] == "ScheduleGPipe" and two["num_stages"] == 2
    assert export(graph, _plan(graph, TWO), "pipelining")["schedule_class"] == "Schedule1F1B"
    dp = export(graph, _plan(graph, lambda k: ["a", "b"] if k < 6 else ["c", "d"]),
                "pipelining")
    assert dp["data_parallel"] == 2 and dp["pipelines"] == [["a", "c"], ["b", "d"]]
    code = pipelining_snippet(two)
    compile(code, "snippet.py", "exec")
    assert "ScheduleGPipe" in code and "'blocks.1': SplitPoint.BEGINNING" in code


def test_op_level_plan_on_module_boundaries_exports(gpt):
    _, _, _, ops = gpt
    order = ops.topological_order()
    cut = order.index("blocks.1.ln1")
    plan = _plan(ops, lambda k: ["a" if k < cut else "b"])
    assert export(ops, plan, "pipelining")["split_spec"] == {"blocks.1": "BEGINNING"}
    assert export(ops, plan, "device-map")["device_map"]["blocks.1"] == 1


def test_device_map_covers_every_parameter(gpt):
    model, _, graph, _ = gpt
    out = export(graph, _plan(graph, TWO), "device-map")
    dmap = out["device_map"]
    assert out["devices"] == {"0": "a", "1": "b"}
    for name, _ in model.named_parameters():
        owners = [k for k in dmap if name == k or name.startswith(k + ".")]
        assert len(owners) == 1, name
    assert dmap["blocks.0"] == 0 and dmap["blocks.1"] == 1 and dmap["wte"] == 0
    if importlib.util.find_spec("accelerate"):
        from accelerate.utils import check_device_map
        check_device_map(model, dmap)


def test_deepspeed_partition_sums_to_the_layer_count(gpt):
    _, _, graph, _ = gpt
    out = export(graph, _plan(graph, TWO), "deepspeed")
    layers, parts = out["layers"], out["parts"]
    assert layers == ["wte", "arange", "wpe", "add", "blocks.0", "blocks.1", "ln_f", "lm_head"]
    assert parts[0] == 0 and parts[-1] == len(layers) and parts == sorted(parts)
    assert sum(b - a for a, b in zip(parts, parts[1:])) == len(layers)
    assert layers[parts[1]] == "blocks.1"
    assert out["pipe_parallel_size"] == 2 and out["data_parallel_size"] == 1


@pytest.mark.parametrize("to,devices_of,granularity,words", [
    ("pipelining", lambda k: ["a"] if k < 6 else ["b", "c"], "module",
     "unequal data-parallel degrees"),
    ("pipelining", lambda k: ["a" if k < 12 else "b"], "op", "splits it"),
    ("device-map", lambda k: ["a" if k < 12 else "b"], "op", "split across"),
    ("device-map", LOOPED, "module", "non-contiguous"),
    ("device-map", lambda k: ["a", "b"], "module", "data-parallel"),
    ("deepspeed", LOOPED, "module", "one stage on each device"),
    ("deepspeed", lambda k: ["a" if k < 12 else "b"], "op", "two stages"),
    ("pipelining", lambda k: [["a", "b", "c", "a"][min(3, max(0, k - 4))]], "module",
     "round-robin"),
])
def test_shapes_a_tool_cannot_express_are_one_line(gpt, to, devices_of, granularity, words):
    _, _, graph, ops = gpt
    g = graph if granularity == "module" else ops
    with pytest.raises(PlanError, match=words) as info:
        export(g, _plan(g, devices_of), to)
    assert "\n" not in str(info.value)


def test_interleaved_microbatches_must_fill_rounds():
    with pytest.raises(PlanError, match="microbatches"):
        stage_layout([("a",), ("b",), ("a",), ("b",)], 5, "1f1b")
    assert stage_layout([("a",), ("b",)], 5, "1f1b").schedule_class == "Schedule1F1B"


def test_cli_export_writes_json_and_refuses_in_one_line(tmp_path, capsys, gpt):
    _, _, graph, _ = gpt
    plan = tmp_path / "plan.json"
    _plan(graph, TWO).save(plan)
    out, snippet = tmp_path / "split.json", tmp_path / "pipe.py"
    assert main(["export", str(plan), "--to", "pipelining", "--graph", "gpt-125m", "--tiny",
                 "--batch", "4", "--seq", "8", "-o", str(out), "--snippet", str(snippet)]) == 0
    assert json.loads(out.read_text())["split_spec"] == {"blocks.1": "BEGINNING"}
    compile(snippet.read_text(), str(snippet), "exec")
    assert "wrote" in capsys.readouterr().out
    _plan(graph, LOOPED).save(plan)
    assert main(["export", str(plan), "--to", "deepspeed", "--graph", "gpt-125m",
                 "--tiny", "--batch", "4", "--seq", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("placer export: error:") and len(err.splitlines()) == 1
    assert str(plan) in err


@pytest.mark.slow
def test_snippet_runs_under_torchrun_with_the_unplaced_loss(tmp_path, gpt):
    import os
    import subprocess
    import sys
    model, inputs, graph, _ = gpt
    plan = tmp_path / "plan.json"
    _plan(graph, LOOPED).save(plan)
    snippet = tmp_path / "pipe.py"
    assert main(["export", str(plan), "--to", "pipelining", "--graph", "gpt-125m", "--tiny",
                 "--batch", "4", "--seq", "8", "--snippet", str(snippet)]) == 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                          "2", str(snippet)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr[-2000:]
    loss = float(out.stdout.split("loss ")[1].split()[0])
    assert abs(loss - float(model(*inputs).float().mean())) < 1e-5


def test_a_graph_without_modules_has_no_device_map():
    graph = placer.Graph("bare", [placer.Op("x", flops=1e9), placer.Op("y", flops=1e9)],
                         [placer.Edge("x", "y", 4)])
    with pytest.raises(PlanError, match="names no modules"):
        export(graph, Plan({"x": ["a"], "y": ["b"]}), "device-map")

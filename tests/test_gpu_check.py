"""The GPU check's parts that need no GPU, run on CPU devices so the script
cannot rot between GPU runs."""

import importlib.util
import sys
from pathlib import Path

import torch

from placer import zoo
from runtime_helpers import reference

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipelining_part_runs_both_engines_against_the_unplaced_model():
    gpu_check = _script()
    torch.manual_seed(0)
    model, inputs = zoo.build("gpt-125m", tiny=True, batch=4)
    rows = []
    assert gpu_check.pipelining(rows, model, inputs, reference(model, inputs),
                                devices=("a", "b"))
    assert [r["check"].split()[0] for r in rows] == ["builtin", "pipelining"] * 2
    assert all(r["ok"] and r["max_err"] < gpu_check.TOLERANCE for r in rows)
    assert all(r["measured"] > 0 for r in rows)
    assert "pipelining / built-in" in rows[1]["note"]
    assert "pipelining engine gpipe" in gpu_check.table(rows)

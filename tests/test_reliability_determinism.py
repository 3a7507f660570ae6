"""Determinism across processes: the same command gives the same plan file
whatever the interpreter's hash seed."""

import json
import os
import subprocess
import sys

import pytest


def _plan(tmp_path, hashseed: str, method: str, extra: list[str]) -> dict:
    out = tmp_path / f"{method}-{hashseed}.json"
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    proc = subprocess.run([sys.executable, "-m", "placer", "plan", "layered-n80-w6-s1",
                           "-c", "hetero-lab", "-m", method, "-o", str(out), "--no-plots",
                           "--json", "--seed", "7", *extra], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("method, extra", [
    ("heft", []),
    ("pipeline_dp", []),
    ("evolution", ["--evaluations", "800", "--time-budget", "1000"]),
])
def test_same_plan_under_different_hash_seeds(tmp_path, method, extra):
    a = _plan(tmp_path, "1", method, extra)
    b = _plan(tmp_path, "12345", method, extra)
    assert a["placement"] == b["placement"]
    assert (a["microbatches"], a["schedule"]) == (b["microbatches"], b["schedule"])
    assert a["predicted"]["step_time"] == b["predicted"]["step_time"]
    assert (a["graph"], a["cluster"]) == (b["graph"], b["cluster"])

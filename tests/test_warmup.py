"""First runs say what they do: the numba kernels compile once with a line
on stderr (or ahead, by ``placer warmup``), and slow stages say so."""

import json
import os
import subprocess
import sys
import time

import pytest

from placer.cli import main


def test_warmup_caches_every_kernel(capsys):
    from placer.warmup import kernels, uncompiled
    assert main(["warmup", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["uncompiled_after"] == [] and uncompiled() == []
    assert data["kernels"] == len(kernels()) >= 15   # simulator, analytical, policy decoder


def test_cold_kernels_get_one_line_then_compile(monkeypatch, capsys):
    import placer.warmup as warmup
    compiled = []
    monkeypatch.setattr(warmup, "uncompiled", lambda policy=True: ["placer.cost.x.k"] * 3)
    monkeypatch.setattr(warmup, "warmup", lambda policy=True: compiled.append(policy))
    assert warmup.warm_if_cold("placer plan") is True
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compiling 3 numba kernels" in err and "placer warmup" in err
    assert compiled == [False]
    monkeypatch.setattr(warmup, "uncompiled", lambda policy=True: [])
    assert warmup.warm_if_cold("placer plan") is False
    assert capsys.readouterr().err == ""


def test_slow_stage_prints_one_line_only_when_slow(capsys):
    from placer._cli import slow_stage
    with slow_stage("placer plan", "quick", after=5.0):
        pass
    with slow_stage("placer plan", "searching with heft", after=0.05):
        time.sleep(0.3)
    with slow_stage("placer plan", "quiet", after=0.01, quiet=True):
        time.sleep(0.1)
    assert capsys.readouterr().err == "placer plan: searching with heft ...\n"


@pytest.mark.slow
def test_first_plan_in_a_fresh_cache_compiles_with_a_line_then_loads(tmp_path, tiny_graph):
    """A fresh numba cache (NUMBA_CACHE_DIR): the first plan says it compiles,
    the second loads what the first cached and says nothing."""
    graph = tmp_path / "g.json"
    tiny_graph.save(graph)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), MPLBACKEND="Agg")
    errs = []
    for k in range(2):
        out = subprocess.run([sys.executable, "-m", "placer", "plan", str(graph), "-c",
                              "two-sites", "-m", "heft", "--no-plots", "-o",
                              str(tmp_path / "p.json")], capture_output=True, text=True,
                             env=env, timeout=600)
        assert out.returncode == 0, out.stderr
        errs.append(out.stderr)
    assert "compiling" in errs[0] and "numba kernels" in errs[0], errs[0]
    assert "compiling" not in errs[1], errs[1]
    assert list((tmp_path / "numba").rglob("*.nbi"))

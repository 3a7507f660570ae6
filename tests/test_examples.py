"""Every script in examples/ runs to the end and prints what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, timeout: float = 120) -> str:
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_example_is_tested():
    tested = {"geo_gpt.py", "train_and_use_policy.py", "run_locally.py",
              "cluster_from_nvidia_smi.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


@pytest.mark.slow
def test_geo_gpt(tmp_path):
    out = run_example("geo_gpt.py", "--budget", "2", "--out", str(tmp_path))
    for strategy in ("even_pipeline", "pipeline_dp", "dtfm", "evolution"):
        assert f"dtfm-worldwide  {strategy}" in out
    assert "best on dtfm-worldwide:" in out and "best on dtfm-regional:" in out
    assert len(list(tmp_path.glob("*.gantt.png"))) == 2


@pytest.mark.slow
def test_train_and_use_policy(tmp_path):
    out = run_example("train_and_use_policy.py", "--iterations", "3",
                      "--out", str(tmp_path / "policy"))
    assert "trained 3 iterations" in out
    assert "rl, this checkpoint" in out and "rl, shipped policy" in out
    assert (tmp_path / "policy.pt").is_file()


def test_run_locally():
    out = run_example("run_locally.py")
    assert out.count("outputs match: True") == 3, out


def test_cluster_from_nvidia_smi(tmp_path):
    import placer
    path = tmp_path / "box.yaml"
    out = run_example("cluster_from_nvidia_smi.py", "-o", str(path))
    assert "cluster box: 4 devices in 1 site(s)" in out
    cluster = placer.Cluster.load(path)
    assert cluster.link("cuda:0", "cuda:1")[0] == 3e11      # NV12
    assert cluster.link("cuda:0", "cuda:2")[0] < 2e10       # SYS: PCIe across sockets

"""Faults in distributed runs: a rank that dies or hangs is named, quickly,
and no child process is left behind."""

import functools
import os
import time

import pytest

pytest.importorskip("torch.distributed")

import placer  # noqa: E402
from placer import zoo  # noqa: E402
from placer.errors import PlacerError  # noqa: E402
from placer.runtime.dist import RankError, diagnose, launch  # noqa: E402

from runtime_helpers import random_plan  # noqa: E402


def _children() -> set[int]:
    """Child processes of this process (zombies too), from /proc, except
    multiprocessing's resource tracker (one per parent, not a rank)."""
    me = os.getpid()
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"resource_tracker" in f.read():
                        continue
            except OSError:
                pass
            out.add(int(pid))
    return out


@pytest.fixture(scope="module")
def job():
    build = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=2)
    model, inputs = build()
    graph = placer.trace(model, inputs)
    plan = random_plan(graph, ["a", "b"], seed=1, dp=0.0, segments=2)
    assert len(plan.devices_used()) == 2
    return plan, build


@pytest.mark.parametrize("kind, words, fault_timeout", [
    ("exit", "rank 1 (device {dev}) in stage 'step 2' died (exit code 3)", 30.0),
    ("hang", "rank 1 (device {dev}) in stage 'step 2' made no progress", 3.0),
])
def test_dead_or_hung_rank_is_named(monkeypatch, job, kind, words, fault_timeout):
    plan, build = job
    before = _children()
    monkeypatch.setenv("PLACER_TEST_FAULT", f"1:2:{kind}")
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(plan, build, steps=3, warmup=0, timeout=120, fault_timeout=fault_timeout)
    took = time.monotonic() - start
    message = str(info.value)
    assert isinstance(info.value, PlacerError) and "\n" not in message
    dev = placer.runtime.dist.rank_devices(plan)[1]
    assert words.format(dev=dev) in message, message
    assert took < 60, took
    assert _children() <= before, "child processes left behind"


def test_diagnose_prefers_the_rank_waited_for():
    statuses = [{"stage": "step 1: waiting for rank 2", "state": "running", "time": 1},
                {"stage": "step 1: waiting for rank 2", "state": "running", "time": 1},
                {"stage": "step 1", "state": "running", "time": 1}]
    line = diagnose(statuses, [None] * 3, ["a", "b", "c"], 7.0)
    assert line.startswith("rank 2 (device c) in stage 'step 1' made no progress for 7 s")
    # a failure: the first rank to fail is named, not the peers that lost it
    statuses = [{"stage": "step 0", "state": "failed", "time": 5, "error": "peer gone"},
                {"stage": "step 0", "state": "failed", "time": 3, "error": "ValueError: x"}]
    line = diagnose(statuses, [1, 1], ["a", "b"], None)
    assert line == "rank 1 (device b) in stage 'step 0' failed: ValueError: x"


# --- under torchrun (`python -m placer.runtime.dist` per rank) ---------------------------

def _torchrun(tmp_path, plan, fault: str, fault_timeout: float = 3.0):
    import shutil
    import subprocess
    import sys
    plan.save(tmp_path / "plan.json")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "PLACER_TEST_FAULT": fault, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2",
                           "-m", "placer.runtime.dist", str(tmp_path / "plan.json"),
                           "--model", "gpt-125m", "--tiny", "--batch", "2", "--steps", "4",
                           "--warmup", "0", "--timeout", "120",
                           "--fault-timeout", str(fault_timeout)],
                          capture_output=True, text=True, env=env, timeout=240)
    return proc, time.monotonic() - start


def _placer_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("placer.runtime.dist: error:")]


def test_hung_rank_under_torchrun_stops_with_its_stage(tmp_path, job):
    plan, _ = job
    a, b = placer.runtime.dist.rank_devices(plan)
    proc, took = _torchrun(tmp_path, plan, "1:2:hang")
    lines = _placer_lines(proc.stderr)
    assert proc.returncode != 0 and lines, proc.stderr[-3000:]
    hung = f"rank 1 (device {b}) in stage 'step 2' made no progress for 3 s"
    said = [line.split("error: ", 1)[1] for line in lines]
    # whichever watchdog fires first speaks: the hung rank names itself, or its
    # peer names the stage it waits in (times out there, or sees the link
    # close when the hung rank exits); torchrun may stop the other first
    assert all(text.startswith((hung, f"rank 0 (device {a}) in stage 'step 2"))
               for text in said), lines
    assert took < 90, took       # start-up plus 3 s, not the 120 s process-group timeout


def test_dead_rank_under_torchrun_is_reported(tmp_path, job):
    plan, _ = job
    a, _ = placer.runtime.dist.rank_devices(plan)
    proc, took = _torchrun(tmp_path, plan, "1:2:exit")
    assert proc.returncode != 0
    # torchrun names the dead rank; its peer, when it sees the loss before
    # torchrun stops it, names its own stage
    assert "rank      : 1 (local_rank: 1)" in proc.stderr and "exitcode  : 3" in proc.stderr
    for line in _placer_lines(proc.stderr):
        assert line.split("error: ", 1)[1].startswith(
            f"rank 0 (device {a}) in stage 'step 2: waiting for the step barrier' failed: "
            "RuntimeError:"), line
    assert took < 90, took

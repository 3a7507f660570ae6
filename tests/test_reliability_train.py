"""Interrupted training: Ctrl-C, SIGTERM or a time budget saves the last
completed iteration, and ``--resume`` ends bit-identical to an uninterrupted run.

The command-line runs start together (they are mostly import time) in one
module fixture; each test checks one of them.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gnn import train as gt
from gnn.checkpoint import load_tensors, save_tensors
from placer.errors import FormatError

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--iterations", "9", "--problems", "2", "--samples", "4", "--max-units", "16",
        "--hidden", "16", "--layers", "1", "--graphs", "layered-n80-w6-s1",
        "random_dag-n100-w4-s0", "--clusters", "a100x8", "two-sites",
        "--checkpoint-every", "3", "--val-every", "0", "--no-progress", "--threads", "1",
        "--seed", "5"]
KILL_AT = 5     # completed iterations when the signal comes, half way through the next

DRIVER = textwrap.dedent("""
    import os, signal, sys
    import gnn.train as gt
    loss, calls = gt.Trainer._loss, []
    def signalling_loss(self, *args, **kwargs):
        if self.iteration == int(os.environ["KILL_AT"]):
            calls.append(1)
            if len(calls) == 2:       # the update's second problem: half way through
                os.kill(os.getpid(), getattr(signal, os.environ["KILL_SIG"]))
        return loss(self, *args, **kwargs)
    gt.Trainer._loss = signalling_loss
    from placer.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def _start(args, **kw):
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _finish(proc, timeout=180):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _train(stem, *extra):
    return [str(ROOT / "train_policy.py"), *TINY, "-o", str(stem), *extra]


def _wait_for(path: Path, proc, timeout=120.0):
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path} never written"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs side by side: uninterrupted; SIGTERM half way through an
    update (``placer train``), resumed with a time budget that stops it
    again, resumed to the end; SIGINT from outside after the first
    checkpoint, resumed. Maps name -> (stem, [(rc, stdout, stderr) per leg])."""
    d = tmp_path_factory.mktemp("train")
    (d / "driver.py").write_text(DRIVER)
    stems = {name: d / name for name in ("full", "sigterm", "sigint")}
    env = {**os.environ, "KILL_AT": str(KILL_AT), "KILL_SIG": "SIGTERM", "PYTHONPATH": str(ROOT)}
    legs = {
        "full": [_train(stems["full"])],
        "sigterm": [[str(d / "driver.py"), "train", *TINY, "-o", str(stems["sigterm"])],
                    _train(stems["sigterm"], "--resume", "--time-budget", "0.001"),
                    _train(stems["sigterm"], "--resume")],
        "sigint": [_train(stems["sigint"]), _train(stems["sigint"], "--resume")],
    }
    results = {name: [] for name in legs}
    procs = {name: _start(args[0], env=env) for name, args in legs.items()}
    _wait_for(stems["sigint"].with_suffix(".json"), procs["sigint"])
    procs["sigint"].send_signal(signal.SIGINT)
    while procs:
        for name, proc in list(procs.items()):
            if proc.poll() is None:
                continue
            results[name].append(_finish(proc))
            del procs[name]
            if len(results[name]) < len(legs[name]):
                procs[name] = _start(legs[name][len(results[name])])
        time.sleep(0.05)
    return {name: (stems[name], results[name]) for name in legs}


def _csv_without_timing(stem) -> list[dict]:
    with open(f"{stem}.csv", newline="") as handle:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(handle)]


def _assert_same(a, b, where=""):
    """Nested dicts/lists of tensors and numbers are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _assert_same_run(stem, reference):
    _assert_same(load_tensors(f"{stem}.pt"), load_tensors(f"{reference}.pt"), "policy")
    _assert_same(load_tensors(f"{stem}.train.pt"), load_tensors(f"{reference}.train.pt"),
                 "train")
    rows = _csv_without_timing(stem)
    assert rows == _csv_without_timing(reference)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 10))
    a, b = json.loads(Path(f"{stem}.json").read_text()), json.loads(Path(f"{reference}.json").read_text())
    for key in ("train_seconds", "weights"):      # timing; the file's own name
        a.pop(key), b.pop(key)
    assert a == b and a["iteration"] == 9


def _no_temporaries(stem):
    """Atomic writes leave no temporary files, even when interrupted."""
    assert not list(Path(stem).parent.glob(".*.tmp"))


def test_uninterrupted_reference(runs):
    stem, [(rc, _, err)] = runs["full"]
    assert rc == 0, err
    assert json.loads(Path(f"{stem}.json").read_text())["iteration"] == 9


def test_sigterm_half_way_saves_last_update_and_resume_matches(runs):
    stem, [(rc, _, err), budget, last] = runs["sigterm"]
    assert rc == 143, err
    line = err.strip().splitlines()[-1]
    assert line == (f"placer train: interrupted by SIGTERM after iteration {KILL_AT}; "
                    f"checkpoint {stem}.pt (continue with --resume)")
    assert budget[0] == 0 and budget[1].startswith(f"trained {KILL_AT + 1} iterations"), budget
    assert last[0] == 0, last[2]
    _no_temporaries(stem)
    _assert_same_run(stem, runs["full"][0])


def test_sigint_saves_and_resume_matches(runs):
    stem, [(rc, _, err), resumed] = runs["sigint"]
    assert rc == 130, err
    assert "interrupted by SIGINT after iteration" in err and "--resume" in err
    assert resumed[0] == 0, resumed[2]
    _no_temporaries(stem)
    _assert_same_run(stem, runs["full"][0])


# --- in-process: what is saved, and when ----------------------------------------------

CFG = dict(seed=1, iterations=4, problems=1, samples=2, max_units=8, val_every=0,
           graphs=["layered-n80-w6-s1"], clusters=["a100x8"], checkpoint_every=100,
           policy={"hidden": 8, "layers": 1})


def test_signal_during_checkpoint_is_held_until_it_is_whole(tmp_path, monkeypatch):
    write_logs = gt._write_logs

    def signalled_write_logs(stem, history):   # SIGTERM between the .pt files and the CSV
        os.kill(os.getpid(), signal.SIGTERM)
        write_logs(stem, history)
    monkeypatch.setattr(gt, "_write_logs", signalled_write_logs)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(gt.TrainingInterrupted) as info:
        gt.train(gt.TrainConfig(**CFG), tmp_path / "p", progress=False,
                 time_budget=0.0)     # the budget saves after iteration 1
    assert (info.value.signum, info.value.iteration) == (signal.SIGTERM, 1)
    assert info.value.checkpoint == str(tmp_path / "p")
    assert len(_csv_without_timing(tmp_path / "p")) == 1
    assert json.loads((tmp_path / "p.json").read_text())["iteration"] == 1
    assert signal.getsignal(signal.SIGTERM) is handler      # handlers restored


def test_second_signal_during_checkpoint_stops_at_once(tmp_path, monkeypatch):
    def twice(stem, history):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(gt, "_write_logs", twice)
    with pytest.raises(KeyboardInterrupt, match="SIGINT again: stopped without saving") as info:
        gt.train(gt.TrainConfig(**CFG), tmp_path / "p", progress=False, time_budget=0.0)
    assert not isinstance(info.value, gt.TrainingInterrupted)


def test_resume_refuses_files_of_different_iterations(tmp_path):
    trainer = gt.Trainer(gt.TrainConfig(**CFG))
    trainer.step()
    trainer.save(tmp_path / "p")
    assert gt.Trainer.resume(tmp_path / "p").iteration == 1
    data = json.loads((tmp_path / "p.json").read_text())
    (tmp_path / "p.json").write_text(json.dumps({**data, "iteration": 2}))
    with pytest.raises(FormatError, match="training state is at iteration 1 but the policy at 2"):
        gt.Trainer.resume(tmp_path / "p")


def test_resume_refuses_a_training_state_that_is_not_one(tmp_path):
    trainer = gt.Trainer(gt.TrainConfig(**CFG))
    trainer.save(tmp_path / "p")
    save_tensors(tmp_path / "p.train.pt", {"iteration": torch.tensor(0)})
    with pytest.raises(FormatError, match="not a training state"):
        gt.Trainer.resume(tmp_path / "p")


def test_global_rng_states_round_trip_through_a_safe_checkpoint(tmp_path):
    import random
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    np.random.standard_normal()          # leaves a cached gaussian in numpy's state
    save_tensors(tmp_path / "rng.pt", gt.rng_states())
    expected = (torch.rand(3), np.random.standard_normal(3), random.random())
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    gt.set_rng_states(load_tensors(tmp_path / "rng.pt"))   # weights_only=True
    got = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(expected[0], got[0])
    assert np.array_equal(expected[1], got[1]) and expected[2] == got[2]


def test_training_does_not_draw_from_the_global_generators():
    """Updates use generators seeded by (seed, iteration), so resuming does not
    depend on the global states (saved anyway for code that does)."""
    import random
    trainer = gt.Trainer(gt.TrainConfig(**CFG))
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    trainer.step()
    trainer.step()
    assert torch.equal(before[0], torch.get_rng_state())
    assert np.array_equal(before[1], np.random.get_state()[1])
    assert before[2] == random.getstate()

"""`placer launch`'s ranks die with their launcher, whatever signal ends it
and whenever (while the ranks start, or once they are in the process group),
and their rendezvous store listens on loopback only."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc; the parent-death signal is Linux's")

LAUNCHER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path

    def build():
        # a rank "building its model": note its pid, then take long
        Path(os.environ["PIDS"], str(os.getpid())).write_text("")
        time.sleep(120)

    if __name__ == "__main__":
        from placer import Plan
        from placer.runtime.dist import launch
        plan = Plan({"a": ["d0"], "b": ["d1"]})
        print("launching", flush=True)
        try:
            launch(plan, build, timeout=120, fault_timeout=120, pin=False, threads=1)
        except KeyboardInterrupt as exc:     # as the CLI reports it
            print(f"interrupted: {exc}", file=sys.stderr)
            sys.exit(130)
""")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), PIDS=str(pids))
    launcher = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    assert launcher.stdout.readline().strip() == b"launching"
    return launcher, pids


def _ranks_now(launcher, want: int = 2, seconds: float = 60) -> list[int]:
    """The launcher's rank processes (spawned children; not its resource tracker)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ranks = []
        for pid in _children(launcher.pid):
            try:
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes() and _alive(pid):
                    ranks.append(pid)
            except OSError:
                pass
        if len(ranks) >= want:
            return ranks
        time.sleep(0.02)
    raise AssertionError("the ranks did not start")


def _all_gone(pids: list[int], seconds: float = 30) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _listening(pid: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp) of the TCP sockets ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:
                out.append(parts[1].split(":")[0])
    return out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_ranks_die_with_a_launcher_stopped_while_they_start(tmp_path, signum):
    launcher, pids = _start(tmp_path)
    ranks = _ranks_now(launcher)       # just spawned: still importing torch
    others = _children(launcher.pid)
    launcher.send_signal(signum)
    launcher.wait(timeout=60)
    assert not list(pids.iterdir()), "the ranks were past start-up: test nothing"
    assert _all_gone(ranks + others) == [], "ranks outlived their launcher"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_ranks_die_with_a_launcher_stopped_mid_run(tmp_path, signum):
    launcher, pids = _start(tmp_path)
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 2:        # both ranks joined and are building
        assert time.monotonic() < deadline and launcher.poll() is None, \
            launcher.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    ranks = [int(p.name) for p in pids.iterdir()]
    assert sorted(ranks) == sorted(_ranks_now(launcher))
    others = _children(launcher.pid)
    # the rendezvous store (rank 0's) listens on loopback only
    listening = [a for r in ranks for a in _listening(r)]
    assert listening and all(a in ("0100007F", "00000000000000000000000001000000")
                             for a in listening), listening
    launcher.send_signal(signum)
    rc = launcher.wait(timeout=60)
    assert _all_gone(ranks + others) == [], "ranks outlived their launcher"
    if signum != signal.SIGKILL:
        err = launcher.stderr.read().decode()
        assert rc == 130 and "Traceback" not in err, (rc, err[-2000:])

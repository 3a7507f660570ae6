"""A throw-away Ray cluster on this machine: a head and more nodes started
with ``ray start`` (a few CPUs each) in a temp dir of their own, for tests
and benchmarks of the Ray backend (see :mod:`placer.executors`).

Stopping it stops exactly the processes of that cluster (found by its temp
dir, and their children): ``ray stop`` would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

#: ``ray`` as a command (the ``ray`` script may not be on PATH)
RAY_CLI = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]


def _procs() -> dict[int, tuple[int, bytes]]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
            ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(name)] = (ppid, cmd)
    return out


def processes_of(marker: str) -> set[int]:
    """Live processes whose command line holds ``marker`` (a cluster's temp
    dir), and their descendants; never this process."""
    procs = _procs()
    pids = {p for p, (_, cmd) in procs.items() if marker.encode() in cmd}
    while True:
        more = {p for p, (pp, _) in procs.items() if pp in pids} - pids
        if not more:
            break
        pids |= more
    return {p for p in pids - {os.getpid()} if _state(p) not in ("Z", "X")}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def stop(marker: str, grace: float = 5.0) -> set[int]:
    """Stop the processes of the cluster whose temp dir is ``marker``
    (SIGTERM, then SIGKILL after ``grace`` seconds); returns those left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = processes_of(marker)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and processes_of(marker):
            time.sleep(0.1)
    return processes_of(marker)


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_cluster(nodes: int = 2, cpus: int = 1, env: dict | None = None,
                  timeout: float = 120.0, head_args: tuple = ()) -> Iterator[str]:
    """A head plus ``nodes - 1`` nodes of ``cpus`` CPUs each; yields the
    head's address (for ``RAY_ADDRESS`` or ``ray.init(address=...)``) and
    stops them all on leaving, whatever happened (a driver connected from
    this process is disconnected first). ``head_args``: more options of
    the head's ``ray start`` (``--ray-client-server-port P``)."""
    tmp = tempfile.mkdtemp(prefix="rayc", dir="/tmp")     # socket paths must be short
    port = free_port()
    common = ["start", "--num-cpus", str(int(cpus)), "--disable-usage-stats"]
    env = dict(os.environ if env is None else env)
    # the nodes' workers import placer as this process does
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", "")] + sys.path if p)
    # one auth mode for head, nodes and the driver (this process), which
    # reads it when ray is imported: a head starts in token mode where a
    # driver defaults to none. A throw-away cluster of one user's processes
    # for the few seconds of a test does without.
    env.setdefault("RAY_AUTH_MODE", "disabled")
    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = env["RAY_AUTH_MODE"]
    def ray_start(*args: str) -> None:
        done = subprocess.run(RAY_CLI + common + list(args), env=env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"ray start {' '.join(args)} failed: {' | '.join(tail)}")

    try:
        ray_start("--head", "--port", str(port), "--temp-dir", tmp,
                  "--include-dashboard", "false", *head_args)
        for _ in range(nodes - 1):
            ray_start("--address", f"127.0.0.1:{port}")
        yield f"127.0.0.1:{port}"
    finally:
        try:
            ray = sys.modules.get("ray")
            if ray is not None and ray.is_initialized():
                ray.shutdown()
        finally:
            left = stop(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            if before is None:
                os.environ.pop("RAY_AUTH_MODE", None)
            else:
                os.environ["RAY_AUTH_MODE"] = before
            if left:
                raise RuntimeError(f"Ray processes left running: {sorted(left)}")


__all__ = ["RAY_CLI", "free_port", "local_cluster", "processes_of", "stop"]

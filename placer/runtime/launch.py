"""Starting the ranks of one host and watching them: :func:`launch` spawns one
process per plan device, joins them into a process group
(:func:`init_group`), runs :func:`placer.runtime.rank_loop.run_rank` in
each and returns rank 0's result; its watchdog (:func:`diagnose`) stops
every rank with one line naming the faulty rank, its device and stage
when a rank dies, fails or hangs, and the ranks die with the launcher
whatever stops it (see :mod:`placer.runtime.dist`)."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Callable

import torch
import torch.distributed as dist

from ..errors import PlanError
from .rank_loop import run_rank
from .ranks import RankError, auto_pin, launch_backend, pin_cores, rank_devices
from .status import STATUS, past_start_up, read_status


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the store binds it a moment later)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LauncherStopped(KeyboardInterrupt):
    """The launcher got SIGTERM or SIGHUP (SIGINT stays KeyboardInterrupt);
    its ranks were stopped. A KeyboardInterrupt, so the CLI reports it as
    an interruption."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _StopOnSignals:
    """Within the block, SIGTERM/SIGHUP (and SIGINT) raise in the launcher so
    its ``finally`` stops the ranks (their default would end it at once and
    leave them running). Until :meth:`arm` a signal is only remembered: the
    ranks being started must all exist before it is raised. Only in the
    main thread (the only one that can handle signals)."""

    SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")

    def __init__(self):
        self.armed = False
        self.pending: int | None = None
        self.previous: dict = {}

    def _handle(self, signum, frame):
        if self.armed:
            raise KeyboardInterrupt if signum == signal.SIGINT else LauncherStopped(signum)
        self.pending = signum if self.pending is None else self.pending

    def arm(self) -> None:
        """From now on raise at once; raise a signal that came before."""
        self.armed = True
        if self.pending is not None:
            self._handle(self.pending, None)

    def __enter__(self) -> "_StopOnSignals":
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name, None)
                if number is not None:
                    self.previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


def init_group(backend: str, timeout: float, store_host: str | None = None) -> None:
    """Join the process group. ``store_host``: rank 0 serves the rendezvous
    store on that address only (``launch`` gives loopback, so nothing off
    this machine can reach it; torch's own store listens on every
    interface); None: the environment's (torchrun's) rendezvous."""
    delta = datetime.timedelta(seconds=timeout)
    # NCCL for CUDA tensors, gloo for the CPU tensors of the small
    # collectives (step times, results) that NCCL cannot carry
    backend = "cpu:gloo,cuda:nccl" if backend == "nccl" else backend
    if store_host is None:
        dist.init_process_group(backend=backend, timeout=delta)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = int(os.environ["MASTER_PORT"])
    listen = None
    if rank == 0:
        family = socket.AF_INET6 if ":" in store_host else socket.AF_INET
        listen = socket.socket(family, socket.SOCK_STREAM)
        listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listen.bind((store_host, port))
        listen.listen(max(128, world))
    store = dist.TCPStore(store_host, port, world, rank == 0, timeout=delta,
                          master_listen_fd=None if listen is None else listen.fileno())
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world,
                            timeout=delta)


def _die_with(parent: int | None) -> None:
    """End this process when ``parent`` (its launcher) ends, however it
    ends (SIGKILL included): Linux's parent-death signal, armed first, then
    a check that the launcher did not already die while this rank started."""
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)      # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)


def _child(index: int, world: int, port: int, backend: str, timeout: float, build,
           plan_dict: dict, kwargs: dict, out_path: str, cluster_dict,
           threads: int | None = None, pin: bool = False, parent: int | None = None,
           host: str = "127.0.0.1") -> None:
    _die_with(parent)
    os.environ.update({"MASTER_ADDR": host, "MASTER_PORT": str(port),
                       "RANK": str(index), "WORLD_SIZE": str(world),
                       "LOCAL_RANK": str(index)})
    STATUS.reopen(_status_path(out_path, index), index)
    STATUS.set("start-up")
    cores = pin_cores(index, world) if pin else None
    torch.set_num_threads(threads or (len(cores) if cores else
                                      max(1, (os.cpu_count() or 1) // world)))
    from ..cluster import Cluster
    from ..plan import Plan
    STATUS.set("joining the process group")
    init_group(backend, timeout, store_host=host)
    try:
        STATUS.set("building the model")
        model, inputs = build()
        cluster = Cluster.from_dict(cluster_dict) if cluster_dict else None
        STATUS.set("preparing the plan")
        result = run_rank(model, Plan.from_dict(plan_dict), inputs, cluster=cluster, **kwargs)
        if result is not None:
            STATUS.set("saving results")
            torch.save(result, out_path + ".tmp")
            os.replace(out_path + ".tmp", out_path)
        # every rank past its last message before any tears its group down:
        # a teardown race is the likely cause of one rank aborting in gloo
        # ("terminate called without an active exception") at exit in CI
        STATUS.set("finishing")
        dist.barrier()
        STATUS.set("done", "done")
    except BaseException as exc:
        text = str(exc).strip().splitlines()
        STATUS.set(STATUS.stage, "failed", f"{type(exc).__name__}: {text[-1] if text else ''}")
        dist.destroy_process_group()
        raise
    # every rank is past the barrier and its result is saved: leave without
    # running the process group's and its threads' destructors, where a
    # gloo teardown race aborts a rank now and then ("terminate called
    # without an active exception", seen once in a full test run)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _status_path(out_path: str, rank: int) -> str:
    return os.path.join(os.path.dirname(out_path), f"rank{rank}.status")


def diagnose(statuses: list, codes: list, devs: list[str], hung_for: float | None) -> str:
    """One line naming the faulty rank, its device and stage."""
    def where(r: int) -> str:
        st = statuses[r] or {}
        return f"rank {r} (device {devs[r]}) in stage {st.get('stage', 'start-up')!r}"
    if hung_for is None:
        # a rank that died without reporting a failure is the cause; else the
        # first to fail (the others fail after it, losing their peer)
        dead = [r for r, c in enumerate(codes)
                if c not in (None, 0) and (statuses[r] or {}).get("state") != "failed"]
        if dead:
            r = dead[0]
            code = codes[r]
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            return f"{where(r)} died ({how})"
        failed = [r for r, s in enumerate(statuses) if s and s.get("state") == "failed"]
        if failed:
            r = min(failed, key=lambda i: statuses[i]["time"])
            return f"{where(r)} failed: {statuses[r].get('error', '')}"
        r = next(r for r, c in enumerate(codes) if c not in (None, 0))
        return f"{where(r)} exited with code {codes[r]}"
    # a hang: the rank others wait for, else a rank that is not waiting
    waited: dict[int, int] = defaultdict(int)
    for s in statuses:
        stage = (s or {}).get("stage", "")
        if ": waiting for rank " in stage:
            waited[int(stage.rsplit(" ", 1)[1])] += 1
    busy = [r for r, s in enumerate(statuses)
            if (s or {}).get("state") == "running" and "waiting for" not in s.get("stage", "")]
    for r in sorted(waited, key=lambda r: (-waited[r], r)):
        if r in busy or (statuses[r] or {}).get("state") != "done":
            return f"{where(r)} made no progress for {hung_for:.0f} s (hung)"
    r = busy[0] if busy else 0
    return f"{where(r)} made no progress for {hung_for:.0f} s (hung)"


def _stop(processes) -> None:
    """Kill and reap every child still alive."""
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(10)


def launch(plan, build: Callable[[], tuple], *, nproc: int | None = None,
           backend: str | None = None,
           timeout: float = 300.0, cluster=None, fault_timeout: float = 60.0,
           threads: int | None = None, pin: bool | None = None, host: str = "127.0.0.1",
           **kwargs) -> dict:
    """Start one local process per plan device (torch.multiprocessing, spawn),
    run :func:`run_rank` in each and return rank 0's result.

    The ranks die with the launcher whatever stops it (SIGTERM, SIGHUP,
    SIGINT: it stops them, then raises :class:`LauncherStopped` or
    KeyboardInterrupt; SIGKILL: Linux's parent-death signal), also while they
    start. Their rendezvous store listens on ``host`` only (loopback unless
    another address is given).

    ``build()`` returns ``(model, example_inputs)`` and must be picklable
    (a module-level function or ``functools.partial``) and deterministic,
    since every rank builds the model itself. ``kwargs`` go to
    :func:`run_rank`. Processes that have not finished after ``timeout``
    seconds are killed and :class:`PlanError` is raised. A rank that dies or
    fails, or a run in which no rank progresses for ``fault_timeout``
    seconds, stops every process and raises :class:`RankError` naming the
    rank, its device and its stage (see the module doc). ``threads``: torch
    threads per rank (default: this machine's cores shared out evenly).
    ``pin``: each rank runs on its own cores (:func:`pin_cores`; calibration
    included, so op times are measured as the steps run); None pins when
    there are at least as many usable cores as ranks. ``backend``: None
    picks NCCL when every rank's device is CUDA, else gloo
    (:func:`launch_backend`)."""
    import torch.multiprocessing as mp
    backend = backend or launch_backend(plan, cluster, kwargs.get("device"))
    devs = rank_devices(plan, cluster)
    if kwargs.get("engine") == "pipelining":
        from .pipelining import rank_order
        devs = rank_order(plan) or devs    # that engine's ranks, for the error lines
    nproc = nproc or len(devs)
    if nproc != len(devs):
        raise PlanError(f"--nproc {nproc} but the plan uses {len(devs)} devices",
                        fix=f"use --nproc {len(devs)}")
    with tempfile.TemporaryDirectory(prefix="placer-launch-") as tmp, \
            _StopOnSignals() as signals:
        out = os.path.join(tmp, "result.pt")
        ctx = mp.start_processes(
            _child, args=(nproc, free_port(host), backend, timeout, build, plan.to_dict(),
                          kwargs, out, cluster.to_dict() if cluster is not None else None,
                          threads, auto_pin(pin, nproc), os.getpid(), host),
            nprocs=nproc, join=False, start_method="spawn")
        try:
            signals.arm()       # a signal during start-up is raised here, once all exist
            _watch(ctx.processes, [_status_path(out, r) for r in range(nproc)], devs,
                   timeout, fault_timeout)
        finally:
            _stop(ctx.processes)
        if not os.path.exists(out):
            raise RankError("rank 0 finished without writing its results",
                            fix="check the plan and the model")
        return torch.load(out, weights_only=True)


def _watch(processes, status_paths: list[str], devs: list[str], timeout: float,
           fault_timeout: float) -> None:
    """Poll the children until all exit 0; raise on a death, failure or hang."""
    deadline = time.monotonic() + timeout + 30
    last_change, seen = time.monotonic(), None
    poll = min(0.05, fault_timeout / 10)
    while True:
        codes = [p.exitcode for p in processes]
        if all(c == 0 for c in codes):
            return
        if any(c not in (None, 0) for c in codes):
            time.sleep(0.2)   # let the other ranks record their state
            codes = [p.exitcode for p in processes]
            statuses = [read_status(p) for p in status_paths]
            raise RankError(diagnose(statuses, codes, devs, None),
                            fix="see the rank's log above; rerun once the device is back, "
                            "or replan without it (placer replan --without)")
        statuses = [read_status(p) for p in status_paths]
        now = time.monotonic()
        marks = [(s or {}).get("count") for s in statuses]
        # the clock starts once every rank is past start-up (building the model
        # takes as long as it takes on a busy host; --timeout bounds it)
        if marks != seen or None in marks or not all(past_start_up(s) for s in statuses):
            seen, last_change = marks, now
        elif now - last_change > fault_timeout:
            _stop(processes)
            raise RankError(diagnose(statuses, [p.exitcode for p in processes], devs,
                                      now - last_change),
                            fix="check that device and its links; raise --fault-timeout "
                            "if one op legitimately takes longer")
        if now > deadline:
            raise PlanError(f"ranks did not finish within {timeout:.0f} s",
                            fix="raise the timeout or check the plan")
        time.sleep(poll)

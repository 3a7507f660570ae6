"""Where parallel search work runs: a local process pool (the default) or a
Ray cluster, chosen by name.

A *backend* is one of:

- ``"local"``: a process pool on this machine (``concurrent.futures``);
- ``"ray"``: Ray; joins the cluster named by ``RAY_ADDRESS`` when it is
  set, else starts a Ray instance on this machine;
- ``"auto"``: joins a running Ray cluster (``ray start`` on this machine,
  or ``RAY_ADDRESS``);
- ``"ray://HOST:PORT"``: a remote cluster through Ray Client.

Ray is an optional extra (``pip install 'placer[ray]'``); every node of the
cluster needs the same placer installed. Work sent to an executor is a
module-level function and its arguments; the callers join the results in
the order they submitted them, so results never depend on the backend or
the number of workers (only how fast they come).

>>> check_backend("local")
'local'
>>> check_backend("spark")
Traceback (most recent call last):
...
placer.errors.StrategyError: backend: unknown backend 'spark' (fix: use local, ray, auto or ray://HOST:PORT)
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Iterable

from .errors import StrategyError

#: the extra that installs Ray
RAY_EXTRA = "pip install 'placer[ray]'"

#: the default backend
LOCAL = "local"


def check_backend(spec: str, field: str = "backend") -> str:
    """``spec`` if it names a backend (see the module doc) that can run
    here, else a :class:`~placer.errors.StrategyError` naming ``field``
    (Ray not installed: the extra to install)."""
    if isinstance(spec, str) and (spec in (LOCAL, "ray", "auto")
                                  or (spec.startswith("ray://") and len(spec) > 6)):
        if spec != LOCAL:
            require_ray(field)
        return spec
    raise StrategyError(f"unknown backend {spec!r}", field=field,
                        fix="use local, ray, auto or ray://HOST:PORT")


def is_local(spec: str) -> bool:
    """Whether ``spec`` is the local process pool."""
    return spec == LOCAL


def require_ray(field: str = "backend"):
    """The ``ray`` module, or one clear error naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise StrategyError("the ray backend needs Ray, which is not installed",
                            field=field, fix=RAY_EXTRA) from None
    return ray


def connect(spec: str, field: str = "backend"):
    """The ``ray`` module, connected to the cluster ``spec`` names (once per
    process; a connection made before, by placer or the caller, is kept)."""
    check_backend(spec, field)
    ray = require_ray(field)
    if ray.is_initialized():
        return ray
    address = None if spec == "ray" else spec
    try:
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False,
                     configure_logging=True)
        except ConnectionError as exc:
            # Ray Client's server starts one server per client and may fail
            # the first start under load ("Initialization failure from
            # server"); a second try then succeeds. Unreachable hosts fail as before.
            if "Initialization failure" not in str(exc):
                raise
            time.sleep(2.0)
            ray.init(address=address, logging_level="WARNING", log_to_driver=False,
                     configure_logging=True)
    except ImportError as exc:      # ray:// without Ray Client's grpcio
        raise StrategyError(f"{spec} needs Ray Client ({exc})", field=field,
                            fix=RAY_EXTRA + " (it brings Ray Client's grpcio)") from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or os.environ.get("RAY_ADDRESS") or "this machine"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StrategyError(f"cannot reach a Ray cluster at {where}: {first}", field=field,
                            fix="start one (ray start --head) or check the address") from None
    return ray


def cluster_cpus(spec: str) -> int:
    """CPUs of the Ray cluster ``spec`` names (1 for the local pool)."""
    if is_local(spec):
        return 1
    return max(1, int(connect(spec).cluster_resources().get("CPU", 1)))


def worker_identity() -> dict:
    """Where the calling process runs: ``host``, ``pid`` and, on a Ray
    worker, the Ray ``node`` id (submit it to an executor to see where its
    workers are)."""
    import socket
    out = {"host": socket.gethostname(), "pid": os.getpid(), "node": None}
    try:
        import ray
        if ray.is_initialized():
            out["node"] = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return out


class Executor:
    """Runs ``fn(*args)`` on ``workers`` processes, each set up once by
    ``initializer(*initargs)`` (for state the calls share: the problem, a
    cost model). :meth:`submit` returns a future with ``result(timeout)``
    (raising :class:`concurrent.futures.TimeoutError`) and ``cancel()``."""

    backend = LOCAL

    def __init__(self, workers: int, initializer: Callable | None = None,
                 initargs: tuple = (), fork: bool = True):
        import multiprocessing
        self.workers = max(1, int(workers))
        ctx = multiprocessing.get_context(_start_method(fork))
        self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx,
                                         initializer=initializer, initargs=initargs)

    def submit(self, fn: Callable, *args):
        """Start ``fn(*args)`` on a worker; returns its future."""
        return self._pool.submit(fn, *args)

    def shutdown(self) -> None:
        """Stop the workers (calls not started are cancelled)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _start_method(fork: bool = True) -> str:
    """fork, the quickest, unless not wanted (a process that ran torch's
    thread pool: the children can hang), this process holds a Ray
    connection (its threads do not survive a fork either) or is on Windows."""
    if os.name == "nt":
        return "spawn"
    if not fork:
        return "forkserver"
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return "forkserver"
    return "fork"


class _RayFuture:
    """A Ray object reference seen as a ``concurrent.futures`` future."""

    def __init__(self, ray, ref):
        self._ray, self._ref = ray, ref

    def result(self, timeout: float | None = None):
        try:
            return self._ray.get(self._ref, timeout=timeout)
        except self._ray.exceptions.GetTimeoutError:
            raise FutureTimeout() from None

    def cancel(self) -> bool:
        try:
            self._ray.cancel(self._ref)
        except Exception:       # already finished, or the worker is gone
            return False
        return True


class _Worker:
    """A Ray actor holding the state its ``initializer`` set up."""

    def __init__(self, initializer, initargs):
        if initializer is not None:
            initializer(*initargs)

    def call(self, fn, args):
        return fn(*args)


_ACTOR: dict = {}


class RayExecutor(Executor):
    """:class:`Executor` on ``workers`` Ray actors of one CPU each (at most
    the cluster's CPUs: an actor beyond them would wait for ever), spread
    over the cluster's nodes; calls go to them in turn."""

    def __init__(self, backend: str, workers: int, initializer: Callable | None = None,
                 initargs: tuple = ()):
        ray = connect(backend)
        self.backend = backend
        self.workers = max(1, min(int(workers), cluster_cpus(backend)))
        self._ray = ray
        cls = _ACTOR.get("worker")
        if cls is None:
            cls = _ACTOR["worker"] = ray.remote(num_cpus=1)(_Worker)
        shared = ray.put(tuple(initargs))      # sent once, not once per actor
        self._actors = [cls.options(scheduling_strategy="SPREAD").remote(initializer, shared)
                        for _ in range(self.workers)]
        self._turn = 0

    def submit(self, fn: Callable, *args):
        actor = self._actors[self._turn % len(self._actors)]
        self._turn += 1
        return _RayFuture(self._ray, actor.call.remote(fn, args))

    def shutdown(self) -> None:
        for actor in self._actors:
            try:
                self._ray.kill(actor)
            except Exception:   # the cluster went away: nothing left to stop
                pass
        self._actors = []


def make_executor(backend: str, workers: int, initializer: Callable | None = None,
                  initargs: tuple = (), fork: bool = True) -> Executor:
    """An :class:`Executor` of ``workers`` processes on ``backend``
    (``fork=False``: a local pool's workers are not forked from this
    process, which may have run torch)."""
    check_backend(backend)
    if is_local(backend):
        return Executor(workers, initializer, initargs, fork)
    return RayExecutor(backend, workers, initializer, initargs)


def run_all(fn: Callable[[Any], Any], items: Iterable, *, backend: str = LOCAL,
            workers: int = 0) -> list:
    """``[fn(x) for x in items]``, in order: in this process on the local
    backend with ``workers`` <= 1, else on an executor of ``workers``
    processes (0: the Ray cluster's CPUs)."""
    items = list(items)
    if is_local(check_backend(backend)) and workers <= 1:
        return [fn(x) for x in items]
    n = workers or cluster_cpus(backend)
    n = max(1, min(n, len(items) or 1))
    with make_executor(backend, n) as ex:
        futures = [ex.submit(fn, x) for x in items]
        return [f.result() for f in futures]


__all__ = ["Executor", "LOCAL", "RAY_EXTRA", "RayExecutor", "check_backend", "cluster_cpus",
           "connect", "is_local", "make_executor", "require_ray", "run_all", "worker_identity"]

"""One problem's scoring on worker processes (a local pool or Ray, see
:mod:`placer.executors`): the workers hold the problem, sent once, and
score plans (``estimate``) or assignment rows (``step_times``) by a cost
model named in each call. Results are joined in the order submitted, so
they never depend on the backend or the number of workers.

The coarsened search (:mod:`placer.search.multilevel`) refines and ranks
its starts on one; evolution ranks its finalists on one
(:func:`placer.search.common.rank`).
"""

from __future__ import annotations

import os
import time as _time
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..executors import LOCAL, check_backend, cluster_cpus, is_local, make_executor

if TYPE_CHECKING:
    from ..cost import Problem, Report
    from ..executors import Executor
    from ..plan import Plan

# per-process state of the workers (set by hold)
_HELD: dict = {}


def hold(problem: "Problem") -> None:
    """A worker's initializer: keep ``problem`` for the calls to come."""
    _HELD.clear()
    _HELD["problem"] = problem
    _HELD["models"] = {}
    # one BLAS thread per worker: the workers are the parallelism
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def held_problem() -> "Problem":
    """The problem this worker holds."""
    return _HELD["problem"]


def held_model(name: str):
    """The cost model ``name`` of this worker (built once)."""
    from ..cost import get_cost_model
    models = _HELD["models"]
    if name not in models:
        models[name] = get_cost_model(name)
    return models[name]


def estimate_held(name: str, plan: "Plan") -> "tuple[Report, float]":
    """Model ``name``'s report of ``plan`` for the held problem, and the
    seconds it took; without its timeline (a report pickles its events:
    gigabytes for a simulation of 100,000 ops)."""
    start = _time.perf_counter()
    report = held_model(name).estimate(_HELD["problem"], plan)
    took = _time.perf_counter() - start
    report.timeline = None
    return report, took


def step_times_held(name: str, rows: np.ndarray, groups: list, microbatches,
                    schedule: str) -> np.ndarray:
    """Model ``name``'s step times of assignment ``rows`` for the held problem."""
    return np.asarray(held_model(name).step_times(_HELD["problem"], rows, groups=groups,
                                                  microbatches=microbatches,
                                                  schedule=schedule), dtype=float)


def pool_workers(workers, backend: str = LOCAL) -> int:
    """Workers a strategy's ``workers`` option asks of a :class:`ProblemPool`:
    a number as given; ``"auto"``: the Ray cluster's CPUs on a Ray backend,
    else 0 (this process)."""
    if workers == "auto":
        return 0 if is_local(backend) else cluster_cpus(backend)
    return int(workers or 0)


class ProblemPool:
    """``workers`` processes on ``backend`` holding ``problem``, started on
    first use; :attr:`active` tells whether work goes to them at all (more
    than one local process, or any Ray worker; else callers score in this
    process)."""

    def __init__(self, problem: "Problem", backend: str = LOCAL, workers: int = 0):
        self.problem = problem
        self.backend = check_backend(backend)
        self.workers = max(0, int(workers))
        self._executor: "Executor | None" = None

    @property
    def active(self) -> bool:
        return self.workers > 1 or (self.workers == 1 and not is_local(self.backend))

    def submit(self, fn: Callable, *args):
        """Start ``fn(*args)`` on a worker (``fn`` may use :func:`held_model`
        and the held problem); returns its future."""
        if self._executor is None:
            self._executor = make_executor(self.backend, max(1, self.workers), hold,
                                           (self.problem,))
        return self._executor.submit(fn, *args)

    def estimate_many(self, name: str, plans: list["Plan"]) -> "list[tuple[Report, float]]":
        """``(report, seconds)`` of each of ``plans`` by model ``name``, in order."""
        return [f.result() for f in self.estimate_futures(name, plans)]

    def estimate_futures(self, name: str, plans: list["Plan"]) -> list:
        """Futures of :meth:`estimate_many`'s answers, one per plan."""
        return [self.submit(estimate_held, name, plan) for plan in plans]

    def step_times(self, name: str, rows: np.ndarray, *, groups=(), microbatches=1,
                   schedule: str = "1f1b") -> np.ndarray:
        """Model ``name``'s step times of ``rows``: contiguous chunks, one
        per worker, joined in order."""
        rows = np.atleast_2d(rows)
        parts = np.array_split(np.arange(len(rows)), min(len(rows), max(1, self.workers)))
        futures = [self.submit(step_times_held, name, rows[p], list(groups), microbatches,
                               schedule) for p in parts if len(p)]
        return np.concatenate([np.asarray(f.result(), dtype=float) for f in futures])

    def close(self) -> None:
        """Stop the workers, if started."""
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def __enter__(self) -> "ProblemPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["ProblemPool", "estimate_held", "held_model", "held_problem", "hold", "pool_workers",
           "step_times_held"]

"""Scoring genomes in batches: the cost model's ``step_times`` fast path,
a cache, the search budget and optional worker processes.

Results never depend on the number of workers: a batch is split into
contiguous chunks, each scored by the same pure function, and joined in
order.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Sequence

import numpy as np

from placer.cost import get_cost_model

from .genome import OpGenome, Space

if TYPE_CHECKING:
    from placer.cost import CostModel, Problem

# per-process state of pool workers (set by _init_worker)
_WORKER: dict = {}


def _init_worker(problem, model_name: str) -> None:
    _WORKER["problem"] = problem
    _WORKER["model"] = get_cost_model(model_name)
    # one BLAS thread per worker: the workers are the parallelism
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _score_chunk(A: np.ndarray, groups: list, microbatches: int, schedule: str) -> np.ndarray:
    return _WORKER["model"].step_times(_WORKER["problem"], A, groups=groups,
                                       microbatches=microbatches, schedule=schedule)


def compact(A: np.ndarray, space: Space) -> tuple[np.ndarray, list[tuple]]:
    """Renumber the data-parallel group ids used in ``A`` to ``D, D+1, ...``
    so the cost model sees only the groups this batch uses."""
    D = space.n_devices
    used = np.unique(A[A >= D])
    if not len(used):
        return A, []
    lookup = np.arange(int(A.max()) + 1, dtype=np.int64)
    lookup[used] = D + np.arange(len(used))
    return lookup[A], [space.table.devices(g) for g in used.tolist()]


class Evaluator:
    """Objective values of genomes under ``model`` (a metered cost model,
    so every fresh score is charged to the search budget).

    ``workers`` > 1 scores large batches on that many processes (``model``
    must then be a registered cost model; the pool starts on first use and
    is closed by :meth:`close`). Scores are cached by genome identity.
    ``seconds_per_estimate``, when known, is how long one of ``model``'s
    estimates took (it decides ``workers="auto"``).
    """

    def __init__(self, space: Space, model: "CostModel", budget=None, *, workers: int = 0,
                 chunk: int = 64):
        self.space = space
        self.problem: "Problem" = space.problem
        self.model = model
        self.budget = budget
        self.workers = int(workers or 0)
        self.seconds_per_estimate: float | None = None
        self.chunk = max(1, int(chunk))
        self.cache: dict[bytes, float] = {}
        self.fresh = 0
        self._pool: ProcessPoolExecutor | None = None
        self._pool_model = ""

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def allow(self, n: int) -> int:
        return n if self.budget is None else self.budget.allow(n)

    def __call__(self, genomes: Sequence[OpGenome]) -> np.ndarray:
        """Scores of ``genomes`` (``inf`` for those the budget did not allow)."""
        out = np.full(len(genomes), np.inf)
        todo: dict[bytes, list[int]] = {}
        keys = []
        for i, g in enumerate(genomes):
            k = g.key()
            keys.append(k)
            hit = self.cache.get(k)
            if hit is not None:
                out[i] = hit
            else:
                todo.setdefault(k, []).append(i)
        if not todo:
            return out
        fresh = list(todo)
        fresh = fresh[:self.allow(len(fresh))]
        by_setting: dict[tuple, list[bytes]] = {}
        for k in fresh:
            g = genomes[todo[k][0]]
            by_setting.setdefault((int(g.microbatches), g.schedule), []).append(k)
        jobs = [(np.stack([genomes[todo[k][0]].assign for k in ks]), m, schedule)
                for (m, schedule), ks in by_setting.items()]
        for ks, scores in zip(by_setting.values(), self._score_all(jobs)):
            for k, s in zip(ks, scores.tolist()):
                s = float(s) if np.isfinite(s) else float("inf")
                self.cache[k] = s
                for i in todo[k]:
                    out[i] = s
        self.fresh += len(fresh)
        return out

    def _score_all(self, jobs: list[tuple[np.ndarray, int, str]]) -> list[np.ndarray]:
        """Scores of each ``(assignments, microbatches, schedule)`` job: on
        the worker processes when there are enough rows to share out (all
        jobs' chunks in flight at once), else in this process."""
        total = sum(len(A) for A, _, _ in jobs)
        if self.workers > 1 and total >= 2 * self.workers and getattr(self.model, "name", ""):
            if self.budget is not None:
                self.budget.charge(total)
            pool = self._get_pool()
            # about two chunks per worker over the whole call, so a slow
            # chunk does not leave the other workers idle for long
            size = max(1, min(self.chunk, -(-total // (2 * self.workers))))
            pending = []
            for A, m, schedule in jobs:
                A, groups = compact(A, self.space)
                pending.append([pool.submit(_score_chunk, A[i:i + size], groups, m, schedule)
                                for i in range(0, len(A), size)])
            return [np.concatenate([f.result() for f in fs]) for fs in pending]
        out = []
        for A, m, schedule in jobs:
            A, groups = compact(A, self.space)
            out.append(np.asarray(self.model.step_times(self.problem, A, groups=groups,
                                                        microbatches=m, schedule=schedule),
                                  dtype=float))
        return out

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is not None and self._pool_model != self.model.name:
            self.close()            # the model changed (screening switched to exact)
        if self._pool is None:
            self._pool_model = self.model.name
            import multiprocessing
            ctx = multiprocessing.get_context("spawn" if os.name == "nt" else "fork")
            self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx,
                                             initializer=_init_worker,
                                             initargs=(self.problem, self.model.name))
        return self._pool


def auto_workers(model, budget, seconds: float | None = None) -> int:
    """Worker processes for ``workers="auto"``: the usable CPUs (at most
    :data:`MAX_AUTO_WORKERS`) when every estimate is costly (the event
    simulator, taking at least :data:`POOL_MIN_SECONDS` per estimate where
    ``seconds`` says how long one took) and a time budget bounds the search,
    so more estimates in that time mean a better plan; else 0 (score in this
    process: the analytical model is vectorised, a cheap simulation costs
    less than sending it to a worker, and an evaluation budget gives the
    same plan however fast it is spent)."""
    if getattr(model, "name", None) != "simulator" or budget is None or budget.time is None:
        return 0
    if seconds is not None and seconds < POOL_MIN_SECONDS:
        return 0
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:          # not on Linux
        cpus = os.cpu_count() or 1
    n = min(cpus, MAX_AUTO_WORKERS)
    return n if n > 1 else 0


#: the most processes ``workers="auto"`` starts
MAX_AUTO_WORKERS = 4

#: the shortest estimate worth a worker process: below it, pickling the
#: plans and gathering the results cost more than the worker saves (a
#: 31-op model on 10 devices: 88 generations in 18 s in one process, 46 with
#: a pool of 2 on a 2-core machine)
POOL_MIN_SECONDS = 0.01

__all__ = ["Evaluator", "auto_workers", "compact"]

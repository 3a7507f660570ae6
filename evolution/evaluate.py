"""Scoring genomes in batches: the cost model's ``step_times`` fast path,
a cache, the search budget and optional worker processes (a local pool
or a Ray cluster, see :mod:`placer.executors`).

Results never depend on the backend or the number of workers: a batch is
split into contiguous chunks, each scored by the same pure function, and
joined in order.

Under a time budget a batch is scored in slices of about
:data:`SLICE_SHARE` of the budget's time each and stops at the deadline
(the rows left get ``inf``, as rows the budget does not allow), so one
batch of slow estimates cannot overrun the search by more than a slice; a
model given a ``fallback`` (see :meth:`Evaluator.use`) is swapped for it
when its measured speed would leave the search too few estimates.
"""

from __future__ import annotations

import os
import time as _time
from concurrent.futures import TimeoutError
from typing import TYPE_CHECKING, Sequence

import numpy as np

from placer.executors import LOCAL, Executor, check_backend, cluster_cpus, is_local, \
    make_executor
from placer.search.parallel import hold, step_times_held

from .genome import OpGenome, Space

if TYPE_CHECKING:
    from placer.cost import CostModel, Problem

def compact(A: np.ndarray, space: Space) -> tuple[np.ndarray, list[tuple]]:
    """Renumber the data-parallel group ids used in ``A`` to ``D, D+1, ...``
    so the cost model sees only the groups this batch uses."""
    return space.table.compact(A)


class Evaluator:
    """Objective values of genomes under ``model`` (a metered cost model,
    so every fresh score is charged to the search budget).

    ``workers`` > 1 scores large batches on that many processes (``model``
    must then be a registered cost model; the pool starts on first use and
    is closed by :meth:`close`); with a Ray ``backend`` (see
    :mod:`placer.executors`) on that many Ray workers, one included. Scores are cached by genome identity.
    ``seconds_per_estimate``, when known, is how long one of ``model``'s
    estimates took (it decides ``workers="auto"``); the estimates scored
    since :meth:`use` refine it (:meth:`mean_seconds`).

    Under a ``budget`` with a time limit a call scores its rows in slices
    and stops once the time is spent (at least the first slice is scored;
    the rows left are ``inf`` and not cached). ``switches`` counts the times
    the model was swapped for its ``fallback`` (:meth:`use`): a caller that
    keeps scores across calls re-scores them when it changes.
    """

    def __init__(self, space: Space, model: "CostModel", budget=None, *, workers: int = 0,
                 chunk: int = 64, backend: str = LOCAL):
        self.space = space
        self.problem: "Problem" = space.problem
        self.model = model
        self.budget = budget
        self.workers = int(workers or 0)
        self.backend = check_backend(backend)
        self.seconds_per_estimate: float | None = None
        self.chunk = max(1, int(chunk))
        self.cache: dict[bytes, float] = {}
        self.fresh = 0
        self.switches = 0
        self.fallback: "CostModel | None" = None
        self._spent = 0.0       # wall seconds of the current model's fresh estimates
        self._count = 0         # and how many
        self._give_way = False  # the call under way found the model too slow
        self._pool: Executor | None = None

    def use(self, model: "CostModel", *, seconds: float | None = None,
            fallback: "CostModel | None" = None) -> None:
        """Score with ``model`` from now on (the cache is cleared);
        ``seconds``: how long one of its estimates took, if measured.

        With a ``fallback`` model (under a time budget), a call whose
        estimates, at the speed measured in it once they took
        :data:`SWITCH_MIN_SHARE` of the budget, would need more than the
        time left and more than :data:`BATCH_MAX_SHARE` of the budget to
        finish its rows swaps the model for the fallback (scored in this
        process): that call is scored again by the fallback, and
        ``switches`` goes up. A search whose plans turn out far slower to
        estimate than those it timed to choose the model so keeps its
        generations; one slow batch at the end of a search does not count."""
        self.model = model
        self.cache.clear()
        self.seconds_per_estimate = seconds
        self.fallback = fallback
        self._spent, self._count = 0.0, 0

    def mean_seconds(self) -> float | None:
        """Wall seconds per fresh estimate of the current model so far (with
        workers: per estimate of the pool as a whole), or
        ``seconds_per_estimate`` before any was timed."""
        if self._count and self._spent > 0:
            return self._spent / self._count
        return self.seconds_per_estimate

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self._pool is not None:
            self._pool.shutdown()
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
        for i, g in enumerate(genomes):
            k = g.key()
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
        self._give_way = False
        results = self._score_all(jobs)
        if self._give_way:
            self._switch()
            return self.rescore(genomes)
        for ks, scores in zip(by_setting.values(), results):
            for k, s in zip(ks, scores.tolist()):
                if s != s:              # NaN: not scored (the time ran out)
                    continue
                s = float(s) if np.isfinite(s) else float("inf")
                self.cache[k] = s
                self.fresh += 1
                for i in todo[k]:
                    out[i] = s
        return out

    def rescore(self, genomes: Sequence[OpGenome]) -> np.ndarray:
        """Scores of ``genomes`` whatever the time left (each still charged):
        after a switch to the fallback, which is cheap, the scores a caller
        kept from the model it replaced are taken again by it."""
        budget, self.budget = self.budget, None
        try:
            return self(genomes)
        finally:
            self.budget = budget

    # --- time ---------------------------------------------------------------------
    def _timed(self) -> bool:
        return self.budget is not None and self.budget.time is not None

    def _out_of_time(self) -> bool:
        return self._timed() and self.budget.out_of_time()

    def _rows_per_slice(self, per_worker: int = 1) -> int | None:
        """Rows one slice may hold so it takes about :data:`SLICE_SHARE` of
        the time budget (1 while the model's speed is unknown, and always
        for a model that scores row by row anyway: the cost of its plans
        can differ a thousandfold); None without a time budget (the whole
        batch at once)."""
        if not self._timed():
            return None
        mean = self.mean_seconds()
        if mean is None or mean <= 0 or not getattr(self.model, "batched", False):
            return 1
        return max(1, int(SLICE_SHARE * self.budget.time / (mean * per_worker)))

    def _timing(self, seconds: float, rows: int) -> None:
        self._spent += seconds
        self._count += rows

    def _too_slow(self, seconds: float, done: int, left: int) -> bool:
        """Whether the model should give way to its fallback (see :meth:`use`)
        in a call that scored ``done`` rows in ``seconds`` and has ``left``
        to go; sets ``_give_way``."""
        if self.fallback is None or not self._timed() or not done or not left \
                or seconds < SWITCH_MIN_SHARE * self.budget.time:
            return False
        need = left * seconds / done
        self._give_way = need > max(self.budget.remaining_time,
                                    BATCH_MAX_SHARE * self.budget.time)
        return self._give_way

    def _switch(self) -> None:
        """Swap the model for its fallback (scored in this process)."""
        self.close()
        self.workers = 0
        self.use(self.fallback)
        self.switches += 1

    # --- scoring ------------------------------------------------------------------
    def _score_all(self, jobs: list[tuple[np.ndarray, int, str]]) -> list[np.ndarray]:
        """Scores of each ``(assignments, microbatches, schedule)`` job (NaN
        for rows left unscored when the time ran out or the model proved too
        slow): on the worker processes when there are enough rows to share
        out (all jobs' chunks in flight at once), else in this process."""
        total = sum(len(A) for A, _, _ in jobs)
        if self._remote() and total >= 2 * self.workers and getattr(self.model, "name", ""):
            return self._score_pool(jobs, total)
        out = [np.full(len(A), np.nan) for A, _, _ in jobs]
        start, done = _time.perf_counter(), 0
        for (A, m, schedule), res in zip(jobs, out):
            i = 0
            while i < len(A):
                size = self._rows_per_slice() or len(A)
                rows, groups = compact(A[i:i + size], self.space)
                tick = _time.perf_counter()
                values = np.asarray(self.model.step_times(self.problem, rows, groups=groups,
                                                          microbatches=m, schedule=schedule),
                                    dtype=float)
                self._timing(_time.perf_counter() - tick, len(rows))
                res[i:i + len(rows)] = np.where(np.isnan(values), np.inf, values)
                i += len(rows)
                done += len(rows)
                if self._out_of_time() or self._too_slow(_time.perf_counter() - start, done,
                                                         total - done):
                    return out
        return out

    def _score_pool(self, jobs: list[tuple[np.ndarray, int, str]], total: int
                    ) -> list[np.ndarray]:
        """:meth:`_score_all` on the worker processes; under a time budget
        the chunks are slices and those not started at the deadline are
        cancelled (a running one finishes)."""
        pool = self._get_pool()
        # about two chunks per worker over the whole call, so a slow
        # chunk does not leave the other workers idle for long
        size = max(1, min(self.chunk, -(-total // (2 * self.workers))))
        size = min(size, self._rows_per_slice(self.workers) or size)
        pending = []
        for j, (A, m, schedule) in enumerate(jobs):
            A, groups = compact(A, self.space)
            pending += [(j, i, pool.submit(step_times_held, self.model.name, A[i:i + size],
                                           groups, m, schedule))
                        for i in range(0, len(A), size)]
        out = [np.full(len(A), np.nan) for A, _, _ in jobs]
        start, done = _time.perf_counter(), 0
        for n, (j, i, future) in enumerate(pending):
            wait = None if n == 0 or not self._timed() else self.budget.remaining_time
            try:
                values = np.asarray(future.result(timeout=wait), dtype=float)
            except TimeoutError:
                break
            out[j][i:i + len(values)] = np.where(np.isnan(values), np.inf, values)
            done += len(values)
            if self._out_of_time() or self._too_slow(_time.perf_counter() - start, done,
                                                     total - done):
                break
        for _, _, future in pending:
            future.cancel()
        self._timing(_time.perf_counter() - start, done)
        if self.budget is not None:
            self.budget.charge(done)
        return out

    def _remote(self) -> bool:
        """Whether batches go to workers: more than one local process (one
        would only add the pickling), or any number of Ray workers."""
        return self.workers > 1 or (self.workers == 1 and not is_local(self.backend))

    def _get_pool(self) -> Executor:
        # the workers hold the problem; each builds a model the first time
        # a call names it (screening may switch to the exact model)
        if self._pool is None:
            self._pool = make_executor(self.backend, self.workers, hold, (self.problem,))
        return self._pool


def resolve_workers(workers: int | str, backend: str, model, budget,
                    seconds: float | None = None) -> int:
    """Workers for a strategy's ``workers`` option: a number as given;
    ``"auto"``: the Ray cluster's CPUs on a Ray ``backend`` (asked for, so
    used), else :func:`auto_workers`."""
    if workers != "auto":
        return int(workers)
    if not is_local(backend):
        return cluster_cpus(backend)
    return auto_workers(model, budget, seconds)


def check_workers(workers) -> int | str:
    """``workers`` if it is a whole number >= 0 or ``"auto"``, else a
    :class:`~placer.errors.StrategyError`."""
    if workers != "auto" and (isinstance(workers, bool) or not isinstance(workers, int)
                              or workers < 0):
        from placer.errors import StrategyError
        raise StrategyError(f"workers must be a whole number >= 0 or 'auto', got "
                            f"{workers!r}", field="workers")
    return workers


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

#: under a time budget, a batch is scored in slices of about this share of
#: the budget's time (so the deadline is overrun by at most one slice, or
#: one estimate where a single estimate takes longer)
SLICE_SHARE = 0.02

#: a model with a fallback is judged on its speed in a call only once that
#: call's estimates took this share of the time budget (a slow plan or two
#: among cheap ones do not decide)
SWITCH_MIN_SHARE = 0.05

#: ... and gives way when the rest of the call would need more than the time
#: left and more than this share of the budget (a search's last batch,
#: short of time, is not a sign of a slow model)
BATCH_MAX_SHARE = 0.25

__all__ = ["Evaluator", "auto_workers", "check_workers", "compact", "resolve_workers"]

"""The finalist ranker every search ends with, and its one time policy.

A search screens plans with a fast model (the analytical one), keeps a few
*finalists* (best first by that model) and lets the final model (the
event simulator) pick the winner. :class:`RankPolicy` is the policy, the
same for every search (evolution, dtfm, ``rl``/``hybrid`` and the
heuristics' :func:`placer.search.common.choose`):

1. **Budget split.** While it searches, a strategy hides ``reserve``
   evaluations and a ``share`` of its time and evaluations from itself
   (:meth:`RankPolicy.hold`, made of :class:`reserve` and
   :class:`hold_back`); the ranking (and a final polish, where a search
   has one) spends them after.
2. **How many finalists.** As many as the evaluations left allow,
   ``keep`` of them kept for after the ranking (the caller's report,
   ``finalize``'s scoring of the initial plans): :meth:`RankPolicy.room`;
   at least one. The first ``at_least`` are ranked whatever their size;
   beyond them, only while their simulations total at most ``max_tasks``
   op replicas x microbatches.
3. **Which model.** ``final`` by name (:func:`final_ranker`, metered on the
   search's budget), or the search's own model when None or the same:
   then the search's order stands and nothing is scored again.
4. **Time.** Finalists are scored one by one in the order given (likeliest
   first) while the time left exceeds the longest estimate so far; the
   simulator's only while :class:`SimulationClock` predicts one fits the
   time left (the first finalist then stands unscored if none does). A
   final ranking by a slow model (seconds per plan on a big graph and
   cluster) never overruns the search's budget. With a worker pool the
   plans are scored at once, those not done when the time runs out left
   out. A search's screening by its own model (the heuristics'
   :func:`~placer.search.common.choose`) must return a scored plan: it
   scores until the time is spent (``until="spent"``).
5. **Evaluations.** After the first, a finalist is scored only while the
   budget has more than ``keep`` evaluations left.

Finalists are :class:`placer.Plan` s or :class:`~placer.search.arrays.PlanArrays`
(scored through the model's array path, compacted to the sets they use).
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from .arrays import PlanArrays
from .base import Budget

if TYPE_CHECKING:
    from ..cost import Problem
    from ..plan import Plan


class SimulationClock:
    """Predicts how long the event simulator takes on a plan, so a search
    calls it only where it fits the time left: its work grows with the op
    replicas (an op on k devices counts k) times the microbatches. The rate
    is this process's slowest measured one (a conservative start before the
    first measurement)."""

    #: seconds per op replica and microbatch before any measurement
    rate = 4e-6
    _measured = False
    #: the most op replicas x microbatches a search simulates: the
    #: simulator holds 70-90 bytes per task (measured with tracemalloc on
    #: 20,000 ops x 64 devices, 1- to 8-way groups), so about 1 GB
    max_tasks = 1.2e7

    @classmethod
    def tasks(cls, problem: "Problem", plan: "Plan | PlanArrays") -> float:
        """Op replicas x microbatches of ``plan`` (a simulation's work)."""
        if isinstance(plan, PlanArrays):
            return float(plan.tasks(problem.n_devices))
        replicas = sum(len(devices) for devices in plan.placement.values())
        return float(replicas) * max(int(plan.microbatches), 1)

    @classmethod
    def predict(cls, problem: "Problem", plan: "Plan | PlanArrays") -> float:
        """Predicted seconds of one simulation of ``plan``."""
        return cls.tasks(problem, plan) * cls.rate

    @classmethod
    def estimate(cls, model, problem: "Problem", plan: "Plan", budget: "Budget"):
        """``model.estimate(problem, plan)`` when its predicted time fits
        ``budget``'s time left (always without a time limit) and it has at
        most :attr:`max_tasks` tasks, else None."""
        if not cls.fits(problem, plan, budget):
            return None
        start = _time.perf_counter()
        report = model.estimate(problem, plan)
        cls.learn(problem, plan, _time.perf_counter() - start)
        return report

    @classmethod
    def fits(cls, problem: "Problem", plan: "Plan | PlanArrays", budget: "Budget") -> bool:
        """Whether :meth:`estimate` would simulate ``plan`` under ``budget``."""
        return cls.tasks(problem, plan) <= cls.max_tasks and (
            budget.time is None or cls.predict(problem, plan) <= budget.remaining_time)

    @classmethod
    def learn(cls, problem: "Problem", plan: "Plan | PlanArrays", took: float) -> None:
        """Take ``took`` seconds, one simulation of ``plan`` (here or on a
        worker), into the rate."""
        tasks = cls.tasks(problem, plan)
        if tasks >= 1e5:        # small runs time the call's overhead, not the work
            measured = took / tasks
            # the first measurement replaces the prior; later ones can
            # halve the rate at most per run (a quiet moment on a busy host)
            cls.rate = measured if not cls._measured else max(measured, cls.rate / 2)
            cls._measured = True


@dataclass(frozen=True)
class RankPolicy:
    """The numbers of the policy in the module doc: ``reserve`` evaluations
    and a ``share`` of time and evaluations hidden from the search for the
    ranking (:meth:`hold`); ``keep`` evaluations the ranking leaves for
    after it (:meth:`room`); ``at_least`` finalists ranked whatever their
    size (None: all), more only while their simulations total at most
    ``max_tasks`` op replicas x microbatches."""

    reserve: int = 0
    share: float = 0.0
    keep: int = 1
    at_least: int | None = None
    max_tasks: float = math.inf
    #: when the time stops the scoring: ``"longest"`` (the time left is
    #: under the longest estimate so far, or the simulator is predicted not
    #: to fit it; a final ranking) or ``"spent"`` (the time is spent: a
    #: search's screening by its own model, which must return a scored plan)
    until: str = "longest"

    def hold(self, budget: Budget) -> "_Held":
        """Context manager: ``budget`` less ``reserve`` evaluations and
        ``share`` of its time and evaluations, for the search inside."""
        return _Held(budget, self.reserve, self.share)

    def room(self, budget: Budget | None, n: int) -> int:
        """How many of ``n`` finalists the evaluations left allow, ``keep``
        of them kept (at least one)."""
        if budget is None or math.isinf(budget.remaining_evaluations):
            return n
        return max(1, min(n, int(budget.remaining_evaluations - self.keep)))


class Ranked(NamedTuple):
    """The ranking's pick: its index among the finalists and its objective
    by the ranking model (None when that model did not score it)."""

    index: int
    value: float | None


def final_ranker(name: str | None, cost_model, budget: Budget):
    """The (metered) cost model that ranks a search's finalists: ``name``'s,
    or ``cost_model`` when None or the same model."""
    if name is None or name == getattr(cost_model, "name", None):
        return cost_model
    from ..cost import get_cost_model
    return budget.meter(get_cost_model(name))


def rank_finalists(model, problem: "Problem", finalists: Sequence, budget: Budget | None = None,
                   *, policy: RankPolicy | None = None, pool=None) -> Ranked:
    """The best of ``finalists`` (plans or plan arrays, best first by the
    search's model) by ``model`` (the first on ties; None: the search's
    own, whose first stands) under ``policy``
    (:class:`RankPolicy`; see the module doc). Without a time limit every
    finalist the evaluations and the task bound allow is scored. With an
    active ``pool`` (:class:`placer.search.parallel.ProblemPool` of
    ``problem``; plans only) they are scored on its workers at once: the
    same pick without a time limit; with one, the plans up to the first the
    simulator is predicted not to fit, those not finished when the time
    runs out left out."""
    policy = policy or RankPolicy()
    finalists = list(finalists)[:policy.room(budget, len(finalists))]
    if model is None or len(finalists) < 2:
        return Ranked(0, None)
    finalists = finalists[:_within_tasks(problem, finalists, policy)]
    if pool is not None and pool.active and not isinstance(finalists[0], PlanArrays):
        return _rank_on(pool, model, problem, finalists, budget)
    values = score_finalists(model, problem, finalists, budget, policy=policy)
    if not values:
        return Ranked(0, None)
    i = int(np.argmin(values))
    return Ranked(i, float(values[i]))


def score_finalists(model, problem: "Problem", finalists: Sequence,
                    budget: Budget | None = None, *, policy: RankPolicy | None = None
                    ) -> list[float]:
    """Objectives by ``model`` of the first of ``finalists`` (plans or plan
    arrays) that ``policy``'s evaluations (``keep`` of them left) and the
    time rule allow, in order (at least the first; see the module doc):
    what :func:`rank_finalists` ranks by."""
    policy = policy or RankPolicy()
    finalists = list(finalists)
    if finalists and not isinstance(finalists[0], PlanArrays) and (
            budget is None or budget.time is None):
        # one batch: as many as one by one would score (a metered model
        # charges one evaluation each)
        finalists = finalists[:policy.room(budget, len(finalists))]
        return [float(r.objective) for r in model.estimate_many(problem, finalists)]
    return _one_by_one(model, problem, finalists, budget, policy)


def rank(model, problem: "Problem", plans: Sequence, budget: Budget | None = None,
         pool=None, policy: RankPolicy | None = None) -> int:
    """Index of the best of ``plans`` by ``model``: :func:`rank_finalists`'
    index (with no ``policy``, every plan is a candidate finalist)."""
    return rank_finalists(model, problem, plans, budget, pool=pool,
                          policy=policy or RankPolicy(keep=0)).index


def _within_tasks(problem: "Problem", finalists: list, policy: RankPolicy) -> int:
    """How many of ``finalists`` the policy's task bound admits."""
    if policy.at_least is None or math.isinf(policy.max_tasks):
        return len(finalists)
    total = 0.0
    for k, f in enumerate(finalists):
        if k >= policy.at_least:
            total += SimulationClock.tasks(problem, f)
            if total > policy.max_tasks:
                return k
    return len(finalists)


def _estimate(model, problem: "Problem", f) -> float:
    """``f``'s objective by ``model`` (a plan, or arrays through the array path)."""
    if isinstance(f, PlanArrays):
        c = f.compact(problem.n_devices)
        return float(model.step_times(problem, c.assign[None], groups=c.groups,
                                      microbatches=c.microbatches, schedule=c.schedule)[0])
    return float(model.estimate(problem, f).objective)


def _one_by_one(model, problem: "Problem", finalists: list, budget: Budget | None,
                policy: RankPolicy) -> list:
    """Objectives of ``finalists`` in order, by the time rule (module doc),
    after the first only while ``budget`` has more than ``policy.keep``
    evaluations left (read before each: a model metered elsewhere, as a
    heuristic's inside another search's seeding, does not charge it)."""
    keep = policy.keep
    timed = budget is not None and budget.time is not None
    simulating = getattr(model, "name", None) == "simulator"
    values: list[float] = []
    longest = 0.0
    spent = policy.until == "spent"
    for f in finalists:
        if values and budget is not None and budget.remaining_evaluations < keep + 1:
            break
        if values and timed and (budget.out_of_time() if spent
                                 else budget.remaining_time <= longest):
            break
        if timed and simulating and not spent and not SimulationClock.fits(problem, f, budget):
            break                   # predicted not to fit the time left
        start = _time.perf_counter()
        values.append(_estimate(model, problem, f))
        took = _time.perf_counter() - start
        if simulating and not spent:
            SimulationClock.learn(problem, f, took)
        longest = max(longest, took)
    return values


def _rank_on(pool, model, problem: "Problem", plans: list["Plan"],
             budget: Budget | None) -> Ranked:
    """:func:`rank_finalists` with the estimates on ``pool``'s workers."""
    from concurrent.futures import TimeoutError as FutureTimeout
    simulating = getattr(model, "name", None) == "simulator"
    timed = budget is not None and budget.time is not None
    if timed and simulating:
        fit = 0
        while fit < len(plans) and SimulationClock.fits(problem, plans[fit], budget):
            fit += 1
        plans = plans[:fit]
    futures = pool.estimate_futures(model.name, plans)
    done: list = []
    for plan, future in zip(plans, futures):
        try:
            done.append(future.result(timeout=budget.remaining_time if timed else None))
        except FutureTimeout:
            break
    for future in futures[len(done):]:
        future.cancel()
    if simulating and timed:        # as the ranking learns the simulator's speed: when timed
        for plan, (_, took) in zip(plans, done):
            SimulationClock.learn(problem, plan, took)
    reports = [r for r, _ in done]
    record = getattr(model, "record", None)
    if record is not None:          # a metered model: charged as if scored here
        reports = record(problem, plans[:len(reports)], reports)
    if not reports:
        return Ranked(0, None)
    values = [r.objective for r in reports]
    i = int(np.argmin(values))
    return Ranked(i, float(values[i]))


class hold_back:
    """Context manager: hide ``share`` of ``budget``'s time and evaluations
    (those it has) from the search inside, for a final phase after it."""

    def __init__(self, budget: Budget, share: float):
        self.budget = budget
        self.dt = 0.0 if budget.time is None else budget.time * share
        self.n = 0 if budget.evaluations is None else int(budget.evaluations * share)

    def __enter__(self) -> Budget:
        if self.budget.time is not None:
            self.budget.time -= self.dt
        if self.budget.evaluations is not None:
            self.budget.evaluations -= self.n
        return self.budget

    def __exit__(self, *exc) -> None:
        if self.budget.time is not None:
            self.budget.time += self.dt
        if self.budget.evaluations is not None:
            self.budget.evaluations += self.n


class reserve:
    """Context manager: hide ``n`` of ``budget``'s evaluations (if it counts
    them) from the search inside, for the final scoring after it."""

    def __init__(self, budget: Budget, n: int):
        self.budget = budget
        self.n = 0
        if budget.evaluations is not None:
            self.n = int(min(n, max(budget.remaining_evaluations - 1, 0)))

    def __enter__(self) -> Budget:
        if self.n:
            self.budget.evaluations -= self.n
        return self.budget

    def __exit__(self, *exc) -> None:
        if self.n:
            self.budget.evaluations += self.n


class _Held:
    """:meth:`RankPolicy.hold`: a :class:`reserve`, then a :class:`hold_back`
    of what it left (made on entry, in that order)."""

    def __init__(self, budget: Budget, n: int, share: float):
        self.budget, self.n, self.share = budget, n, share
        self.parts: list = []

    def __enter__(self) -> Budget:
        self.parts = [reserve(self.budget, self.n)]
        self.parts[0].__enter__()
        self.parts.append(hold_back(self.budget, self.share))
        return self.parts[1].__enter__()

    def __exit__(self, *exc) -> None:
        for part in reversed(self.parts):
            part.__exit__(*exc)

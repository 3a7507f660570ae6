"""What a search over the plan space (:mod:`placer.space`) does around its
main loop, shared by evolution, dtfm and the policy's anytime search: the
seeding heuristics' shares (:class:`SeedPool`), the simulator taken as screening model where it is cheap enough
(:func:`screen_exactly`) and a last descent by another model
(:func:`polish_with`).
"""

from __future__ import annotations

import math
import time as _time
from typing import TYPE_CHECKING

import numpy as np

from ..cost import get_cost_model
from ..errors import PlacerError
from ..plan import Plan
from ..space import OpGenome, Space, local_search
from .base import Budget, get_strategy
from .common import learn_seed_seconds, seed_seconds
from .evaluate import Evaluator
from .ranker import reserve

if TYPE_CHECKING:
    from ..cost import Problem

#: screen with the simulator when this many of its estimates fit in the time left
EXACT_SCREEN_EVALS = 1500


def screen_exactly(problem: "Problem", evaluate: Evaluator, screen, plans: list[Plan],
                   budget: Budget, final: str | None, evals: int | None = None,
                   repeats: int = 1, fallback: bool = False):
    """With a time budget only (an evaluation budget asks for a result that
    does not depend on the machine's speed) and the simulator as the final
    model, screen with the simulator itself when it is cheap enough here: it
    is timed on ``plans`` and taken when :data:`EXACT_SCREEN_EVALS` of its
    estimates fit in the time left (``evals`` of them if given; each plan
    timed as the fastest of ``repeats`` runs, so a first run's warm-up or a
    hiccup of a loaded machine does not decide; ``evaluate`` then scores
    with it, its cache cleared). Small graphs (module level) then search on
    the figures they are ranked by, and the analytical model's disagreements
    stop steering them. With ``fallback`` the evaluator goes back to
    ``screen`` if the plans it meets turn out so much slower to simulate
    than these that a batch of them would not finish in the time left (see
    :meth:`~placer.search.evaluate.Evaluator.use`): its ``switches`` then goes
    up. Returns the screening model."""
    if (budget.time is None or budget.evaluations is not None or final != "simulator"
            or getattr(screen, "name", None) == "simulator" or not plans):
        return screen
    exact = get_cost_model("simulator")
    # the first call may load the compiled loop and fills per-problem caches
    exact.estimate(problem, plans[0])
    evals = EXACT_SCREEN_EVALS if evals is None else evals
    slowest = 0.0
    for plan in plans:
        took = np.inf
        for _ in range(max(1, int(repeats))):
            start = _time.perf_counter()
            exact.estimate(problem, plan)
            took = min(took, _time.perf_counter() - start)
            if took * evals <= budget.remaining_time:
                break
        slowest = max(slowest, took)
        if slowest * evals > budget.remaining_time:
            return screen
    evaluate.use(budget.meter(exact), seconds=slowest,
                 fallback=evaluate.model if fallback else None)
    return exact


def polish_with(space: Space, model, budget: Budget, g: OpGenome, rng: np.random.Generator,
                reserved: int = 1) -> OpGenome | None:
    """Steepest descent around ``g`` scored by ``model`` (metered) in what
    is left of ``budget`` but ``reserved`` evaluations; the improved genome,
    or None."""
    if budget.remaining_evaluations <= reserved + 1 or budget.remaining_time <= 0:
        return None
    with reserve(budget, reserved), Evaluator(space, model, budget) as evaluate:
        start = float(evaluate([g])[0])
        if not np.isfinite(start):
            return None
        best, value = local_search(space, evaluate, g, start, rng, rounds=64, limit=64)
    return best if value < start else None


class SeedPool:
    """Budgets for ``n`` seeding heuristics run one after another: together
    ``share`` of what is left of ``budget``; each may use twice its equal
    part of what the earlier ones left unused (most heuristics take
    milliseconds, so the slow exact ones, such as pipeline_dp, get most of
    it)."""

    def __init__(self, budget: Budget, share: float, n: int):
        self.budget = budget
        self.left = max(int(n), 1)
        t = budget.remaining_time
        self.deadline = None if math.isinf(t) else budget.elapsed + t * share
        self.evals = share / self.left
        self.ran = False

    def skip(self) -> None:
        """One heuristic fewer to run."""
        self.left = max(self.left - 1, 1)

    def next(self) -> Budget:
        """The next heuristic's budget."""
        e = self.budget.remaining_evaluations
        evals = None if math.isinf(e) else max(int(e * self.evals), 1)
        time = None
        if self.deadline is not None:
            pool = self.deadline - self.budget.elapsed
            time = max(min(2.0 / (self.left + 1), 1.0) * pool, 1e-3)
        self.left = max(self.left - 1, 1)
        if time is None and evals is None:
            time = 10.0
        return Budget(time=time, evaluations=evals)

    def run(self, name: str, problem, cost_model, seed: int, **options):
        """Strategy ``name``'s plan for ``problem`` within the next
        heuristic's budget (charged to the whole), or None when it is not
        registered or fails with a :class:`PlacerError`."""
        try:
            strategy = get_strategy(name, **options)
        except PlacerError:
            self.skip()
            return None
        sub = self.next()
        if self.ran and sub.time is not None and \
                seed_seconds(name, problem) > sub.time:
            return None             # predicted not to finish in its share
        self.ran = True
        start = _time.perf_counter()
        try:
            return strategy.search(problem, cost_model, sub, seed=seed)
        except PlacerError:
            return None
        finally:
            self.budget.charge(sub.used)
            learn_seed_seconds(name, problem, _time.perf_counter() - start)


__all__ = ["EXACT_SCREEN_EVALS", "SeedPool", "polish_with", "screen_exactly"]

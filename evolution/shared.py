"""Pieces evolution's searches share (evolution, dtfm, optuna): deap's
one-objective fitness, tournament selection, the progress bar and a
seeding heuristic's share of a budget."""

from __future__ import annotations

import math

import numpy as np
from deap import base

from placer.search.base import Budget


class Fitness(base.Fitness):
    """deap fitness: one objective, minimised (a plain subclass, so no
    ``creator`` classes are made at import)."""

    weights = (-1.0,)


def tournament(fits: np.ndarray, rng: np.random.Generator, k: int) -> int:
    """Index of the best of ``k`` uniformly drawn individuals."""
    idx = rng.integers(len(fits), size=k)
    return int(idx[np.argmin(fits[idx])])


def sub_budget(budget: Budget, share: float) -> Budget:
    """A budget for one seeding heuristic: ``share`` of what is left."""
    t = budget.remaining_time
    e = budget.remaining_evaluations
    time = None if math.isinf(t) else max(t * share, 1e-3)
    evals = None if math.isinf(e) else max(int(e * share), 1)
    if time is None and evals is None:
        time = 10.0
    return Budget(time=time, evaluations=evals)


class ProgressBar:
    """A tqdm progress bar over the time (or evaluation) budget with the
    best objective so far; does nothing unless enabled."""

    def __init__(self, enabled: bool, budget: Budget):
        self.bar = None
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self.budget = budget
        total = budget.evaluations if budget.evaluations is not None else budget.time
        self.by_evals = budget.evaluations is not None
        self.bar = tqdm(total=total, desc="evolution", unit="eval" if self.by_evals else "s",
                        leave=False)
        self._last = 0.0

    def update(self, best: float, gen: int) -> None:
        if self.bar is None:
            return
        now = self.budget.used if self.by_evals else self.budget.elapsed
        if self.bar.total is not None:
            now = min(now, self.bar.total)
        self.bar.update(now - self._last)
        self._last = now
        self.bar.set_postfix_str(f"gen {gen} best {best * 1e3:.4g} ms"
                                 if best < 1e9 else f"gen {gen} infeasible")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


__all__ = ["Fitness", "ProgressBar", "sub_budget", "tournament"]

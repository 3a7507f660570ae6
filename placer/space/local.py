"""The memetic step: steepest-descent local search around a genome.

Each round scores, in one batch, the genome's neighbourhood: every stage
boundary shifted by 1, 2 or a quarter of its stage, every run of
consecutive boundaries shifted by one op together, every boundary op moved
to each neighbour's group, and the neighbouring microbatch counts and the
other schedule; it moves to the best improving neighbour and stops when none
improves (or after ``rounds``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .genome import OpGenome, Space
from .moves import boundary_ops


#: chains of boundaries are shifted only in layouts of at most this many
#: stages (op-level scattered plans have hundreds of runs), and at most
#: this many boundaries long
MAX_CHAIN_STAGES = 16
MAX_CHAIN = 4


def neighbourhood(space: Space, g: OpGenome, rng: np.random.Generator,
                  limit: int = 256) -> list[OpGenome]:
    """Neighbours of ``g`` (at most ``limit``, sampled with ``rng`` if more)."""
    a = g.assign
    n = len(a)
    out: list[OpGenome] = []
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
    ends = np.r_[starts[1:], n]
    for s in range(1, len(starts)):
        k = int(starts[s])                       # first op of stage s
        left_len = k - int(starts[s - 1])
        right_len = int(ends[s]) - k
        for step in sorted({1, 2, max(1, left_len // 4), max(1, right_len // 4)}):
            if step < right_len:                 # left stage takes ops
                c = g.copy()
                c.assign[k:k + step] = a[k - 1]
                out.append(c)
            if step < left_len:                  # right stage takes ops
                c = g.copy()
                c.assign[k - step:k] = a[k]
                out.append(c)
    # a chain of boundaries shifted together: one op's worth of work passes
    # from a stage to a distant one through the stages between (single
    # shifts would each make the pipeline worse first)
    sizes = ends - starts
    chains = len(starts) if len(starts) <= MAX_CHAIN_STAGES else 0
    for s in range(1, chains):
        for t in range(s + 1, min(chains, s + MAX_CHAIN)):
            if sizes[t] > 1:                     # stages s-1.. take one op along
                c = g.copy()
                c.assign[starts[s:t + 1]] = a[starts[s:t + 1] - 1]
                out.append(c)
            if sizes[s - 1] > 1:                 # stages ..t give one op back
                c = g.copy()
                c.assign[starts[s:t + 1] - 1] = a[starts[s:t + 1]]
                out.append(c)
    for i in boundary_ops(space, a).tolist():
        for j in set(a[space.neighbours(i)].tolist()) - {int(a[i])}:
            c = g.copy()
            c.assign[i] = j
            out.append(c)
    ms = space.microbatch_choices
    if g.microbatches in ms:
        i = ms.index(g.microbatches)
        for j in (i - 1, i + 1):
            if 0 <= j < len(ms):
                c = g.copy()
                c.microbatches = ms[j]
                out.append(c)
    for s in space.schedule_choices:
        if s != g.schedule:
            c = g.copy()
            c.schedule = s
            out.append(c)
    for c in out:
        c.assign = space.repair(c.assign)
        c.origin = g.origin
    if len(out) > limit:
        pick = np.sort(rng.choice(len(out), size=limit, replace=False))
        out = [out[i] for i in pick.tolist()]
    return out


def local_search(space: Space, evaluate: Callable, g: OpGenome, score: float,
                 rng: np.random.Generator, *, rounds: int = 4,
                 limit: int = 256) -> tuple[OpGenome, float]:
    """Improve ``g`` (whose objective is ``score``) by steepest descent;
    ``evaluate`` scores a list of genomes and has the search's ``budget``
    (a :class:`placer.search.evaluate.Evaluator`)."""
    best, best_score = g, score
    for _ in range(rounds):
        if evaluate.budget is not None and evaluate.budget.exhausted():
            break
        cands = neighbourhood(space, best, rng, limit)
        if not cands:
            break
        scores = evaluate(cands)
        i = int(np.argmin(scores))
        if not scores[i] < best_score * (1 - 1e-9):
            break
        best, best_score = cands[i], float(scores[i])
    return best, best_score


__all__ = ["local_search", "neighbourhood"]

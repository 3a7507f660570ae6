"""Refinement of a plan on the fine graph by boundary moves.

After a search on a coarsened graph (:mod:`placer.search.multilevel`), the
plan expanded back to the original ops places whole groups; the cut between
two groups then follows the coarsening, not the costs. :func:`refine` moves
ops across those cuts: a move takes the ops of one device group that lie
within ``depth`` edges of its boundary with another group (both directions
of the data flow) and gives them to that group. Each round builds moves
for the most unbalanced and the heaviest-traffic pairs of groups at several
depths, scores them in one batch with the cost model and keeps the best if
it improves the plan; it stops at a local optimum or when the budget is
spent. Colocated ops move together.
"""

from __future__ import annotations

import numpy as np

from .arrays import PlanArrays
from .common import context

#: how many edges deep into a group a move reaches, per pair of groups
DEPTHS = (1, 4, 16, 64)


def refine(problem, plan, cost_model, budget, *, pairs: int = 6, batch: int = 8,
           depths=DEPTHS, progress=None, pool=None):
    """``plan`` improved by boundary moves scored by ``cost_model`` (its
    ``step_times``; metered, so the moves are charged to ``budget``) while
    ``budget`` lasts; returns ``(plan, objective, moves kept, objective of
    plan as given)``. The plan
    returned is never worse by ``cost_model`` than ``plan``.

    ``pairs`` pairs of device groups get moves each round (half by load
    imbalance, half by the bytes crossing them), at every depth of
    ``depths``; they are scored ``batch`` at a time, the time checked
    between batches. With an active ``pool``
    (:class:`placer.search.parallel.ProblemPool` of ``problem``) each batch
    is scored on its workers, split between them: the same moves and plan
    (``cost_model`` must then be a registered model, metered)."""
    given = PlanArrays.from_plan(problem, plan)
    a = given.assign.astype(np.int64)
    groups = list(given.groups)
    table = [(d,) for d in range(problem.n_devices)] + groups
    m, s = given.microbatches, given.schedule

    def score(rows: np.ndarray) -> np.ndarray:
        if pool is not None and pool.active:
            values = pool.step_times(cost_model.name, rows, groups=groups, microbatches=m,
                                     schedule=s)
            return cost_model.record_rows(problem, rows, values, groups=groups,
                                          microbatches=m, schedule=s)
        return np.asarray(cost_model.step_times(problem, rows, groups=groups,
                                                microbatches=m, schedule=s), dtype=float)

    value = first = float(score(a[None, :])[0])
    kept = 0
    ctx = context(problem)
    rate = np.array([sum(problem.rate[list(g)]) for g in table])
    tried: set[tuple[int, int]] = set()
    while not budget.exhausted():
        moves = _moves(problem, ctx, a, rate, pairs, depths, tried)
        if not moves:
            break
        best_row, best_value, best_move = None, value, None
        for start in range(0, len(moves), batch):
            if start and budget.exhausted():
                break
            chunk = moves[start:start + batch]
            rows = np.repeat(a[None, :], len(chunk), axis=0)
            for r, (_, to, ops) in enumerate(chunk):
                rows[r, ops] = to
            values = score(rows)
            j = int(np.argmin(values))
            if values[j] < best_value * (1 - 1e-9):
                best_row, best_value, best_move = rows[j].copy(), float(values[j]), chunk[j]
        if best_row is None:
            # no move of these pairs helps: try the next pairs, if any
            tried.update((f, t) for f, t, _ in moves)
            continue
        a, value = best_row, best_value
        kept += 1
        tried.clear()
        if progress is not None:
            progress(value, f"refine: {len(best_move[2])} ops moved")
    refined = given.replace(assign=a).to_plan(problem, plan.method)
    refined.predicted = dict(plan.predicted)
    refined.extra = dict(plan.extra)
    return refined, value, kept, first


def _moves(problem, ctx, a: np.ndarray, rate: np.ndarray, pairs: int, depths,
           tried: set) -> list[tuple[int, int, np.ndarray]]:
    """``(from group, to group, ops)`` moves for the best ``pairs`` pairs of
    groups not in ``tried``."""
    src, dst, nbytes = problem.edge_src, problem.edge_dst, problem.edge_bytes
    ga, gb = a[src], a[dst]
    cross = ga != gb
    if not cross.any():
        return []
    f = np.r_[ga[cross], gb[cross]]
    t = np.r_[gb[cross], ga[cross]]
    w = np.r_[nbytes[cross], nbytes[cross]]
    key = f * len(rate) + t
    keys, inverse = np.unique(key, return_inverse=True)
    traffic = np.bincount(inverse, w, minlength=len(keys))
    load = np.bincount(a, ctx.work, minlength=len(rate)) / rate
    pf, pt = keys // len(rate), keys % len(rate)
    imbalance = load[pf] - load[pt]
    fresh = np.array([(int(x), int(y)) not in tried for x, y in zip(pf, pt)], dtype=bool)
    chosen: list[int] = []
    for k in np.argsort(-imbalance, kind="stable").tolist():
        if len(chosen) >= (pairs + 1) // 2 or imbalance[k] <= 0:
            break
        if fresh[k]:
            chosen.append(k)
    for k in np.argsort(-traffic, kind="stable").tolist():
        if len(chosen) >= pairs:
            break
        if fresh[k] and k not in chosen:
            chosen.append(k)
    moves = []
    for k in chosen:
        fg, tg = int(pf[k]), int(pt[k])
        inside = a == fg
        # the group's ops on its boundary with tg
        frontier = np.zeros(len(a), dtype=bool)
        frontier[src[(ga == fg) & (gb == tg)]] = True
        frontier[dst[(gb == fg) & (ga == tg)]] = True
        reach = frontier
        hops = 1
        for depth in sorted(depths):
            while hops < depth:
                grown = reach.copy()
                grown[dst[reach[src] & inside[dst]]] = True
                grown[src[reach[dst] & inside[src]]] = True
                hops += 1
                if grown.sum() == reach.sum():
                    hops = depth
                reach = grown
            ops = _with_colocated(ctx, np.flatnonzero(reach))
            if moves and moves[-1][0] == fg and moves[-1][1] == tg and \
                    len(moves[-1][2]) == len(ops):
                continue
            moves.append((fg, tg, ops))
    return moves


def _with_colocated(ctx, ops: np.ndarray) -> np.ndarray:
    """``ops`` and every op colocated with one of them."""
    if not ctx.coloc:
        return ops
    labels = np.unique(ctx.coloc_of[ops])
    labels = labels[labels >= 0]
    if not len(labels):
        return ops
    return np.unique(np.concatenate([ops] + [ctx.coloc[g] for g in labels.tolist()]))

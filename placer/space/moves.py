"""Variation operators on :class:`~placer.space.genome.OpGenome`, each with an
explicit ``numpy.random.Generator`` (never the global ``random`` state).

Mutations are topology-aware: ops move to a graph neighbour's devices or to
devices near (by bandwidth) the ones they are on; stage boundaries shift
along the topological order; two stages swap devices; a stage gains or
loses a data-parallel replica (the nearest free device first); a stage
splits onto a nearby device or merges into its neighbour; microbatches and
schedule change. Crossover exchanges contiguous segments of the
topological order, so pipeline stages survive it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .genome import OpGenome, Space


def boundary_ops(space: Space, a: np.ndarray) -> np.ndarray:
    """Ops with a graph neighbour in another group."""
    p = space.problem
    if not p.n_edges:
        return np.zeros(0, dtype=np.int64)
    cut = a[p.edge_src] != a[p.edge_dst]
    return np.unique(np.r_[p.edge_src[cut], p.edge_dst[cut]])


def mut_neighbour_op(space: Space, g: OpGenome, rng: np.random.Generator) -> OpGenome:
    """Move one op (preferably on a stage boundary) to a graph neighbour's group."""
    a = g.assign
    cand = boundary_ops(space, a)
    i = int(rng.choice(cand)) if len(cand) else int(rng.integers(space.n_ops))
    nb = space.neighbours(i)
    if not len(nb):
        return g
    a[i] = a[int(rng.choice(nb))]
    return g


def mut_boundary(space: Space, g: OpGenome, rng: np.random.Generator) -> OpGenome:
    """Shift a stage boundary along the order by a few ops (geometric)."""
    a = g.assign
    n = len(a)
    b = np.flatnonzero(a[1:] != a[:-1])
    if not len(b):
        return g
    k = int(rng.choice(b))              # a[k] != a[k+1]
    step = int(min(rng.geometric(0.3), n))
    if rng.random() < 0.5:              # the left stage grows
        hi = min(n, k + 1 + step)
        a[k + 1:hi] = a[k]
    else:                               # the right stage grows
        lo = max(0, k + 1 - step)
        a[lo:k + 1] = a[k + 1]
    return g


def mut_near_device(space: Space, g: OpGenome, rng: np.random.Generator) -> OpGenome:
    """Move a run of ops to a device near one of its current devices."""
    a = g.assign
    starts, gids = space.stages_of(a)
    s = int(rng.integers(len(starts)))
    lo = int(starts[s])
    hi = int(starts[s + 1]) if s + 1 < len(starts) else len(a)
    if hi - lo > 1 and rng.random() < 0.5:      # only part of the run
        cut = int(rng.integers(lo + 1, hi))
        lo, hi = (lo, cut) if rng.random() < 0.5 else (cut, hi)
    devs = space.table.devices(int(gids[s]))
    d = int(rng.choice(devs))
    near = space.near[d]
    if not len(near):
        return g
    k = int(min(rng.geometric(0.35) - 1, len(near) - 1))
    a[lo:hi] = int(near[k])
    return g


def mut_swap_stages(space: Space, g: OpGenome, rng: np.random.Generator) -> OpGenome:
    """Swap the devices of two groups used by the plan."""
    a = g.assign
    used = np.unique(a)
    if len(used) < 2:
        # move everything to the next fastest device instead
        d = int(space.by_speed[int(rng.integers(len(space.by_speed)))])
        a[:] = d
        return g
    x, y = rng.choice(used, size=2, replace=False)
    mx, my = a == x, a == y
    a[mx], a[my] = y, x
    return g


def mut_replicas(space: Space, g: OpGenome, rng: np.random.Generator) -> OpGenome:
    """Add a replica (the nearest device not used by the plan, else any
    nearest outside the group) to a group, or drop one of its replicas."""
    a = g.assign
    used = np.unique(a)
    gid = int(rng.choice(used))
    devs = list(space.table.devices(gid))
    if len(devs) > 1 and (rng.random() < 0.4 or len(devs) >= space.n_devices):
        devs.pop(int(rng.integers(len(devs))))
    else:
        busy = set()
        for u in used.tolist():
            busy.update(space.table.devices(u))
        anchor = int(rng.choice(devs))
        outside = [int(d) for d in space.near[anchor] if int(d) not in devs]
        if not outside:
            return g
        free = [d for d in outside if d not in busy]
        pool = free if free and rng.random() < 0.8 else outside
        devs.append(pool[int(min(rng.geometric(0.5) - 1, len(pool) - 1))])
    a[a == gid] = space.table.id(devs)
    return g


def mut_split_merge(space: Space, g: OpGenome, rng: np.random.Generator) -> OpGenome:
    """Split a stage in two (second half on a free nearby device) or merge a
    stage into its neighbour along the order."""
    a = g.assign
    starts, gids = space.stages_of(a)
    s = int(rng.integers(len(starts)))
    lo = int(starts[s])
    hi = int(starts[s + 1]) if s + 1 < len(starts) else len(a)
    if len(starts) > 1 and (rng.random() < 0.4 or hi - lo < 2):
        other = gids[s - 1] if s > 0 and (s + 1 >= len(starts) or rng.random() < 0.5) \
            else gids[s + 1]
        a[lo:hi] = other
        return g
    if hi - lo < 2:
        return g
    w = space.cum_work
    base = w[lo - 1] if lo > 0 else 0.0
    mid = int(np.searchsorted(w[lo:hi], base + (w[hi - 1] - base) / 2)) + lo + 1
    mid = min(max(mid, lo + 1), hi - 1)
    busy = set()
    for u in np.unique(a).tolist():
        busy.update(space.table.devices(u))
    anchor = int(rng.choice(space.table.devices(int(gids[s]))))
    free = [int(d) for d in space.near[anchor] if int(d) not in busy]
    if not free:
        return g
    size = space.table.size(int(gids[s]))
    new = free[:size] if rng.random() < 0.5 else free[:1]
    a[mid:hi] = space.table.id(new)
    return g


def mut_settings(space: Space, g: OpGenome, rng: np.random.Generator) -> OpGenome:
    """Change the number of microbatches (to a neighbouring choice) or the schedule."""
    ms = space.microbatch_choices
    if len(space.schedule_choices) > 1 and rng.random() < 0.25:
        g.schedule = str(rng.choice([s for s in space.schedule_choices if s != g.schedule]))
        return g
    if len(ms) > 1:
        i = ms.index(g.microbatches) if g.microbatches in ms else 0
        j = min(max(i + (1 if rng.random() < 0.5 else -1), 0), len(ms) - 1)
        if j == i:
            j = 1 if i == 0 else i - 1
        g.microbatches = ms[j]
    return g


#: name -> (operator, default weight)
MUTATIONS: dict[str, tuple[Callable, float]] = {
    "neighbour_op": (mut_neighbour_op, 3.0),
    "boundary": (mut_boundary, 3.0),
    "near_device": (mut_near_device, 1.5),
    "swap_stages": (mut_swap_stages, 1.0),
    "replicas": (mut_replicas, 1.0),
    "split_merge": (mut_split_merge, 1.0),
    "settings": (mut_settings, 1.0),
}


def mutate(space: Space, g: OpGenome, rng: np.random.Generator, *, rate: float = 1.5,
           weights: dict | None = None) -> OpGenome:
    """Apply 1 + Poisson(``rate`` - 1) operators drawn by weight, then repair
    colocation. Works in place and returns ``g``."""
    names = list(MUTATIONS)
    w = np.array([(weights or {}).get(k, MUTATIONS[k][1]) for k in names], dtype=float)
    w = w / w.sum()
    count = 1 + int(rng.poisson(max(rate - 1.0, 0.0)))
    for _ in range(count):
        op = MUTATIONS[names[int(rng.choice(len(names), p=w))]][0]
        g = op(space, g, rng)
    g.assign = space.repair(g.assign)
    return g


def crossover(space: Space, x: OpGenome, y: OpGenome,
              rng: np.random.Generator) -> tuple[OpGenome, OpGenome]:
    """Two-point crossover on the topological order: the children swap one
    contiguous segment (cut points preferably at the parents' stage
    boundaries); each child takes microbatches and schedule from a parent."""
    n = space.n_ops
    if n < 2:
        return x, y
    bounds = np.unique(np.r_[np.flatnonzero(x.assign[1:] != x.assign[:-1]),
                             np.flatnonzero(y.assign[1:] != y.assign[:-1])] + 1)
    if len(bounds) >= 2 and rng.random() < 0.7:
        i, j = np.sort(rng.choice(bounds, size=2, replace=False))
    else:
        i, j = np.sort(rng.choice(np.arange(1, n + 1), size=2, replace=False))
    i, j = int(i), int(j)
    seg = x.assign[i:j].copy()
    x.assign[i:j] = y.assign[i:j]
    y.assign[i:j] = seg
    if rng.random() < 0.5:
        x.microbatches, y.microbatches = y.microbatches, x.microbatches
    if rng.random() < 0.5:
        x.schedule, y.schedule = y.schedule, x.schedule
    x.assign = space.repair(x.assign)
    y.assign = space.repair(y.assign)
    return x, y


__all__ = ["MUTATIONS", "boundary_ops", "crossover", "mutate", "mut_boundary", "mut_near_device",
           "mut_neighbour_op", "mut_replicas", "mut_settings", "mut_split_merge",
           "mut_swap_stages"]

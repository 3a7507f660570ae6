"""The one-shot candidates' rows and moves that ``rl``'s first plan
(:mod:`gnn.strategies`) and its anytime search (:mod:`gnn.anytime`) share:
the baseline plans (pipelines, site and class pipelines, stage/replica
layouts, HEFT's plan), the replica moves, the unit view of a row and the
one-thread context decoding runs in."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["OneThread", "baseline_rows", "heft_rows", "replica_moves", "unit_row",
           "POLISH_GAP", "PIPE_STAGES", "CLASS_STAGES", "HEFT_OPS", "REPLICA_SPANS"]


class OneThread:
    """Decoding is many tiny tensor ops: one intra-op thread is fastest, and
    leaves the other cores to the cost model or other work."""

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


#: the policy's best plan is polished only within this factor of the best plan
#: (1.25 until the cheap-cut pipelines: one of them now leads the policy's
#: start by 27% on moe@hetero-lab, where the policy's polish wins by the
#: simulator)
POLISH_GAP = 1.35


#: ops at each end of a run that :func:`replica_moves` replicates (one op,
#: then the end's first ``k`` ops together)
REPLICA_SPANS = (1, 2)


def replica_moves(space, g, rng=None, limit: int | None = None) -> list:
    """Neighbours of ``g`` (an :class:`placer.space.OpGenome`) that make
    an op, or a short run of ops, data-parallel over its own devices and
    those of an adjacent stage: for each run of equal groups along the
    order, its first and last ``k`` ops (``k`` in :data:`REPLICA_SPANS`)
    replicated over the union of their devices and the previous or next
    run's; and each op with a graph neighbour in another group (a producer
    or consumer on other devices) over the union of its devices and that
    neighbour's. Colocation is repaired (a class follows its first member).
    At most ``limit`` of them: the runs' ends first (a pipeline has a few),
    then boundary ops to fill (sampled with ``rng`` where there are more).

    evolution's memetic neighbourhood moves ops between existing groups and
    shifts boundaries; it never widens a group, so a descent from a
    pipeline cannot reach a plan whose first op is data-parallel over both
    stages' devices (moe on edge-wireless: evolution's plan replicates the
    input op on the second Orin NX, rl's now ``ln_f``; both are zero-FLOP
    ops, and what the extra run of the order buys is a higher 1F1B
    in-flight cap, :func:`placer.cost.memory.inflight`: 2.97 and 2.86 s
    against 3.42 s by the simulator)."""
    from placer.space import boundary_ops
    a = g.assign
    n = len(a)
    table = space.table
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
    ends = np.r_[starts[1:], n]
    ends_, edges_ = {}, {}     # (lo, hi, other group) -> None, in order
    R = len(starts)
    for r in range(R if R > 1 else 0):
        lo, hi = int(starts[r]), int(ends[r])
        for k in REPLICA_SPANS:
            if k > hi - lo:
                break
            for other in (r - 1, r + 1):
                if 0 <= other < R:
                    gid = int(a[starts[other]])
                    ends_[(lo, lo + k, gid)] = None
                    ends_[(hi - k, hi, gid)] = None
    for i in boundary_ops(space, a).tolist():
        for j in set(a[space.neighbours(i)].tolist()) - {int(a[i])}:
            if (i, i + 1, int(j)) not in ends_:
                edges_[(i, i + 1, int(j))] = None
    rep = space.rep if space.has_colocation else None
    follows = rep != np.arange(n) if rep is not None else None

    def keep(specs: dict, room) -> list:
        """The specs whose ops lead their colocation class, at most ``room``
        (sampled with ``rng``)."""
        specs = [sp for sp in specs if follows is None or not follows[sp[0]:sp[1]].any()]
        if room is not None and len(specs) > room:
            pick = (rng if rng is not None else np.random.default_rng(0)).choice(
                len(specs), size=room, replace=False)
            specs = [specs[i] for i in np.sort(pick).tolist()]
        return specs
    # the runs' ends first (a pipeline has few), then boundary ops to fill
    specs = keep(ends_, limit)
    specs += keep(edges_, None if limit is None else limit - len(specs))
    out, seen = [], set()
    for lo, hi, other in specs:
        devs = set(table.devices(other))
        for x in {int(a[lo]), int(a[hi - 1])}:
            devs.update(table.devices(x))
        gid = table.id(devs)
        if (lo, hi, gid) in seen or (a[lo:hi] == gid).all():
            continue
        seen.add((lo, hi, gid))
        c = g.copy()
        c.assign[lo:hi] = gid
        c.assign = space.repair(c.assign)
        out.append(c)
    return out


def unit_row(pg, op_row: np.ndarray) -> np.ndarray:
    """Device per unit from device per op: the device of each unit's first op."""
    first = np.zeros(pg.n_units, dtype=np.int64)
    first[pg.unit_of[::-1]] = op_row[::-1]
    return first


def baseline_rows(problem, space=None, max_devices: int = 16):
    """``(pipelines, layouts, stages)``: the simple reference plans (device
    per op) of :mod:`gnn.problems`, each pipeline also with its boundaries
    moved to cheap cuts (:func:`gnn.problems.cheap_cuts`), colocation
    kept, and with evolution's
    ``space`` its balanced stage/replica layouts over at most ``max_devices``
    devices (group per op, numbered in ``space.table``; none without it)
    with their number of pipeline stages. Wider
    layouts cost the cost model up to 100x more per plan (an all-reduce per
    op over wide groups, many stages) and wide clusters are the policy's
    own ground."""
    from .problems import (cheap_cuts, class_pipelines, colocated, even_pipelines,
                           pipeline_assignments, site_pipelines, site_replicas)
    rows = pipeline_assignments(problem)
    # and every other depth: a site of three fast GPUs is a pipeline of three
    deep = even_pipelines(problem, [k for k in range(3, min(problem.n_devices, PIPE_STAGES) + 1)
                                    if k & (k - 1)])
    # and inside each site (the global order starts at the largest one)
    deep = np.concatenate([deep, site_pipelines(problem, PIPE_STAGES)])
    if len(deep):
        seen = {r.tobytes() for r in rows}
        deep = [r for r in dict((r.tobytes(), r) for r in deep).values()
                if r.tobytes() not in seen]
        rows = np.concatenate([rows, deep]) if deep else rows
    # each pipeline also with its boundaries at the cheapest cuts nearby
    cuts = cheap_cuts(problem, rows[[len(np.unique(r)) > 1 for r in rows]])
    seen = {r.tobytes() for r in rows}
    cuts = [r for r in cuts if r.tobytes() not in seen]
    rows = colocated(problem, np.concatenate([rows, cuts]) if cuts else rows)
    # pipelines of whole colocation classes (an unrolled recurrence's layers)
    classes = class_pipelines(problem, range(2, min(problem.n_devices, CLASS_STAGES) + 1))
    if len(classes):
        seen = {r.tobytes() for r in rows}
        classes = [r for r in classes if r.tobytes() not in seen]
        rows = np.concatenate([rows, classes]) if classes else rows
    if space is None:
        return rows, rows[:0], np.zeros(0, dtype=np.int64)
    from placer.space import layout_seeds, shapes_for
    layouts = {}
    for g in layout_seeds(space, limit=len(shapes_for(space.n_devices, space.n_ops)),
                          max_devices=max_devices):
        stages = int(g.origin.rsplit("-", 1)[-1].split("x")[0])
        layouts.setdefault(g.assign.tobytes(), (g.assign, stages))
    # the whole graph data-parallel over a site's fast devices (the chain
    # of the layouts above starts at the fastest device, not the fastest link)
    for devs in site_replicas(problem):
        if len(devs) <= max_devices:
            row = space.repair(np.full(problem.n_ops, space.table.id(devs), dtype=np.int64))
            layouts.setdefault(row.tobytes(), (row, 1))
    if not layouts:
        return rows, rows[:0], np.zeros(0, dtype=np.int64)
    assign, stages = zip(*layouts.values())
    return rows, np.stack(assign), np.array(stages)


#: the most stages of :func:`gnn.problems.class_pipelines` among the baselines
CLASS_STAGES = 8
#: the deepest even pipeline among the baselines
PIPE_STAGES = 8
#: HEFT's plan joins the baselines of graphs of at most this many ops (list
#: scheduling 2,000 ops takes 0.2 s and more)
HEFT_OPS = 256


def heft_rows(problem) -> np.ndarray:
    """HEFT's plan (device per op, one row; none above :data:`HEFT_OPS` ops):
    an unrolled recurrence on two speed classes is neither a pipeline nor
    one device (rnn-t32-l4 on classes-d8: 3.85 ms against the other
    baselines' 5.06). Its placement only, colocation kept (the strategy's
    own search also picks a microbatch count and schedule with the cost
    model, which the screening does here: 10-25 ms of list scheduling
    instead of 15-30)."""
    from placer.search import get_strategy
    from placer.search.common import Coarse, context, fix_colocation
    if problem.n_ops > HEFT_OPS:
        return np.zeros((0, problem.n_ops), dtype=np.int64)
    heft = get_strategy("heft")
    coarse = Coarse(problem, heft.max_nodes)
    row = fix_colocation(context(problem), coarse.expand(heft.place(coarse.problem)))
    return np.asarray(row, dtype=np.int64)[None]

"""Branch-spread candidates for ``rl``'s one-shot plan: plans whose parallel
branches (a mixture-of-experts layer's experts, an inception module's
towers) are spread over several devices while the chain around them stays
where a base plan put it.

Every other one-shot candidate is a chain of stages (each op's devices
follow the topological order). evolution's best plan of an expert stack on
two speed classes (experts-e16-l2 on classes-d12: 21.6 ms against the
chains' 29.8 by the simulator) is not: each block's attention and router
sit on one GPU, its 16 experts are spread over three of the site's GPUs
(7, 5 and 4 of them), the next block's chain on another GPU, and the head
data-parallel over the other site's pair. Spreading is done per region by
longest-processing-time first over a few devices of the fork op's site,
each device's load from the base plan counted first."""

from __future__ import annotations

import numpy as np

__all__ = ["branch_regions", "branch_rows", "spread_rows", "SPREAD_SIZES", "MIN_BRANCHES",
           "BODY_SITES", "BODY_STAGES"]

#: devices a region's branches are spread over (the fork's device among them)
SPREAD_SIZES = (2, 3, 4)
#: forks with fewer branches than this are left alone
MIN_BRANCHES = 3


def branch_regions(problem, min_branches: int = MIN_BRANCHES) -> list[tuple[int, list, int]]:
    """``[(fork, branches, join)]``: ops (indices in ``problem.ids`` order)
    with at least ``min_branches`` successors that each start a chain of
    ops with one producer and one consumer ending at the same ``join`` op;
    ``branches`` holds each chain's op indices (an edge straight from the
    fork to the join, a residual, is no branch).

    >>> from placer import datasets, generators
    >>> from placer.cost import Problem
    >>> p = Problem(generators.expert_layers(4, 2), datasets.cluster("classes-d6-s0"))
    >>> [(p.ids[f], len(b), p.ids[j]) for f, b, j in branch_regions(p)]
    [('b0.router', 4, 'b0.combine'), ('b1.router', 4, 'b1.combine')]
    """
    n = problem.n_ops
    src, dst = problem.edge_src, problem.edge_dst
    n_in = np.bincount(dst, minlength=n)
    n_out = np.bincount(src, minlength=n)
    order = np.argsort(src, kind="stable")
    first = np.r_[0, np.cumsum(n_out)]
    succ = dst[order]
    out = []
    for f in np.flatnonzero(n_out >= min_branches).tolist():
        branches, joins = [], set()
        for s in succ[first[f]:first[f + 1]].tolist():
            chain, x = [], s
            while n_in[x] == 1 and n_out[x] == 1:
                chain.append(x)
                x = int(succ[first[x]])
            if chain and n_in[x] >= 2:
                branches.append(np.array(chain, dtype=np.int64))
                joins.add(x)
        if len(branches) >= min_branches and len(joins) == 1:
            out.append((f, branches, joins.pop()))
    return out


def _work(problem) -> np.ndarray:
    """FLOPs of each op's step (forward, and backward when training)."""
    return problem.flops + (problem.bwd_flops if problem.training else 0.0)


def spread_rows(problem, space, row: np.ndarray, regions: list,
                sizes=SPREAD_SIZES, alone: bool = True) -> np.ndarray:
    """Rows (group per op in ``space.table``) from base ``row``: for each
    device count ``k`` in ``sizes``, every region of ``regions`` (from
    :func:`branch_regions`) whose fork sits on one device spread over that
    device and the ``k - 1`` least-loaded others of its site and speed
    class (within 1%), and (with ``alone``) each region alone so spread; branches placed
    longest first on the device where they would finish first, the load
    of the base plan's other ops counted. Colocation repaired; duplicates
    and ``row`` itself left out."""
    D = problem.n_devices
    work = _work(problem)
    rate = problem.rate
    # contrib[i, d]: op i's time on device d in the base plan (a
    # data-parallel op's work split over its devices)
    member = np.zeros((int(row.max()) + 1, D))
    for gid in np.unique(row).tolist():
        devs = list(space.table.devices(gid))
        member[gid, devs] = 1.0 / len(devs)
    contrib = member[row] * (work / 1.0)[:, None] / rate[None, :]
    load = contrib.sum(axis=0)
    live = [(f, b, j) for f, b, j in regions if row[f] < D]
    if not live:
        return np.zeros((0, len(row)), dtype=row.dtype)
    picks = [live] + ([[r] for r in live] if alone and len(live) > 1 else [])
    out: dict[bytes, np.ndarray] = {row.tobytes(): row}
    rate_ = rate.tolist()
    site = problem.site.tolist()
    for chosen in picks:
        # the chosen regions' branches leave their devices
        ops = np.concatenate([b for _, branches, _ in chosen for b in branches])
        free = (load - contrib[ops].sum(axis=0)).tolist()
        costs = [[float(work[b].sum()) for b in branches] for _, branches, _ in chosen]
        for k in sizes:
            new = row.copy()
            base = list(free)
            for (f, branches, _), cost in zip(chosen, costs):
                d0 = int(row[f])
                pool = [d for d in range(D) if site[d] == site[d0] and d != d0
                        and abs(rate_[d] - rate_[d0]) <= 0.01 * rate_[d0]]
                if len(pool) < k - 1:
                    continue
                devs = [d0] + sorted(pool, key=lambda d: (base[d], d))[:k - 1]
                for i in sorted(range(len(cost)), key=lambda i: -cost[i]):
                    d = min(devs, key=lambda d: base[d] + cost[i] / rate_[d])
                    base[d] += cost[i] / rate_[d]
                    new[branches[i]] = d
            new = space.repair(new)
            out.setdefault(new.tobytes(), new)
    del out[row.tobytes()]
    return np.stack(list(out.values())) if out else np.zeros((0, len(row)), dtype=row.dtype)


#: sites (by the total speed of their fastest class) a body is placed in
#: (the second site's bodies won none of the benchmark's cases)
BODY_SITES = 1
#: the most pipeline stages of a body (winners on the benchmark's cases
#: have 1-3)
BODY_STAGES = 3


def branch_rows(problem, space, regions: list | None = None) -> np.ndarray:
    """Rows (group per op in ``space.table``): a body and a tail, each
    body's branches also spread (:func:`spread_rows`, all regions at once).
    The body, the ops before the last region's join, is an even pipeline
    over the first 1..:data:`BODY_STAGES` devices of the fastest class of
    one of the :data:`BODY_SITES` fastest sites; the tail (that join and
    what follows it: a head, a classifier) stays on the body's last device
    or is data-parallel over the fastest devices of another site of the
    same speed class (:func:`gnn.problems.site_replicas`). evolution's plan
    of experts-e16-l2 on classes-d12 is such a plan: a one-stage body on an
    A100 of site 0, its experts over that site's four A100s, the head on
    site 2's 86 GB/s pair (19.8 ms by the simulator; the chains' best 29.8).
    None without regions (:func:`branch_regions`)."""
    from .problems import site_devices, site_replicas
    regions = branch_regions(problem) if regions is None else regions
    if not regions:
        return np.zeros((0, problem.n_ops), dtype=np.int64)
    j = max(r[2] for r in regions)
    rate = problem.rate
    work = _work(problem)[:j]
    frac = (np.cumsum(work) - work / 2) / max(work.sum(), 1e-30)
    classes = []
    for ds in site_devices(problem):
        fast = [d for d in ds if rate[d] >= 0.99 * rate[ds[0]]]
        classes.append(fast)
    classes.sort(key=lambda fast: -rate[fast].sum())
    replicas = site_replicas(problem)
    out: dict[bytes, np.ndarray] = {}
    for fast in classes[:BODY_SITES]:
        tails = [None] + [g for g in replicas if not set(g) & set(fast)
                          and abs(rate[g[0]] - rate[fast[0]]) <= 0.01 * rate[fast[0]]]
        for k in range(1, min(len(fast), BODY_STAGES) + 1):
            devs = np.array(fast[:k])
            bounds = np.cumsum(rate[devs]) / rate[devs].sum()
            body = devs[np.minimum(np.searchsorted(bounds, frac, side="right"), k - 1)]
            for tail in tails:
                gid = body[-1] if tail is None else space.table.id(tail)
                row = space.repair(np.r_[body, np.full(problem.n_ops - j, gid)])
                out.setdefault(row.tobytes(), row)
                for r in spread_rows(problem, space, row, regions, alone=False):
                    out.setdefault(r.tobytes(), r)
    return np.stack(list(out.values())) if out else np.zeros((0, problem.n_ops), dtype=np.int64)

"""List scheduling: ``heft``, and Baechi's memory-constrained ``m_etf`` and
``m_sct`` (Jeon et al., "Baechi: fast device placement of machine learning
graphs", SoCC 2020).

All three schedule one training step as a DAG of ops, each taking its
forward plus backward compute time on a device, and charge a tensor that
crosses devices latency + bytes / bandwidth of that link (twice when
training: the activation and its gradient). Every op goes on one device;
an op never goes where it would overflow memory (a conservative ledger,
:class:`placer.search.common.MemoryLedger`) unless it fits nowhere.
Colocated ops follow the first op of their group. The cost model then
picks the microbatch count and schedule of the resulting placement.

Graphs larger than ``max_nodes`` (default 2000) are coarsened first.
"""

from __future__ import annotations

import bisect

import numpy as np

from .base import Strategy, register_strategy
from .common import Candidate, Coarse, MemoryLedger, choose, context, fix_colocation


class _ListScheduler(Strategy):
    """Shared driver: coarsen, place with :meth:`place`, expand, score."""

    default_max_nodes = 2000

    def __init__(self, *, max_nodes: int | None = None, **options):
        super().__init__(**options)
        self.max_nodes = self.default_max_nodes if max_nodes is None else max_nodes

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        coarse = Coarse(problem, self.max_nodes)
        assign = coarse.expand(self.place(coarse.problem))
        assign = fix_colocation(context(problem), assign)
        plan, report, _ = choose(self, problem, cost_model, budget, [Candidate(assign)],
                                 progress=progress)
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)

    def place(self, problem) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


def _ready_times(ctx, i: int, dev: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """Earliest time op ``i``'s inputs can all be on each device."""
    preds, nbytes = ctx.preds(i)
    if not len(preds):
        return np.zeros(ctx.D)
    src = dev[preds]
    arrive = finish[preds][:, None] + ctx.phases * (ctx.latency[src] + nbytes[:, None]
                                                    * ctx.inv_bw[src])
    arrive[np.arange(len(preds)), src] = finish[preds]
    return arrive.max(axis=0)


def _fallback(ledger: MemoryLedger, i: int, dev: np.ndarray) -> int:
    """Where an op that fits nowhere goes: the device left with most memory."""
    return int(np.argmax(ledger.free() - ledger.demand(i, dev)))


@register_strategy
class HEFT(_ListScheduler):
    """Heterogeneous Earliest Finish Time (Topcuoglu et al., 2002): ops by
    decreasing upward rank (mean compute and communication times to the
    exit), each on the device where it finishes earliest, using idle gaps
    between already scheduled ops (insertion policy) when the graph is
    small enough (``insertion``: None = when ops x devices <= 200000)."""

    name = "heft"

    def __init__(self, *, insertion: bool | None = None, **options):
        super().__init__(**options)
        self.insertion = insertion

    def place(self, problem) -> np.ndarray:
        ctx = context(problem)
        n, D = ctx.n, ctx.D
        rank = ctx.blevel()
        order = sorted(range(n), key=lambda i: (-rank[i], i))
        insertion = self.insertion if self.insertion is not None else n * D <= 200_000
        dev = np.full(n, -1, dtype=np.int64)
        finish = np.zeros(n)
        avail = np.zeros(D)
        starts: list[list[float]] = [[] for _ in range(D)]
        ends: list[list[float]] = [[] for _ in range(D)]
        ledger = MemoryLedger(ctx)
        group_dev: dict[int, int] = {}
        for i in order:
            ready = _ready_times(ctx, i, dev, finish)
            dur = ctx.time[i]
            if insertion:
                est = np.array([_gap(starts[d], ends[d], ready[d], dur[d]) for d in range(D)])
            else:
                est = np.maximum(ready, avail)
            eft = est + dur
            g = int(ctx.coloc_of[i])
            if g in group_dev:
                d = group_dev[g]
            else:
                fits = ledger.fits(i, dev)
                d = int(np.argmin(np.where(fits, eft, np.inf))) if fits.any() \
                    else _fallback(ledger, i, dev)
                if g >= 0:
                    group_dev[g] = d
            ledger.add(i, d, dev)
            dev[i] = d
            finish[i] = eft[d]
            avail[d] = max(avail[d], eft[d])
            if insertion:
                k = bisect.bisect_left(starts[d], est[d])
                starts[d].insert(k, float(est[d]))
                ends[d].insert(k, float(eft[d]))
        return dev


def _gap(starts: list, ends: list, ready: float, dur: float) -> float:
    """Earliest start >= ``ready`` of a ``dur`` long slot between the busy
    intervals ``[starts[k], ends[k])`` (sorted, disjoint)."""
    k = bisect.bisect_right(ends, ready)
    t = ready
    while k < len(starts):
        if t + dur <= starts[k]:
            return t
        t = max(t, ends[k])
        k += 1
    return t


class _ETFBase(_ListScheduler):
    """Earliest Task First (Hwang et al., 1989) with Baechi's memory rule:
    repeatedly place the ready (op, device) pair that can start earliest,
    ties to the op with the larger static level, among devices where the op
    fits in memory."""

    def urgent(self, ctx) -> np.ndarray | None:
        """Favourite child of each op (-1: none); None for plain ETF."""
        return None

    def place(self, problem) -> np.ndarray:
        ctx = context(problem)
        n, D = ctx.n, ctx.D
        level = ctx.blevel()
        fav = self.urgent(ctx)
        dev = np.full(n, -1, dtype=np.int64)
        finish = np.zeros(n)
        avail = np.zeros(D)
        last = np.full(D, -1, dtype=np.int64)           # last op placed on each device
        waiting = np.diff(ctx.pred_ptr).astype(np.int64)
        ready: list[int] = [i for i in range(n) if waiting[i] == 0]
        rtime: dict[int, np.ndarray] = {i: np.zeros(D) for i in ready}
        ledger = MemoryLedger(ctx)
        group_dev: dict[int, int] = {}
        for _ in range(n):
            R = np.array(ready, dtype=np.int64)
            est = np.maximum(np.stack([rtime[i] for i in ready]), avail[None, :])
            allowed = np.zeros((len(R), D), dtype=bool)
            for k, i in enumerate(ready):
                g = int(ctx.coloc_of[i])
                if g in group_dev:
                    allowed[k, group_dev[g]] = True
                else:
                    allowed[k] = ledger.fits(i, dev)
            prefer = np.zeros((len(R), D), dtype=bool)
            if fav is not None:
                # SCT: a device whose last op's favourite child is ready
                # serves that child next
                pos = {i: k for k, i in enumerate(ready)}
                for d in range(D):
                    j = fav[last[d]] if last[d] >= 0 else -1
                    if j >= 0 and j in pos and allowed[pos[j], d]:
                        keep = allowed[pos[j], d]
                        allowed[:, d] = False
                        allowed[pos[j], d] = keep
                        prefer[pos[j], d] = True
            placeable = allowed.any(axis=1)
            if placeable.any():
                key = np.where(allowed, est, np.inf)
                best = key.min()
                tie = np.isclose(key, best, rtol=1e-12, atol=0.0) & allowed
                rows, cols = np.nonzero(tie)
                # ties: urgent pair first, then higher static level, then order
                pick = min(range(len(rows)), key=lambda t: (not prefer[rows[t], cols[t]],
                                                            -level[R[rows[t]]], R[rows[t]],
                                                            cols[t]))
                k, d = int(rows[pick]), int(cols[pick])
                i = int(R[k])
            else:
                # nothing fits anywhere: the ready op of highest level goes
                # where most memory is left
                k = int(min(range(len(R)), key=lambda t: (-level[R[t]], R[t])))
                i = int(R[k])
                g = int(ctx.coloc_of[i])
                d = group_dev.get(g, _fallback(ledger, i, dev))
            g = int(ctx.coloc_of[i])
            if g >= 0 and g not in group_dev:
                group_dev[g] = d
            start = est[k, d]
            ledger.add(i, d, dev)
            dev[i] = d
            finish[i] = start + ctx.time[i, d]
            avail[d] = finish[i]
            last[d] = i
            ready.pop(k)
            del rtime[i]
            succ, _ = ctx.succs(i)
            for j in succ.tolist():
                waiting[j] -= 1
                if waiting[j] == 0:
                    ready.append(j)
                    rtime[j] = _ready_times(ctx, j, dev, finish)
        return dev


@register_strategy
class METF(_ETFBase):
    """Baechi's m-ETF: memory-constrained Earliest Task First."""

    name = "m_etf"


@register_strategy
class MSCT(_ETFBase):
    """Baechi's m-SCT: memory-constrained Small Communication Time (Hanen
    and Munier's SCT): each op has at most one *favourite child* that should
    run right after it on the same device, and a device whose last op's
    favourite child is ready runs it next. SCT picks favourite children with
    a linear-programming relaxation; here a greedy maximum-weight matching
    of parents to children by the communication time their edge would cost
    (heaviest first, each op at most one favourite child and one favourite
    parent) stands in for it, which needs no LP solver."""

    name = "m_sct"

    def urgent(self, ctx) -> np.ndarray:
        p = ctx.p
        fav = np.full(ctx.n, -1, dtype=np.int64)
        if not p.n_edges:
            return fav
        lat, inv = ctx.mean_comm()
        cost = lat + p.edge_bytes * inv
        order = np.lexsort((p.edge_dst, p.edge_src, -cost))
        has_parent = np.zeros(ctx.n, dtype=bool)
        for e in order.tolist():
            u, v = int(p.edge_src[e]), int(p.edge_dst[e])
            if fav[u] < 0 and not has_parent[v]:
                fav[u] = v
                has_parent[v] = True
        return fav

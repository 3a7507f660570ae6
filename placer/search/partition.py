"""``partition``: balanced min-cut graph partitioning, one part per device.

Recursive bisection: the devices are halved (along site boundaries first,
so the cut that the refinement minimises falls on the slow links between
sites), the ops are split in proportion to the two halves' sustained
FLOP/s, and a boundary refinement moves ops across to cut fewer bytes while
keeping the split balanced and within memory. Two refinements:

- ``"acyclic"`` (default): Fiduccia-Mattheyses-style single moves that keep
  every edge between the halves pointing one way, so the quotient graph
  over devices is acyclic (a pipeline), as in acyclic DAG partitioners
  (Herrmann et al., dagP);
- ``"kl"``: networkx's Kernighan-Lin bisection on the undirected graph
  (swaps keep part sizes in ops; the quotient may have cycles, which the
  cost models handle).

Several device counts (powers of two, and all devices, taking devices in
:func:`placer.search.common.device_order`) are tried and the cost model
picks. Devices left over memory (by a conservative per-op bound) shed ops
to the devices they exchange most data with. Graphs larger than
``max_nodes`` (default 1000) are coarsened first.
"""

from __future__ import annotations

import numpy as np

from ..errors import StrategyError
from .base import Strategy, register_strategy
from .common import (Candidate, Coarse, choose, context, device_order, fix_colocation,
                     op_memory, repair_memory)
from .heuristics import stage_counts


@register_strategy
class Partition(Strategy):
    """Balanced min-cut partition weighted by device speed (see the module
    doc). Options: ``refine`` (``"acyclic"`` or ``"kl"``), ``passes``
    (refinement passes per bisection), ``imbalance`` (allowed excess of a
    half's time over its share), ``max_nodes``."""

    name = "partition"

    def __init__(self, *, refine: str = "acyclic", passes: int = 6, imbalance: float = 0.05,
                 max_nodes: int | None = 1000, **options):
        super().__init__(**options)
        if refine not in ("acyclic", "kl"):
            raise StrategyError(f"unknown refine {refine!r}", field="refine",
                                fix="use 'acyclic' or 'kl'")
        self.refine, self.passes, self.imbalance = refine, int(passes), float(imbalance)
        self.max_nodes = max_nodes

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        coarse = Coarse(problem, self.max_nodes)
        cp = coarse.problem
        order = device_order(problem)
        rng = np.random.default_rng([5, seed])
        cands = []
        for k in stage_counts(problem.n_devices, cp.n_ops):
            if cands and budget.exhausted():
                break
            devices = order[:k]
            assign = repair_memory(context(cp), self.partition(cp, devices, rng))
            assign = fix_colocation(context(problem), coarse.expand(assign))
            cands.append(Candidate(assign, origin=f"{k} parts"))
        plan, report, _ = choose(self, problem, cost_model, budget, cands, keep=2,
                                 progress=progress)
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)

    # --- recursive bisection ----------------------------------------------------
    def partition(self, problem, devices: list[int], rng: np.random.Generator) -> np.ndarray:
        """Device index of each op of ``problem`` over ``devices``."""
        ctx = context(problem)
        out = np.full(problem.n_ops, devices[0], dtype=np.int64)
        self._mem = op_memory(ctx)
        self._split(ctx, np.arange(problem.n_ops), list(devices), out, rng)
        return out

    def _split(self, ctx, ops: np.ndarray, devices: list[int], out: np.ndarray, rng) -> None:
        if len(devices) == 1 or len(ops) == 0:
            out[ops] = devices[0]
            return
        left, right = _halve(ctx.p, devices)
        if len(ops) == 1:
            out[ops] = left[0]
            return
        rate = ctx.p.rate
        ra, rb = rate[left].sum(), rate[right].sum()
        cap_a = ctx.p.memory[left].sum() - ctx.ws.max() * len(left)
        cap_b = ctx.p.memory[right].sum() - ctx.ws.max() * len(right)
        side = self._initial(ctx, ops, ra / (ra + rb), cap_a, cap_b)
        if self.refine == "kl":
            side = self._kl(ctx, ops, side, rng)
        else:
            side = self._fm(ctx, ops, side, ra, rb, cap_a, cap_b)
        self._split(ctx, ops[side == 0], left, out, rng)
        self._split(ctx, ops[side == 1], right, out, rng)

    def _initial(self, ctx, ops, frac, cap_a, cap_b) -> np.ndarray:
        """A topological prefix with ``frac`` of the compute (moved so both
        halves fit their memory when possible)."""
        w = ctx.work[ops]
        mem = self._mem[ops]
        cw = np.cumsum(w)
        cm = np.cumsum(mem)
        total_m = cm[-1]
        k = int(np.searchsorted(cw, frac * cw[-1]))
        k = min(max(k, 0), len(ops) - 1)      # ops[:k+1] form the prefix
        lo = int(np.searchsorted(cm, total_m - cap_b)) if total_m > cap_b else 0
        hi = int(np.searchsorted(cm, cap_a, side="right")) - 1
        if lo <= hi:
            k = min(max(k, lo), hi)
        side = np.ones(len(ops), dtype=np.int64)
        side[:k + 1] = 0
        if side.all() or not side.any():
            side[:] = 1
            side[0] = 0
        return side

    def _fm(self, ctx, ops, side, ra, rb, cap_a, cap_b) -> np.ndarray:
        """Single-op moves across the boundary that cut fewer bytes, keep
        all edges between the halves pointing from half 0 to half 1, the
        time balance within ``imbalance`` and the memory within capacity."""
        local = {int(o): k for k, o in enumerate(ops)}
        preds, succs = [], []
        for o in ops.tolist():
            p, pb = ctx.preds(o)
            s, sb = ctx.succs(o)
            preds.append([(local[int(x)], float(b)) for x, b in zip(p, pb) if int(x) in local])
            succs.append([(local[int(x)], float(b)) for x, b in zip(s, sb) if int(x) in local])
        w = ctx.work[ops]
        mem = self._mem[ops]
        load = np.array([w[side == 0].sum(), w[side == 1].sum()])
        used = np.array([mem[side == 0].sum(), mem[side == 1].sum()])
        rate = np.array([ra, rb])
        cap = np.array([cap_a, cap_b])
        limit = (1.0 + self.imbalance) * w.sum() / (ra + rb)

        def gain(k: int) -> float | None:
            s = side[k]
            if s == 0:   # to half 1: every consumer must already be there
                if any(side[x] == 0 for x, _ in succs[k]):
                    return None
                return sum(b for _, b in succs[k]) - sum(b for x, b in preds[k] if side[x] == 0)
            if any(side[x] == 1 for x, _ in preds[k]):
                return None
            return sum(b for _, b in preds[k]) - sum(b for x, b in succs[k] if side[x] == 1)

        for _ in range(self.passes):
            moved = 0
            boundary = [k for k in range(len(ops))
                        if any(side[x] != side[k] for x, _ in preds[k] + succs[k])]
            scored = [(g, k) for k in boundary if (g := gain(k)) is not None and g > 0]
            scored.sort(key=lambda t: (-t[0], t[1]))
            for _, k in scored:
                g = gain(k)
                if g is None or g <= 0:
                    continue
                s, t = side[k], 1 - side[k]
                if load[s] - w[k] <= 0:
                    continue
                if (load[t] + w[k]) / rate[t] > limit and \
                        (load[t] + w[k]) / rate[t] > load[s] / rate[s]:
                    continue
                if used[t] + mem[k] > cap[t] and used[s] <= cap[s]:
                    continue
                side[k] = t
                load[s] -= w[k]
                load[t] += w[k]
                used[s] -= mem[k]
                used[t] += mem[k]
                moved += 1
            if not moved:
                break
        return side

    def _kl(self, ctx, ops, side, rng) -> np.ndarray:
        """networkx Kernighan-Lin on the undirected subgraph, from ``side``."""
        import networkx as nx
        from networkx.algorithms.community import kernighan_lin_bisection
        p = ctx.p
        members = set(ops.tolist())
        g = nx.Graph()
        g.add_nodes_from(ops.tolist())
        for u, v, b in zip(p.edge_src.tolist(), p.edge_dst.tolist(), p.edge_bytes.tolist()):
            if u in members and v in members:
                old = g.get_edge_data(u, v, {"weight": 0.0})["weight"]
                g.add_edge(u, v, weight=old + b + 1.0)
        a = {int(o) for o, s in zip(ops, side) if s == 0}
        b = members - a
        if not a or not b:
            return side
        seed = int(rng.integers(2 ** 31))
        part_a, _ = kernighan_lin_bisection(g, partition=(a, b), max_iter=self.passes,
                                            weight="weight", seed=seed)
        return np.array([0 if int(o) in part_a else 1 for o in ops], dtype=np.int64)


def _halve(problem, devices: list[int]) -> tuple[list[int], list[int]]:
    """Split devices in two halves of about equal FLOP/s, keeping sites whole
    when there are several."""
    rate = problem.rate
    by_site: dict[int, list[int]] = {}
    for d in devices:
        by_site.setdefault(int(problem.site[d]), []).append(d)
    units = list(by_site.values()) if len(by_site) > 1 else [[d] for d in devices]
    total = sum(rate[u].sum() for u in units)
    acc, cut = 0.0, 1
    best = None
    for k in range(1, len(units)):
        acc += rate[units[k - 1]].sum()
        diff = abs(acc - total / 2)
        if best is None or diff < best:
            best, cut = diff, k
    left = [d for u in units[:cut] for d in u]
    right = [d for u in units[cut:] for d in u]
    return left, right

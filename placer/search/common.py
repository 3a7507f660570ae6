"""Pieces the heuristics share: per-problem arrays, colocation, a
conservative memory ledger, contiguous splits, coarsening and picking the
microbatch count and schedule with the cost model.

Everything works on *assignments* (:mod:`placer.search.arrays`): an int
array indexed like ``problem.ids`` (topological order) whose values are
device indices, or ``D + k`` for the k-th data-parallel group of a
candidate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..cost import Problem
from .arrays import PlanArrays
from .ranker import (RankPolicy, SimulationClock, final_ranker, rank,  # noqa: F401 (old home)
                     score_finalists)

if TYPE_CHECKING:
    from ..cost import CostModel, Report
    from ..graph import Graph
    from ..plan import Plan
    from .base import Budget, Strategy


class Context:
    """Arrays of one problem that the heuristics need, built once per problem
    (see :func:`context`)."""

    def __init__(self, p: Problem):
        self.p = p
        n, D = p.n_ops, p.n_devices
        self.n, self.D = n, D
        self.phases = 2.0 if p.training else 1.0
        self.work = p.flops + (p.bwd_flops if p.training else 0.0)
        if p.training and p.recompute:
            self.work = self.work + p.flops
        # compute seconds of each op on each device, one whole training step
        self.time = self.work[:, None] / p.rate[None, :] + p.op_overhead * self.phases
        src, dst, b = p.edge_src, p.edge_dst, p.edge_bytes
        order = np.argsort(dst, kind="stable")
        self.pred_ptr = np.r_[0, np.cumsum(np.bincount(dst, minlength=n))].astype(np.int64)
        self.pred_idx = src[order]
        self.pred_bytes = b[order]
        order = np.argsort(src, kind="stable")
        self.succ_ptr = np.r_[0, np.cumsum(np.bincount(src, minlength=n))].astype(np.int64)
        self.succ_idx = dst[order]
        self.succ_bytes = b[order]
        self.in_bytes = np.bincount(dst, b, minlength=n) if len(b) else np.zeros(n)
        # memory that stays with an op on its device for the whole step
        if p.training:
            self.state = p.param_bytes * (1.0 + p.gradient_bytes_per_param
                                          + p.optimizer_bytes_per_param)
            self.act = np.zeros(n) if p.recompute else p.output_bytes.copy()
        else:
            self.state = p.param_bytes.copy()
            self.act = np.zeros(n)
        self.ws = p.workspace_bytes
        speed = np.minimum(p.bandwidth, np.minimum(p.nic_bandwidth[:, None],
                                                   p.nic_bandwidth[None, :]))
        self.inv_bw = 1.0 / speed
        np.fill_diagonal(self.inv_bw, 0.0)
        self.latency = p.latency
        # colocation groups as index arrays
        index = p.index
        self.coloc: list[np.ndarray] = []
        self.coloc_of = np.full(n, -1, dtype=np.int64)
        for members in p.graph.colocation_groups().values():
            if len(members) > 1:
                idx = np.array(sorted(index[m] for m in members), dtype=np.int64)
                self.coloc_of[idx] = len(self.coloc)
                self.coloc.append(idx)
        self.coloc_state = np.array([self.state[g].sum() for g in self.coloc])
        self._blevel = None

    def preds(self, i: int):
        a, b = self.pred_ptr[i], self.pred_ptr[i + 1]
        return self.pred_idx[a:b], self.pred_bytes[a:b]

    def succs(self, i: int):
        a, b = self.succ_ptr[i], self.succ_ptr[i + 1]
        return self.succ_idx[a:b], self.succ_bytes[a:b]

    def comm_from(self, src_dev: int, nbytes: float) -> np.ndarray:
        """Seconds (both phases) to send ``nbytes`` from ``src_dev`` to every device."""
        return self.phases * np.where(np.arange(self.D) == src_dev, 0.0,
                                      self.latency[src_dev] + nbytes * self.inv_bw[src_dev])

    def mean_comm(self) -> tuple[float, float]:
        """Mean latency and mean seconds per byte over distinct device pairs."""
        D = self.D
        if D < 2:
            return 0.0, 0.0
        off = ~np.eye(D, dtype=bool)
        return float(self.latency[off].mean()), float(self.inv_bw[off].mean())

    def blevel(self) -> np.ndarray:
        """HEFT's upward rank: mean compute time plus the longest path of mean
        compute and communication times to an exit op."""
        if self._blevel is None:
            lat, inv = self.mean_comm()
            w = self.time.mean(axis=1)
            rank = np.zeros(self.n)
            for i in range(self.n - 1, -1, -1):
                s, b = self.succs(i)
                tail = (rank[s] + self.phases * (lat + b * inv)).max() if len(s) else 0.0
                rank[i] = w[i] + tail
            self._blevel = rank
        return self._blevel


def context(problem: Problem) -> Context:
    """The cached :class:`Context` of ``problem``."""
    return problem.cache.get_or_build("search.context", lambda: Context(problem))


def problem_like(problem: Problem, graph: "Graph") -> Problem:
    """A problem over ``graph`` with ``problem``'s cluster and options."""
    return problem.replace(graph)


class Coarse:
    """``problem`` coarsened to at most ``max_nodes`` ops (or itself when
    small enough); :meth:`expand` maps an assignment back."""

    def __init__(self, problem: Problem, max_nodes: int | None):
        self.fine = problem
        if max_nodes is None or problem.n_ops <= max_nodes:
            self.problem, self.graph, self.members = problem, None, None
            return
        self.graph = problem.graph.coarsen(int(max_nodes))
        self.problem = problem_like(problem, self.graph)
        index = problem.index
        groups = self.graph.subgraph_members()
        self.members = [np.array([index[m] for m in groups[g]], dtype=np.int64)
                        for g in self.problem.ids]

    def expand(self, assign: np.ndarray) -> np.ndarray:
        """An assignment over the coarse problem's ops -> over the fine ones."""
        if self.members is None:
            return np.asarray(assign, dtype=np.int64)
        out = np.empty(self.fine.n_ops, dtype=np.int64)
        for j, idx in enumerate(self.members):
            out[idx] = assign[j]
        return out


def fix_colocation(ctx: Context, assign: np.ndarray) -> np.ndarray:
    """Put every colocation group where most of its compute (then its first
    op) already is; returns the (copied) assignment."""
    if not ctx.coloc:
        return assign
    assign = np.array(assign, dtype=np.int64)
    for idx in ctx.coloc:
        values = assign[idx]
        weight: dict[int, float] = {}
        for v, w in zip(values.tolist(), (ctx.work[idx] + 1.0).tolist()):
            weight[v] = weight.get(v, 0.0) + w
        best = max(weight, key=lambda v: (weight[v], -list(values).index(v)))
        assign[idx] = best
    return assign


class MemoryLedger:
    """Bytes committed per device while ops are placed one at a time on
    single devices, an upper bound of the cost models' peak memory: every
    op's parameter state and whole-batch activations, every input received
    from another device, and the largest op workspace. A plan built within
    the ledger is feasible under either cost model."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.cap = ctx.p.memory.astype(float)
        self.used = np.zeros(ctx.D)
        self.ws = np.zeros(ctx.D)
        self.placed_groups: set[int] = set()

    def demand(self, i: int, dev: np.ndarray) -> np.ndarray:
        """Bytes op ``i`` would add on each device (given where its
        predecessors are, ``dev``), the rest of its colocation group's state
        included when it is the group's first op."""
        c = self.ctx
        preds, nbytes = c.preds(i)
        local = np.bincount(dev[preds], nbytes, minlength=c.D) if len(preds) else np.zeros(c.D)
        recv = c.in_bytes[i] - local
        g = c.coloc_of[i]
        state = c.coloc_state[g] if g >= 0 and g not in self.placed_groups else \
            (0.0 if g >= 0 else c.state[i])
        return state + c.act[i] + recv + np.maximum(self.ws, c.ws[i]) - self.ws

    def fits(self, i: int, dev: np.ndarray) -> np.ndarray:
        """Bool per device: op ``i`` fits there."""
        return self.used + self.demand(i, dev) <= self.cap * (1 - 1e-9)

    def add(self, i: int, d: int, dev: np.ndarray) -> None:
        self.used[d] += self.demand(i, dev)[d]
        self.ws[d] = max(self.ws[d], self.ctx.ws[i])
        g = self.ctx.coloc_of[i]
        if g >= 0:
            self.placed_groups.add(int(g))

    def free(self) -> np.ndarray:
        return self.cap - self.used


def op_memory(ctx: Context) -> np.ndarray:
    """Conservative bytes per op when each op may receive all its inputs from
    another device (for contiguous splits)."""
    return ctx.state + ctx.act + ctx.in_bytes


def contiguous_split(work: np.ndarray, mem: np.ndarray, rate: np.ndarray,
                     cap: np.ndarray) -> np.ndarray:
    """Cut a sequence of ops into contiguous runs on devices ``0..S-1`` in
    order, minimising the largest ``work / rate`` of a device while each
    run's ``mem`` fits its ``cap`` (memory is ignored if it cannot fit).
    Returns the device of each op; later devices may stay empty.

    >>> contiguous_split(np.ones(6), np.zeros(6), np.array([1.0, 2.0]),
    ...                  np.array([1.0, 1.0])).tolist()
    [0, 0, 1, 1, 1, 1]
    """
    n, S = len(work), len(rate)
    cw = np.r_[0.0, np.cumsum(work)]
    cm = np.r_[0.0, np.cumsum(mem)]

    def pack(T: float, use_mem: bool):
        ends = []
        s = 0
        for k in range(S):
            e_time = int(np.searchsorted(cw, cw[s] + T * rate[k] * (1 + 1e-12), side="right")) - 1
            e = e_time
            if use_mem:
                e_mem = int(np.searchsorted(cm, cm[s] + cap[k], side="right")) - 1
                e = min(e, e_mem)
            e = max(e, s)
            ends.append(e)
            s = e
            if s >= n:
                break
        return ends if s >= n else None

    for use_mem in (True, False):
        hi = cw[-1] / rate.min() + 1e-300
        if pack(hi, use_mem) is None:
            continue
        lo = 0.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if pack(mid, use_mem) is not None:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-9 * hi:
                break
        ends = pack(hi, use_mem)
        out = np.empty(n, dtype=np.int64)
        s = 0
        for k, e in enumerate(ends):
            out[s:e] = k
            s = e
        return out
    return np.minimum(np.arange(n) * S // max(n, 1), S - 1)


def device_order(problem: Problem) -> list[int]:
    """Devices grouped by site (sites by total sustained FLOP/s, fastest
    first), fastest devices first inside a site; so a prefix of this order
    is a good set of devices to use, and neighbours share fast links."""
    rate = problem.rate
    sites: dict[int, list[int]] = {}
    for d in range(problem.n_devices):
        sites.setdefault(int(problem.site[d]), []).append(d)
    ordered = sorted(sites.values(), key=lambda ds: -rate[ds].sum())
    return [d for ds in ordered for d in sorted(ds, key=lambda d: -rate[d])]


#: an assignment a heuristic hands :func:`choose` (``microbatches``: the
#: counts it may be scored at, None: any)
Candidate = PlanArrays


def choose(strategy: "Strategy", problem: Problem, cost_model: "CostModel",
           budget: "Budget", candidates: Sequence[Candidate], *,
           first: Sequence[tuple[int, str]] | None = None, keep: int = 2,
           progress=None) -> tuple["Plan", "Report", Candidate]:
    """Score ``candidates`` with the cost model and return the best as a
    plan with its report, choosing microbatches and schedule.

    First every candidate is scored at the settings ``first`` (default: a
    middle and the largest microbatch count under the first schedule); then the best
    ``keep`` candidates (the finalists) at every allowed count and schedule,
    the best score winning. Stops early when the budget is spent, keeping
    the evaluations :class:`~placer.search.ranker.RankPolicy` keeps after a
    ranking: one for the final report and one per initial plan (the first
    score is always made).
    """
    ms_all = strategy.microbatch_choices(problem)
    scheds = strategy.schedule_choices()
    D = problem.n_devices

    def settings(c: Candidate):
        ms = [m for m in ms_all if c.microbatches is None or m in c.microbatches] or \
            list(c.microbatches or ms_all)
        return ms, scheds

    def middle(ms):
        return 4 if 4 in ms else ms[len(ms) // 2]

    scores: dict[tuple[int, int, str], float] = {}
    policy = RankPolicy(keep=1 + len(strategy.initial), until="spent")

    def score(keys: list[tuple[int, int, str]]) -> None:
        """Score candidate ``ci`` at ``m`` microbatches and schedule ``s``
        for each ``(ci, m, s)`` of ``keys`` not scored yet, in order, as
        the ranking scores finalists (after the first score, only while
        the budget keeps ``policy.keep`` evaluations)."""
        keys = [k for k in dict.fromkeys(keys) if k not in scores]
        if not keys or (scores and budget.allow(policy.keep + 1) < policy.keep + 1):
            return
        rows = [candidates[ci].replace(microbatches=m, schedule=s) for ci, m, s in keys]
        scores.update(zip(keys, score_finalists(cost_model, problem, rows, budget,
                                                policy=policy)))

    screening: list[tuple[int, int, str]] = []
    for ci, c in enumerate(candidates):
        ms, ss = settings(c)
        # the most microbatches keep the least activation memory, so a
        # candidate feasible only there is not dropped early
        default = [(middle(ms), ss[0]), (ms[-1], ss[0])]
        combos = [(m, s) for m, s in (first or default) if m in ms and s in ss] \
            or [(middle(ms), ss[0])]
        screening += [(ci, m, s) for m, s in combos]
    score(screening)
    ranked = sorted({ci for ci, _, _ in scores},
                    key=lambda ci: min(v for k, v in scores.items() if k[0] == ci))
    score([(ci, m, s) for ci in ranked[:keep]
           for ms, ss in [settings(candidates[ci])] for s in ss for m in ms])
    (ci, m, s), _ = min(scores.items(), key=lambda kv: (kv[1], kv[0][0], kv[0][1]))
    c = candidates[ci]
    plan = c.replace(microbatches=m, schedule=s).to_plan(problem, strategy.name)
    report = cost_model.estimate(problem, plan)
    if progress is not None:
        strategy.report(progress, budget, report, c.label)
    return plan, report, c



def repair_memory(ctx: Context, assign: np.ndarray) -> np.ndarray:
    """Move ops off devices over their memory (by the conservative
    per-op bound of :func:`op_memory`) onto the device whose ops they talk
    to most and that has room, else the one with the most room; colocation
    groups move together. Single-device assignments only; returns a copy."""
    assign = np.array(assign, dtype=np.int64)
    D = ctx.D
    mem = op_memory(ctx)
    cap = ctx.p.memory - ctx.ws.max()
    used = np.bincount(assign, mem, minlength=D)
    units: list[np.ndarray] = []
    seen = set()
    for i in range(ctx.n):
        g = int(ctx.coloc_of[i])
        if g < 0:
            units.append(np.array([i]))
        elif g not in seen:
            seen.add(g)
            units.append(ctx.coloc[g])
    for d in np.argsort(-(used - cap)).tolist():
        if used[d] <= cap[d]:
            continue
        mine = [u for u in units if assign[u[0]] == d]
        # the biggest units go first, so few moves are needed
        mine.sort(key=lambda u: (-mem[u].sum(), int(u[0])))
        for u in mine:
            if used[d] <= cap[d]:
                break
            need = mem[u].sum()
            room = cap - used
            room[d] = -np.inf
            if not (room >= need).any():
                continue
            talk = np.zeros(D)
            for i in u.tolist():
                for nb, b in zip(*ctx.preds(i)):
                    talk[assign[nb]] += b
                for nb, b in zip(*ctx.succs(i)):
                    talk[assign[nb]] += b
            ok = room >= need
            target = int(np.argmax(np.where(ok, talk + 1e-9 * room / max(room.max(), 1), -np.inf)))
            assign[u] = target
            used[d] -= need
            used[target] += need
    return assign


#: seconds per (op x device) a seeding heuristic takes, placing and
#: scoring its candidates, before this process has timed it (measured on
#: 10,000 ops x 64 devices, a busy 2-core host); :func:`seed_seconds`
SEED_SECONDS_PER_OP_DEVICE = {"heft": 5e-6, "m_etf": 2e-6, "m_sct": 2.5e-6,
                              "partition": 1e-6, "pipeline_dp": 1e-6,
                              "even_pipeline": 5e-7, "m_topo": 3e-7, "single": 3e-7}
_SEED_RATES: dict[str, float] = {}


def seed_seconds(name: str, problem) -> float:
    """Predicted seconds of seeding heuristic ``name`` on ``problem``: its
    last measured rate in this process, else its prior
    (:data:`SEED_SECONDS_PER_OP_DEVICE`, 2e-6 for others) times how much
    slower than their priors the heuristics measured so far ran (a busy
    host slows them all), times ops x devices."""
    rate = _SEED_RATES.get(name)
    if rate is None:
        rate = SEED_SECONDS_PER_OP_DEVICE.get(name, 2e-6) * _SLOWDOWN[0]
    return rate * problem.n_ops * problem.n_devices


#: measured / prior rate of the last heuristic timed (at least 1)
_SLOWDOWN = [1.0]


def learn_seed_seconds(name: str, problem, seconds: float) -> None:
    """Record that heuristic ``name`` took ``seconds`` on ``problem``."""
    size = problem.n_ops * problem.n_devices
    if size >= 1e4:             # tiny problems time the call's overhead
        _SEED_RATES[name] = seconds / size
        _SLOWDOWN[0] = max(1.0, _SEED_RATES[name] /
                           SEED_SECONDS_PER_OP_DEVICE.get(name, 2e-6))

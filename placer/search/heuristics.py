"""Simple placement heuristics: ``single``, ``round_robin``,
``even_pipeline`` and Baechi's ``m_topo``.

Each builds one or a few assignments, keeps colocation groups together and
lets the cost model pick among them and choose the microbatch count and
schedule (see :func:`placer.search.common.choose`).

>>> import placer
>>> from placer.search import Budget, get_strategy
>>> from placer.cost import Problem, get_cost_model
>>> g = placer.datasets.layered(30, width=3, seed=0)
>>> problem = Problem(g, placer.Cluster.preset("two-sites"))
>>> plan = get_strategy("single").search(problem, get_cost_model("analytical"), Budget())
>>> plan.devices_used()
{'a0'}
"""

from __future__ import annotations

import numpy as np

from .base import Strategy, register_strategy
from .common import (Candidate, MemoryLedger, choose, context, contiguous_split,
                     fix_colocation, op_memory)


@register_strategy
class Single(Strategy):
    """Everything on the fastest device that fits (fastest overall when none
    does); the usual one-GPU baseline."""

    name = "single"

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        n, D = problem.n_ops, problem.n_devices
        order = sorted(range(D), key=lambda d: (-problem.rate[d], d))
        cands = [Candidate(np.full(n, d, dtype=np.int64), origin=problem.devices[d])
                 for d in order]
        ms = self.microbatch_choices(problem)
        s0 = self.schedule_choices()[0]
        # the most microbatches keep the least activation memory: try both ends
        plan, report, _ = choose(self, problem, cost_model, budget, cands,
                                 first=[(ms[0], s0), (ms[-1], s0)], keep=1, progress=progress)
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)


@register_strategy
class RoundRobin(Strategy):
    """Op i of the topological order on device ``i mod D`` (colocation
    groups kept together): the classic placement baseline. A device where
    the op would overflow memory (conservative ledger) is skipped."""

    name = "round_robin"

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        ctx = context(problem)
        n, D = problem.n_ops, problem.n_devices
        ledger = MemoryLedger(ctx)
        assign = np.full(n, -1, dtype=np.int64)
        group_dev: dict[int, int] = {}
        turn = 0
        for i in range(n):
            g = int(ctx.coloc_of[i])
            if g in group_dev:
                d = group_dev[g]
            else:
                fits = ledger.fits(i, assign)
                ring = (turn + np.arange(D)) % D
                ok = ring[fits[ring]]
                d = int(ok[0]) if len(ok) else int(np.argmax(ledger.free()
                                                             - ledger.demand(i, assign)))
                turn = (d + 1) % D
                if g >= 0:
                    group_dev[g] = d
            ledger.add(i, d, assign)
            assign[i] = d
        plan, report, _ = choose(self, problem, cost_model, budget, [Candidate(assign)],
                                 progress=progress)
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)


def stage_counts(D: int, n: int) -> list[int]:
    """Numbers of pipeline stages to try: powers of two below ``D``, and ``D``."""
    out = []
    k = 1
    while k < D:
        out.append(k)
        k *= 2
    out.append(D)
    return [k for k in out if k <= max(n, 1)] or [1]


@register_strategy
class EvenPipeline(Strategy):
    """Megatron-style pipeline: the topological order cut into contiguous
    stages on devices in cluster order, each stage's compute proportional to
    its speed (within its memory where possible): S stages of one device,
    and S stages of ``r`` data-parallel replicas each (the first ``S r``
    devices, ``r`` a power of two), so a model too large for S devices or a
    batch whose activations overflow them still gets a plan that fits. S is
    chosen among powers of two and D, and the shape, microbatch count and
    schedule with the cost model.

    Options: ``stages`` (fix S), ``replicas`` (fix r; 1: no data
    parallelism).
    """

    name = "even_pipeline"

    def __init__(self, *, stages: int | None = None, replicas: int | None = None, **options):
        super().__init__(**options)
        self.stages = stages
        self.replicas = replicas

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        plan, report, _ = choose(self, problem, cost_model, budget, self.candidates(problem),
                                 keep=2, progress=progress)
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)

    def candidates(self, problem) -> list[Candidate]:
        """One contiguous split per (stages, replicas) shape."""
        ctx = context(problem)
        D = problem.n_devices
        counts = [min(self.stages, D)] if self.stages else stage_counts(D, problem.n_ops)
        widths = [int(self.replicas)] if self.replicas else stage_counts(D, D)
        cands = []
        # one device per stage first: under a tight budget those are scored
        for r, S in ((r, S) for r in widths for S in counts if S * r <= D):
            blocks = np.arange(S * r).reshape(S, r)
            # replicas split the activations, not the parameter state
            mem = ctx.state + (ctx.act + ctx.in_bytes) / r
            rate = problem.rate[blocks].min(axis=1) * r
            cap = problem.memory[blocks].min(axis=1) - ctx.ws.max()
            stage = contiguous_split(ctx.work, mem, rate, cap)
            if r == 1:
                assign, groups = blocks[stage, 0], []
            else:
                groups = [tuple(b.tolist()) for b in blocks]
                assign = D + stage
            cands.append(Candidate(fix_colocation(ctx, assign), groups,
                                   origin=f"{S} stages x {r}"))
        return cands


@register_strategy
class MTopo(Strategy):
    """Baechi's m-TOPO (Jeon et al., SoCC 2020): walk the topological order
    and fill devices in cluster order, each up to its share of the total
    compute (by speed) or its memory, whichever comes first; an op that
    fits nowhere further on goes to the device with the most free memory.
    Colocated ops follow the first op of their group."""

    name = "m_topo"

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        ctx = context(problem)
        assign = self.place(problem)
        plan, report, _ = choose(self, problem, cost_model, budget,
                                 [Candidate(fix_colocation(ctx, assign))], progress=progress)
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)

    @staticmethod
    def place(problem) -> np.ndarray:
        ctx = context(problem)
        n, D = problem.n_ops, problem.n_devices
        ledger = MemoryLedger(ctx)
        share = ctx.work.sum() * problem.rate / problem.rate.sum()
        load = np.zeros(D)
        dev = np.full(n, -1, dtype=np.int64)
        group_dev: dict[int, int] = {}
        current = 0
        for i in range(n):
            g = int(ctx.coloc_of[i])
            if g in group_dev:
                d = group_dev[g]
            else:
                fits = ledger.fits(i, dev)
                d = -1
                k = current
                while k < D:
                    over = load[k] > 0 and load[k] + ctx.work[i] > share[k] * (1 + 1e-9)
                    if fits[k] and not over:
                        d = k
                        break
                    k += 1
                if d < 0:
                    later = np.flatnonzero(fits[current:]) + current
                    if len(later):
                        d = int(later[0])
                    else:
                        d = int(np.argmax(ledger.free() - ledger.demand(i, dev)))
                current = max(current, d) if d >= current else current
                if g >= 0:
                    group_dev[g] = d
            ledger.add(i, d, dev)
            load[d] += ctx.work[i]
            dev[i] = d
        return dev

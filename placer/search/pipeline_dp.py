"""``pipeline_dp``: Alpa-style inter-operator dynamic programming (Zheng et
al., OSDI 2022, Sec. 5.2) over contiguous stages and device blocks.

The space: the topological order is cut into ``L`` *layers* (contiguous
runs of about equal compute, at most ``max_layers``, by default 8 to 32 so the DP stays
fast on large clusters); devices are taken in
:func:`placer.search.common.device_order`. A plan is a sequence of stages,
stage j running layers ``s_j..e_j`` data-parallel on the next ``k_j``
devices of that order (block sizes from ``sizes``: all of 1..D for up to 8
devices, else powers of two); the first block may start anywhere, and
devices before the first and after the last block stay unused.

Each stage has two times per microbatch (:meth:`Space.stage_times`), as
the cost models see it: its *fill* ``f_j``, what one microbatch spends in
it (forward and backward compute of one replica's share on the block's
slowest device, plus receiving its inputs from earlier stages over the link
from the previous device: latency + bytes / bandwidth, both phases), and
its *busy* time ``b_j``, how long its most loaded resource is held per
microbatch in steady state: the compute or the link, whichever is longer,
since the link moves the next microbatch's tensors while the devices
compute (latency holds no resource). Both carry the all-reduce of the
stage's parameters spread over the microbatches. A stage that overflows
memory (parameter state and the whole batch's activations per replica
under 1F1B, a conservative bound) is impossible. A plan costs Alpa's

    T = sum_j f_j + (m - 1) * max_j b_j

and the DP finds the minimum exactly: for each candidate ``t_max`` (every
distinct busy time from the smallest feasible one, ascending, stopping
once ``(m - 1) * t_max`` cannot beat the best; an even subsample of
``tmax_candidates`` of them when there are more, the only inexact case), it
minimises ``sum f_j`` with every ``b_j <= t_max``. This is done for every
allowed microbatch count; the cost model then picks among the optima and
the schedules.
"""

from __future__ import annotations

import numpy as np

from ..cost.collectives import allreduce_coefficients
from .base import Strategy, register_strategy
from .common import (Candidate, SimulationClock, choose, context, device_order,
                     fix_colocation)
from .heuristics import EvenPipeline


class Space:
    """The stages of one problem: layers, device order and stage times.

    ``stage_times(s, e, p, k, m)`` are the fill and busy times per
    microbatch of layers ``s..e`` on devices ``order[p:p+k]`` with ``m``
    microbatches (``inf`` when it does not fit in memory);
    :meth:`objective` prices a whole plan.
    """

    def __init__(self, problem, max_layers: int | None = None, sizes=None):
        ctx = context(problem)
        self.problem, self.ctx = problem, ctx
        n = problem.n_ops
        self.order = device_order(problem)
        D = self.D = problem.n_devices
        if sizes is None:
            sizes = list(range(1, D + 1)) if D <= 8 else \
                [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if k <= D]
        self.sizes = sorted(set(int(k) for k in sizes if 1 <= k <= D))
        if max_layers is None:
            # the DP costs about layers^2 x positions x sizes per t_max
            max_layers = int(np.clip(np.sqrt(1e5 / (D * len(self.sizes))), 8, 32))
        # layers: contiguous runs of the topological order with similar compute
        L = max(1, min(max_layers, n))
        if L == n:
            bounds = np.arange(n + 1)
        else:
            cw = np.cumsum(ctx.work + 1e-30)
            cuts = np.searchsorted(cw, cw[-1] * np.arange(1, L) / L, side="left") + 1
            bounds = np.unique(np.r_[0, np.clip(cuts, 1, n - 1), n])
        self.bounds = bounds
        self.L = len(bounds) - 1
        self.layer_of = np.repeat(np.arange(self.L), np.diff(bounds))
        L = self.L
        lay = self.layer_of

        def per_layer(x):
            return np.bincount(lay, x, minlength=L)

        self.work = per_layer(ctx.work)
        self.count = np.bincount(lay, minlength=L).astype(float)
        self.state = per_layer(ctx.state)
        self.params = per_layer(problem.param_bytes)
        self.act = per_layer(ctx.act)
        self.ws = np.zeros(L)
        np.maximum.at(self.ws, lay, ctx.ws)
        # bytes from layer a into layer b (a < b)
        C = np.zeros((L, L))
        if problem.n_edges:
            np.add.at(C, (lay[problem.edge_src], lay[problem.edge_dst]), problem.edge_bytes)
        np.fill_diagonal(C, 0.0)
        self.cross = C
        o = np.array(self.order)
        self.rate = problem.rate[o]
        self.memory = problem.memory[o]
        self.lat = problem.latency[np.ix_(o, o)]
        self.inv_bw = ctx.inv_bw[np.ix_(o, o)]
        self._ar: dict = {}

    # --- stage costs ------------------------------------------------------------
    def bytes_in(self, s: int, e: int) -> float:
        """Bytes layers ``s..e`` receive from layers before ``s``."""
        return float(self.cross[:s, s:e + 1].sum())

    def allreduce(self, p: int, k: int, nbytes: float) -> float:
        """All-reduce seconds of ``nbytes`` over devices ``order[p:p+k]``."""
        if k < 2 or nbytes <= 0 or not self.problem.training:
            return 0.0
        key = (p, k)
        coef = self._ar.get(key)
        if coef is None:
            pr = self.problem
            devices = tuple(sorted(self.order[p:p + k]))
            coef = self._ar[key] = allreduce_coefficients(devices, pr.bandwidth, pr.latency,
                                                          pr.nic_bandwidth, pr.site)
        return float(min(coef[0] + coef[1] * nbytes, coef[2] + coef[3] * nbytes))

    def held(self, p, m: int, e=None):
        """Fraction of the batch's activations a stage starting at device
        position ``p`` (and ending at layer ``e``) keeps under 1F1B: at most
        one microbatch per stage from it to the end, and there are at most
        ``D - p`` of those, nor more than the ``L - e`` layers left."""
        left = self.D - np.asarray(p)
        if e is not None:
            left = np.minimum(left, self.L - np.asarray(e))
        return np.minimum(m, left) / m

    def stage_times(self, s: int, e: int, p: int, k: int, m: int) -> tuple[float, float]:
        """(fill, busy) seconds per microbatch of stage (layers ``s..e``,
        devices ``order[p:p+k]``) with ``m`` microbatches; ``(inf, inf)``
        if over memory."""
        ctx = self.ctx
        sl = slice(s, e + 1)
        block = slice(p, p + k)
        rin = self.bytes_in(s, e)
        mem = self.state[sl].sum() + (self.act[sl].sum() + rin) / k * self.held(p, m, e) \
            + self.ws[sl].max()
        if mem > self.memory[block].min():
            return float("inf"), float("inf")
        comp = self.work[sl].sum() / (m * k * self.rate[block].min()) \
            + self.count[sl].sum() * self.problem.op_overhead * ctx.phases
        lat = xfer = 0.0
        if rin > 0 and p > 0:
            lat = ctx.phases * self.lat[p - 1, block].max()
            xfer = ctx.phases * rin / (m * k) * self.inv_bw[p - 1, block].max()
        ar = self.allreduce(p, k, self.params[sl].sum()) / m
        return comp + lat + xfer + ar, max(comp, xfer) + ar

    def _parts(self):
        """Stage times as ``A + B / m`` pieces for every (s, e, p, size
        index) (compute ``Ac + Bc / m``, latency ``Al``, transfer ``Bx / m``,
        all-reduce ``Br / m``) and what fits in memory; computed once,
        vectorised over blocks."""
        if getattr(self, "_ab", None) is not None:
            return self._ab
        L, D, Q = self.L, self.D, len(self.sizes)
        ctx = self.ctx
        k = np.array(self.sizes, dtype=float)
        P = np.arange(D)[:, None]
        ok = P + k[None, :].astype(int) <= D                        # (D, Q)
        rmin = np.full((D, Q), np.inf)
        mmin = np.full((D, Q), 0.0)
        lat_in = np.zeros((D, Q))
        inv_in = np.zeros((D, Q))
        ar = np.zeros((D, Q, 4))
        for p in range(D):
            for q, size in enumerate(self.sizes):
                if p + size > D:
                    continue
                block = slice(p, p + size)
                rmin[p, q] = self.rate[block].min()
                mmin[p, q] = self.memory[block].min()
                if p > 0:
                    lat_in[p, q] = self.lat[p - 1, block].max()
                    inv_in[p, q] = self.inv_bw[p - 1, block].max()
                if size > 1 and self.problem.training:
                    pr = self.problem
                    devices = tuple(sorted(self.order[p:p + size]))
                    ar[p, q] = allreduce_coefficients(devices, pr.bandwidth, pr.latency,
                                                      pr.nic_bandwidth, pr.site)
        cwork = np.r_[0.0, np.cumsum(self.work)]
        ccount = np.r_[0.0, np.cumsum(self.count)]
        cstate = np.r_[0.0, np.cumsum(self.state)]
        cparams = np.r_[0.0, np.cumsum(self.params)]
        cact = np.r_[0.0, np.cumsum(self.act)]
        shape = (L, L, D, Q)
        parts = {name: np.full(shape, np.inf) for name in ("Ac", "Bc", "Al", "Bx", "Br")}
        M0 = np.zeros((L, L))
        M1 = np.zeros((L, L, Q))
        ovh = self.problem.op_overhead * ctx.phases
        first = (P > 0).astype(float)
        for s in range(L):
            ws = 0.0
            for e in range(s, L):
                ws = max(ws, self.ws[e])
                rin = self.bytes_in(s, e)
                work = cwork[e + 1] - cwork[s]
                M0[s, e] = (cstate[e + 1] - cstate[s]) + ws
                M1[s, e] = (cact[e + 1] - cact[s] + rin) / k
                params = cparams[e + 1] - cparams[s]
                if params > 0 and self.problem.training:
                    arr = np.minimum(ar[..., 0] + ar[..., 1] * params,
                                     ar[..., 2] + ar[..., 3] * params)
                else:
                    arr = np.zeros((D, Q))
                comm = rin > 0
                values = {"Ac": np.full((D, Q), (ccount[e + 1] - ccount[s]) * ovh),
                          "Bc": work / (k[None, :] * rmin),
                          "Al": ctx.phases * lat_in * first if comm else np.zeros((D, Q)),
                          "Bx": ctx.phases * rin / k[None, :] * inv_in * first if comm
                          else np.zeros((D, Q)),
                          "Br": arr}
                for name, v in values.items():
                    parts[name][s, e] = np.where(ok, v, np.inf)
        self._ab = (parts, M0, M1, mmin)
        return self._ab

    def table(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """All stage (fill, busy) times for ``m``: two arrays of shape (L, L,
        D, len(sizes)) indexed [s, e, p, size index]; ``inf`` where
        impossible (e < s, p + k > D, over memory). Equal to
        :meth:`stage_times` element by element."""
        parts, M0, M1, mmin = self._parts()
        h = self.held(np.arange(self.D)[None, :], m, np.arange(self.L)[:, None])  # (L, D)
        mem = M0[:, :, None, None] + M1[:, :, None, :] * h[None, :, :, None]
        fits = mem <= mmin[None, None]
        comp = parts["Ac"] + parts["Bc"] / m
        xfer = parts["Bx"] / m
        ar = parts["Br"] / m
        fill = np.where(fits, comp + parts["Al"] + xfer + ar, np.inf)
        busy = np.where(fits, np.maximum(comp, xfer) + ar, np.inf)
        return fill, busy

    @staticmethod
    def objective(fills, busies, m: int) -> float:
        """Alpa's pipeline latency ``sum fill + (m - 1) max busy``."""
        fills, busies = list(fills), list(busies)
        return float(sum(fills) + (m - 1) * max(busies)) if fills else float("inf")

    # --- the dynamic program ------------------------------------------------------
    def solve(self, m: int, tmax_candidates: int = 128):
        """Best stages for ``m`` microbatches: ``(objective, [(s, e, p, k), ...])``
        (``(inf, [])`` when nothing fits)."""
        F, Bt = self.table(m)
        finite = Bt[np.isfinite(Bt)]
        if not len(finite):
            return float("inf"), []
        values = np.unique(finite)
        # the smallest feasible t_max (feasibility is monotone in t_max)
        lo, hi = 0, len(values) - 1
        if not self._feasible(F, Bt, values[hi]):
            return float("inf"), []
        while lo < hi:
            mid = (lo + hi) // 2
            if self._feasible(F, Bt, values[mid]):
                hi = mid
            else:
                lo = mid + 1
        best, best_stages = float("inf"), []

        def run(tmaxes):
            nonlocal best, best_stages
            for stages in self._dp(F, Bt, tmaxes):
                if stages:
                    idx = [(s, e, p, self.sizes.index(k)) for s, e, p, k in stages]
                    obj = self.objective([F[i] for i in idx], [Bt[i] for i in idx], m)
                    if obj < best - 1e-15 * abs(obj):
                        best, best_stages = obj, stages

        run(values[lo:lo + 1])
        if m <= 1:          # one microbatch: only the fills count
            run(values[-1:])
            return best, best_stages
        # only t_max < best / (m - 1) can still win
        top = int(np.searchsorted(values, best / (m - 1), side="left"))
        window = np.arange(lo + 1, max(top, lo + 1))
        if len(window) > tmax_candidates:
            window = window[np.unique(np.linspace(0, len(window) - 1,
                                                  tmax_candidates).astype(int))]
        chunk = 64
        for a in range(0, len(window), chunk):
            idx = window[a:a + chunk]
            idx = idx[(m - 1) * values[idx] < best]
            if not len(idx):
                break
            run(values[idx])
        return best, best_stages

    def _feasible(self, F: np.ndarray, Bt: np.ndarray, tmax: float) -> bool:
        return bool(self._dp(F, Bt, np.array([tmax]))[0])

    def _dp(self, F: np.ndarray, Bt: np.ndarray, tmaxes) -> list:
        """For each ``t_max`` of ``tmaxes`` (a batch, solved together): the
        stages minimising the sum of fill times with every busy time <=
        t_max (an empty list when none exist)."""
        L, D = self.L, self.D
        tmaxes = np.asarray(tmaxes, dtype=float)
        K = len(tmaxes)
        sizes = np.array(self.sizes)
        Q = len(sizes)
        G = np.full((K, L + 1, D + 1), np.inf)
        G[:, L, :] = 0.0
        choice = np.full((K, L, D + 1), -1, dtype=np.int64)
        nxt_p = np.arange(D)[:, None] + sizes[None, :]            # (D, Q)
        valid = nxt_p <= D
        nxt_c = np.minimum(nxt_p, D)
        cap = tmaxes[:, None, None, None]
        for s in range(L - 1, -1, -1):
            # cand[k, e, p, q] = F[s, e, p, q] (if busy <= t_max_k) + G[k, e + 1, p + size_q]
            Fs = F[s, s:][None]
            Bs = Bt[s, s:][None]
            tail = G[:, s + 1:L + 1][:, :, nxt_c]                 # (K, L-s, D, Q)
            cand = np.where(Bs <= cap, Fs, np.inf) + np.where(valid[None, None], tail, np.inf)
            flat = cand.transpose(0, 2, 1, 3).reshape(K, D, -1)
            arg = flat.argmin(axis=2)
            G[:, s, :D] = np.take_along_axis(flat, arg[..., None], axis=2)[..., 0]
            choice[:, s, :D] = arg
        out = []
        for k in range(K):
            p0 = int(np.argmin(G[k, 0, :D]))
            if not np.isfinite(G[k, 0, p0]):
                out.append([])
                continue
            stages, s, p = [], 0, p0
            while s < L:
                a = int(choice[k, s, p])
                e, q = s + a // Q, a % Q
                size = int(sizes[q])
                stages.append((s, e, p, size))
                s, p = e + 1, p + size
            out.append(stages)
        return out

    def assignment(self, stages) -> Candidate:
        """The candidate (op -> group) of a list of stages."""
        D = self.D
        groups: list[tuple] = []
        layer_group = np.empty(self.L, dtype=np.int64)
        for s, e, p, k in stages:
            devs = tuple(sorted(self.order[p:p + k]))
            if k == 1:
                gid = devs[0]
            else:
                if devs not in groups:
                    groups.append(devs)
                gid = D + groups.index(devs)
            layer_group[s:e + 1] = gid
        return Candidate(layer_group[self.layer_of], groups)


@register_strategy
class PipelineDP(Strategy):
    """Alpa-style inter-operator DP over contiguous stages x device blocks
    with a data-parallel degree per stage (see the module doc). Options:
    ``max_layers`` (default: 8 to 32 by cluster size), ``sizes`` (allowed block sizes),
    ``tmax_candidates`` (default 128)."""

    name = "pipeline_dp"

    def __init__(self, *, max_layers: int | None = None, sizes=None,
                 tmax_candidates: int = 128, **options):
        super().__init__(**options)
        self.max_layers, self.sizes = max_layers, sizes
        self.tmax_candidates = int(tmax_candidates)

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        # the even split is a finalist (the DP's objective is an
        # approximation of the cost model: on dtfm-regional it once chose a
        # plan 5.7x slower than the even split), made first as it is cheap
        even = EvenPipeline(microbatches=self.microbatches, schedule=self.schedule)
        alt = choose(even, problem, cost_model, budget, even.candidates(problem), keep=2)[:2]
        space = Space(problem, self.max_layers, self.sizes)
        ctx = context(problem)
        cands = []
        for m in self.microbatch_choices(problem):
            if cands and budget.exhausted():
                break
            value, stages = space.solve(m, self.tmax_candidates)
            if not stages:
                continue
            c = space.assignment(stages)
            c.assign = fix_colocation(ctx, c.assign)
            c.microbatches = [m]
            c.origin = f"m={m}: {len(stages)} stages, DP objective {value:.4g}s"
            cands.append(c)
        if not cands:   # nothing fits even spread out: use every device, by speed
            space_all = Space(problem, self.max_layers, [problem.n_devices])
            c = space_all.assignment([(0, space_all.L - 1, 0, problem.n_devices)])
            c.assign = fix_colocation(ctx, c.assign)
            cands.append(c)
        if budget.allow(2) < 2:         # the even split spent the budget
            plan, report = alt
        else:
            plan, report, _ = choose(self, problem, cost_model, budget, cands,
                                     keep=len(cands), progress=progress)
            # the final model, where it is another, ranks the DP's and the even split's
            plan, report = _better(problem, cost_model, budget, (plan, report), alt)
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)


def _better(problem, cost_model, budget, a, b):
    """The better of two ``(plan, report)`` finalists: by the event
    simulator when the search's model is the analytical one (which screens
    for it) and both simulations are predicted to fit the time left, else
    by the search's model."""
    from ..cost import get_cost_model
    va, vb = a[1].objective, b[1].objective
    if getattr(cost_model, "name", None) == "analytical" and not budget.out_of_time():
        # each simulation only where it fits the time left (minutes on a
        # 100,000-op plan with wide data-parallel groups)
        sim = get_cost_model("simulator")
        ra = SimulationClock.estimate(sim, problem, a[0], budget)
        rb = None if ra is None else SimulationClock.estimate(sim, problem, b[0], budget)
        if ra is not None and rb is not None:
            va, vb = ra.objective, rb.objective
    return b if vb < va else a

"""Closed-form cost model for inner search loops, vectorised over plans.

For each plan, with m microbatches:

- per microbatch, each resource's load: ``c_d`` the compute time of device
  d (forward + backward of its op replicas, plus launch overheads), ``l_ab``
  the time link a->b is held by the tensors crossing it (an op's output goes
  once per destination group; a data-parallel group's slices go from replica
  to replica), and each device's network interface;
- the bottleneck ``beta``: the most loaded resource. Under 1F1B a link
  carries activations one way and gradients the other at once; GPipe runs
  all forwards, then all backwards, so it pays the forward and the backward
  bottleneck one after the other. 1F1B also caps the microbatches in flight
  (see :func:`placer.cost.memory.inflight`), so beta is at least the fill
  time over the number of pipeline runs;
- ``fill``: one microbatch through the pipeline, the heaviest path through
  the graph where ops weigh their compute time on their devices and edges
  between groups their latency (twice when training), plus the transfer
  time of every tensor that crosses devices (tensors on one link queue).

Step time ``T = (m - 1) * beta + fill``: for S equal stages of time t this
is ``(m + S - 1) * t``. A data-parallel group's all-reduce (linear bounds of
ring and hierarchical, the cheaper, per DDP bucket) starts when its backward
ends, which is earlier than the step's end by the backward drain through the
ops before it, and may extend the step. Memory is the simulator's formula.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .base import CostModel, register_cost_model
from .collectives import allreduce_coefficients
from .memory import inflight, peak_memory
from .problem import INFEASIBLE, Problem
from .report import Report

if TYPE_CHECKING:
    from ..plan import Plan


class _Batch:
    """Figures of B plans sharing one group table (all arrays lead with B)."""


def evaluate(p: Problem, A: np.ndarray, groups: Sequence[tuple], m, gpipe) -> _Batch:
    """Vectorised estimate of plans ``A`` (B, n_ops) of group ids over the
    group table ``groups``; ``m`` and ``gpipe`` are per plan (B,) arrays."""
    A = np.asarray(A, dtype=np.int64)
    B, n = A.shape
    D = p.n_devices
    G = len(groups)
    m = np.broadcast_to(np.asarray(m, dtype=float), (B,))
    gpipe = np.broadcast_to(np.asarray(gpipe, dtype=bool), (B,))
    training = p.training
    member = np.zeros((G, D))
    size = np.empty(G)
    for gid, mem in enumerate(groups):
        member[gid, list(mem)] = 1.0
        size[gid] = len(mem)
    share = member / size[:, None]
    flat = (A + (np.arange(B) * G)[:, None]).ravel()

    tiles = _tiles(p, B)

    def gsum(name):
        return np.bincount(flat, tiles[name], minlength=B * G).reshape(B, G)

    count = gsum("ones")
    lf = gsum("flops")
    per_mb = 1.0 / m[:, None]
    inv_rate = share / p.rate[None, :]
    ovh = p.op_overhead
    cf = (lf * per_mb) @ inv_rate + (count @ member) * ovh
    if training:
        lb = gsum("bwd_flops")
        cb = (lb * per_mb) @ inv_rate + (count @ member) * ovh
        if p.recompute:
            cb = cb + cf
    else:
        lb = np.zeros_like(lf)
        cb = np.zeros_like(cf)
    comp = cf + cb

    # --- tensors crossing devices -----------------------------------------
    L = np.zeros((B, D * D))
    speed = np.minimum(p.bandwidth, np.minimum(p.nic_bandwidth[:, None],
                                               p.nic_bandwidth[None, :]))
    phases = 2.0 if training else 1.0
    # per edge: latency + transfer time of its tensor for one microbatch when
    # it crosses groups (the replicas of a data-parallel group send and
    # receive in parallel), twice when gradients come back the same way
    edge_w = np.zeros((B, p.n_edges))
    xfer = np.zeros(B)
    if p.n_edges:
        src, dst, eb = _edges_by_source(p)
        gu = A[:, src]
        gv = A[:, dst]
        rows, cut = np.nonzero(gu != gv)            # few: only edges between groups
        if len(rows):
            cu, cv = gu[rows, cut], gv[rows, cut]
            lat, cost = _pair_delay(p, groups, cu, cv, speed)
            edge_w[rows, cut] = phases * lat
            # an op's output goes once to each destination group; edges are
            # sorted by source, so a repeat sits within the last few entries
            key = (rows * n + src[cut]) * G + cv
            dup = np.zeros(len(key), dtype=bool)
            for lag in (1, 2, 3):
                dup[lag:] |= key[lag:] == key[:-lag]
            keep = ~dup
            rows, cu, cv, nb = rows[keep], cu[keep], cv[keep], eb[cut[keep]]
            # tensors crossing one link wait for each other: count them all
            xfer = np.bincount(rows, nb * cost[keep], minlength=B)
            single = (cu < D) & (cv < D)
            if single.any():
                keys = rows[single] * (D * D) + cu[single] * D + cv[single]
                L += np.bincount(keys, nb[single], minlength=B * D * D).reshape(B, D * D)
            if not single.all():
                dm = ~single
                pk = cu[dm] * G + cv[dm]
                upk, pinv = np.unique(pk, return_inverse=True)
                # spread each (plan, group pair) total over that pair's links
                sparse = [_pair_sparse(p, groups[k // G], groups[k % G])
                          for k in upk.tolist()]
                nnz = np.array([len(x[0]) for x in sparse])
                ptr = np.r_[0, np.cumsum(nnz)]
                links = np.concatenate([x[0] for x in sparse])
                fracs = np.concatenate([x[1] for x in sparse])
                reps = nnz[pinv]
                pos = np.repeat(ptr[pinv] - np.r_[0, np.cumsum(reps)[:-1]], reps) \
                    + np.arange(reps.sum())
                L += np.bincount(np.repeat(rows[dm], reps) * (D * D) + links[pos],
                                 np.repeat(nb[dm], reps) * fracs[pos],
                                 minlength=B * D * D).reshape(B, D * D)
    L = L.reshape(B, D, D)
    Lmb = L * per_mb[:, :, None]
    link_t = Lmb / speed[None]
    # gradients of a->b tensors travel b->a: under 1F1B each link carries
    # both directions' loads at once; GPipe runs all forwards, then all
    # backwards, so each phase has its own bottleneck
    fwd_out = Lmb.sum(axis=2) / p.nic_bandwidth[None, :]
    fwd_in = Lmb.sum(axis=1) / p.nic_bandwidth[None, :]
    beta_f = np.maximum.reduce([cf.max(axis=1), link_t.reshape(B, -1).max(axis=1),
                                fwd_out.max(axis=1), fwd_in.max(axis=1)])
    if training:
        both = Lmb + Lmb.transpose(0, 2, 1)
        nic_out, nic_in = fwd_out + fwd_in, fwd_in + fwd_out
        beta = np.maximum.reduce([comp.max(axis=1),
                                  (both / speed[None]).reshape(B, -1).max(axis=1),
                                  nic_out.max(axis=1), nic_in.max(axis=1)])
        beta_b = np.maximum.reduce([cb.max(axis=1), link_t.reshape(B, -1).max(axis=1),
                                    fwd_out.max(axis=1), fwd_in.max(axis=1)])
        beta = np.where(gpipe, beta_f + beta_b, beta)
    else:
        nic_out, nic_in = fwd_out, fwd_in
        beta = beta_f
    # --- fill: the critical path of one microbatch (forward and backward) ----
    slow = (member / p.rate[None, :]).max(axis=1)
    work = p.flops + (p.bwd_flops if training else 0.0)
    node_w = work[None, :] * (slow / size)[A] * per_mb + ovh * phases
    fill = _longest_path(p, node_w, edge_w) + phases * xfer * per_mb[:, 0]
    hr, hc = np.nonzero(A[:, 1:] != A[:, :-1])
    # --- first op of each group and device (ops are in topological order) ----
    # a group's first op starts a run: only row starts and switches qualify
    sr = np.r_[np.arange(B), hr]
    sc = np.r_[np.zeros(B, dtype=np.int64), hc + 1]
    first_g = np.full(B * G, n, dtype=np.int64)
    np.minimum.at(first_g, sr * G + A[sr, sc], sc)
    first_g = first_g.reshape(B, G)
    first_d = first_g[:, :D].copy()
    dp_rows, dp_dev, dp_gid = _dp_entries(groups, D, first_g[:, D:] < n)
    if len(dp_rows):
        np.minimum.at(first_d, (dp_rows, dp_dev), first_g[dp_rows, dp_gid])
    used = first_d < n
    # 1F1B lets the first of S devices hold S microbatches, so a round trip
    # (about the fill time) is shared by at most S microbatches
    # run of a position = switches before it (switch keys are sorted)
    skey = hr * n + hc + 1
    row_start = np.searchsorted(skey, np.arange(B) * n)
    runs = (np.diff(np.r_[row_start, len(skey)]) + 1)[:, None]
    qry = np.arange(B)[:, None] * n + np.minimum(first_d, n - 1)
    run_first = np.searchsorted(skey, qry, side="right") - row_start[:, None]
    held_1f1b = inflight(p, run_first, runs, used, m[:, None], "1f1b")
    if training:
        # the first device holds R microbatches (R runs), so a round trip
        # (about the fill time) is shared by at most R of them
        beta = np.where(gpipe, beta, np.maximum(beta, fill / runs[:, 0]))
    step = (m - 1) * beta + fill


    # --- all-reduce of data-parallel groups ----------------------------------
    if training and G > D:
        lp = gsum("param_bytes")
        dp = np.arange(G) >= D
        coef = np.array([_coefficients(p, tuple(groups[g])) if g >= D else (0, 0, 0, 0)
                         for g in range(G)])
        buckets = np.maximum(np.ceil(lp / p.bucket_bytes), 1.0)
        ar = np.minimum(coef[:, 0] * buckets + coef[:, 1] * lp,
                        coef[:, 2] * buckets + coef[:, 3] * lp)
        ar = np.where((lp > 0) & dp[None, :], ar, 0.0)
        if ar.any():
            bgt = lb * per_mb / size[None, :] * slow[None, :]
            # after a group's last backward, the microbatch's backward still
            # has to drain through the ops before it: about that share of the
            # backward half of the fill
            slack = (fill / phases)[:, None] * np.minimum(first_g, n) / n
            # all buckets but the last overlap the group's own last backward
            slack = slack + bgt * (buckets - 1) / buckets
            step = np.maximum(step, step + (ar - slack).max(axis=1))
    else:
        lp = gsum("param_bytes") if G > 0 else None
        ar = None

    # --- memory -------------------------------------------------------------------
    if lp is None or not training or G <= D:
        lp = gsum("param_bytes")
    params = lp @ member
    acts = gsum("output_bytes") @ share
    recv = L.sum(axis=1)
    # max per group: write values in increasing order, the last write wins
    ws_order = _ws_order(p)
    wsg = np.zeros(B * G)
    wsg[(A[:, ws_order] + (np.arange(B) * G)[:, None]).ravel()] = tiles["ws_sorted"]
    wsg = wsg.reshape(B, G) / size[None, :]
    ws = wsg[:, :D].copy()
    if len(dp_rows):
        np.maximum.at(ws, (dp_rows, dp_dev), wsg[dp_rows, dp_gid])
    ws *= per_mb
    held_gp = inflight(p, run_first, runs, used, m[:, None], "gpipe")
    held = np.where(gpipe[:, None], held_gp, held_1f1b)
    peak = peak_memory(p, params, acts, recv, ws, held, m[:, None])

    out = _Batch()
    out.step, out.peak, out.comp, out.L, out.link_t, out.nic_out, out.nic_in = \
        step, peak, comp, L, link_t, nic_out, nic_in
    out.m, out.used, out.ar, out.beta, out.phases = m, used, ar, beta, phases
    excess = peak - p.memory[None, :]
    out.excess = excess
    ratio = (excess / p.memory[None, :]).max(axis=1)
    out.feasible = ratio <= 0
    if p.objective == "step_time":
        obj = step.copy()
    elif p.objective == "throughput":
        obj = -1.0 / step
    else:
        obj = (peak / p.memory[None, :]).max(axis=1)
    out.objective = np.where(out.feasible, obj, INFEASIBLE * (1.0 + np.maximum(ratio, 0)))
    return out


def _levels(p: Problem):
    """A level-by-level plan of the longest path: ops renumbered by depth (so
    each level's ops are one slice) and edges sorted by (depth of their
    destination, destination). Returns (op order, edge order, levels) with
    levels ``[(edge slice, new sources, reduceat starts or None, op slice)]``."""
    hit = getattr(p, "_levels_cache", None)
    if hit is None:
        src, dst, _ = _edges_by_source(p)
        depth = np.zeros(p.n_ops, dtype=np.int64)
        for op_id, d in p.graph.depths().items():
            depth[p.index[op_id]] = d
        op_order = np.lexsort((np.arange(p.n_ops), depth))
        new = np.empty(p.n_ops, dtype=np.int64)
        new[op_order] = np.arange(p.n_ops)
        nd, ns = new[dst], new[src]
        edge_order = np.lexsort((nd, depth[dst]))
        nd, ns, lv = nd[edge_order], ns[edge_order], depth[dst][edge_order]
        levels = []
        if len(nd):
            bounds = np.flatnonzero(np.r_[True, lv[1:] != lv[:-1], True])
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                d = nd[a:b]
                starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
                levels.append((slice(a, b), ns[a:b],
                               None if len(starts) == b - a else starts,
                               slice(int(d[0]), int(d[-1]) + 1)))
        hit = p._levels_cache = (op_order, edge_order, levels)
    return hit


def _longest_path(p: Problem, node_w: np.ndarray, edge_w: np.ndarray) -> np.ndarray:
    """Heaviest path per plan: node weights (B, n), edge weights (B, E)
    (edge columns in source-sorted order)."""
    op_order, edge_order, levels = _levels(p)
    # op-major layout in level order: each level reads rows, writes a slice
    dist = np.ascontiguousarray(node_w.T[op_order])
    ew = np.ascontiguousarray(edge_w.T[edge_order])
    for edges, srcs, starts, ops in levels:
        cand = dist[srcs] + ew[edges]
        dist[ops] += cand if starts is None else np.maximum.reduceat(cand, starts, axis=0)
    return dist.max(axis=0)


def _pair_delay(p: Problem, groups, cu: np.ndarray, cv: np.ndarray, speed: np.ndarray):
    """Latency and seconds per byte between groups ``cu`` and ``cv`` (arrays):
    the slowest member pair's latency and link or interface."""
    D = p.n_devices
    lat = np.empty(len(cu))
    cost = np.empty(len(cu))
    single = (cu < D) & (cv < D)
    lat[single] = p.latency[cu[single], cv[single]]
    cost[single] = 1.0 / speed[cu[single], cv[single]]
    if not single.all():
        dm = ~single
        pad = _padded(groups, D)
        lat_ext = np.zeros((D + 1, D + 1))
        lat_ext[:D, :D] = p.latency
        mu, mv = pad[cu[dm]], pad[cv[dm]]
        lat[dm] = lat_ext[mu[:, :, None], mv[:, None, :]].max(axis=(1, 2))
        G = len(groups)
        upk, inv = np.unique(cu[dm] * G + cv[dm], return_inverse=True)
        worst = np.array([_pair_sparse(p, groups[k // G], groups[k % G])[2]
                          for k in upk.tolist()])
        cost[dm] = worst[inv]
    return lat, cost


def _padded(groups, D: int) -> np.ndarray:
    """(G, K) device indices of each group, padded with D."""
    width = max(len(g) for g in groups)
    pad = np.full((len(groups), width), D, dtype=np.int64)
    for gid, mem in enumerate(groups):
        pad[gid, :len(mem)] = mem
    return pad


def _dp_entries(groups, D: int, present: np.ndarray):
    """(plan row, device, group id) for every member of every data-parallel
    group a plan uses (``present``: (B, G - D) bool)."""
    rows, cols = np.nonzero(present)
    if not len(rows):
        e = np.zeros(0, dtype=np.int64)
        return e, e, e
    sizes = np.array([len(groups[D + k]) for k in range(present.shape[1])])
    pad = np.full((present.shape[1], sizes.max()), -1, dtype=np.int64)
    for k in range(present.shape[1]):
        pad[k, :sizes[k]] = groups[D + k]
    devs = pad[cols]
    keep = devs >= 0
    return (np.broadcast_to(rows[:, None], devs.shape)[keep], devs[keep],
            np.broadcast_to(cols[:, None] + D, devs.shape)[keep])


def _tiles(p: Problem, B: int) -> dict:
    """Per-op weights repeated for B plans (cached for the last B)."""
    hit = getattr(p, "_tiles", None)
    if hit is None or hit[0] != B:
        order = _ws_order(p)
        arrays = {"ones": np.ones(p.n_ops), "flops": p.flops, "bwd_flops": p.bwd_flops,
                  "param_bytes": p.param_bytes, "output_bytes": p.output_bytes,
                  "ws_sorted": p.workspace_bytes[order]}
        hit = (B, {k: np.tile(v, B) for k, v in arrays.items()})
        if B * p.n_ops <= 1 << 21:      # keep at most ~100 MB of them
            p._tiles = hit
    return hit[1]


def _edges_by_source(p: Problem):
    """Edge sources, destinations and bytes sorted by (source, destination)."""
    hit = getattr(p, "_by_source", None)
    if hit is None:
        o = p.edge_order
        hit = p._by_source = (p.edge_src[o], p.edge_dst[o], p.edge_bytes[o])
    return hit


def _ws_order(p: Problem) -> np.ndarray:
    if getattr(p, "_ws_sorted", None) is None:
        p._ws_sorted = np.argsort(p.workspace_bytes, kind="stable")
    return p._ws_sorted


def _pair_sparse(p: Problem, src, dst):
    """Non-zero (link index a*D+b, fraction) of :meth:`Problem.pair_traffic`,
    and the slowest of those links' seconds per byte sent between the groups."""
    cache = p.__dict__.setdefault("_pair_sparse", {})
    key = (tuple(src), tuple(dst))
    hit = cache.get(key)
    if hit is None:
        if len(cache) > 4096:
            cache.clear()
        w = p.pair_traffic(key[0], key[1]).ravel()
        idx = np.flatnonzero(w)
        speed = np.minimum(p.bandwidth, np.minimum(p.nic_bandwidth[:, None],
                                                   p.nic_bandwidth[None, :])).ravel()
        worst = 0.0
        if len(idx):
            # replicas send in parallel, but each interface takes its share in turn
            D = p.n_devices
            w2 = w.reshape(D, D)
            worst = max(float((w[idx] / speed[idx]).max()),
                        float((w2.sum(axis=1) / p.nic_bandwidth).max()),
                        float((w2.sum(axis=0) / p.nic_bandwidth).max()))
        hit = cache[key] = (idx, w[idx], worst)
    return hit


def _coefficients(p: Problem, devices: tuple) -> tuple:
    cache = p.__dict__.setdefault("_ar_coef", {})
    hit = cache.get(devices)
    if hit is None:
        if len(cache) > 4096:
            cache.clear()
        hit = cache[devices] = allreduce_coefficients(devices, p.bandwidth, p.latency,
                                                      p.nic_bandwidth, p.site)
    return hit


@register_cost_model
class Analytical(CostModel):
    """Closed-form estimate (see the module doc), batched over plans.

    >>> from placer import Graph, Op, Edge, Cluster, Device, Plan
    >>> g = Graph("t", [Op("a", flops=1e9), Op("b", flops=1e9)], [Edge("a", "b", 1e6)],
    ...           training=False)
    >>> c = Cluster.from_rules("c", [Device("x", 1e12, 1e10, efficiency=1.0),
    ...                              Device("y", 1e12, 1e10, efficiency=1.0)],
    ...                        default=(1e9, 0.0))
    >>> r = Analytical().estimate(Problem(g, c, op_overhead=0.0),
    ...                           Plan({"a": ["x"], "b": ["y"]}, microbatches=1))
    >>> round(r.step_time, 6)
    0.003
    """

    name = "analytical"

    def estimate(self, problem: Problem, plan: "Plan") -> Report:
        return self.estimate_many(problem, [plan])[0]

    def estimate_many(self, problem: Problem, plans: Sequence["Plan"]) -> list[Report]:
        if not plans:
            return []
        table: dict = {}
        compiled = [problem.compile(plan, table) for plan in plans]
        groups = compiled[-1].groups
        A = np.stack([c.op_group for c in compiled])
        m = np.array([c.microbatches for c in compiled])
        gp = np.array([c.schedule == "gpipe" for c in compiled])
        batch = evaluate(problem, A, groups, m, gp)
        return _reports(problem, batch, compiled)

    def step_times(self, problem: Problem, assignments, *, groups=(), microbatches: int = 1,
                   schedule: str = "1f1b") -> np.ndarray:
        A = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        table = [(i,) for i in range(problem.n_devices)] + [tuple(sorted(g)) for g in groups]
        return evaluate(problem, A, table, microbatches, schedule == "gpipe").objective


_LAZY_FIELDS = ("peak_memory", "memory_excess", "busy", "compute", "comm", "idle",
                "bytes_per_link")


class _LazyReport(Report):
    """A :class:`Report` whose per-device and per-link dicts are built on
    first access, so ranking thousands of plans does not pay for them."""

    def __init__(self, build, **scalars):
        self.__dict__.update(scalars)
        self.__dict__["_build"] = build

    def __getattr__(self, name):
        build = self.__dict__.get("_build")
        if name in _LAZY_FIELDS and build is not None:
            self.__dict__.update(build())
            del self.__dict__["_build"]
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self):
        for name in _LAZY_FIELDS:
            getattr(self, name)
        return super().__getstate__()


def _reports(p: Problem, b: _Batch, compiled: list) -> list[Report]:
    names = p.devices
    B = len(compiled)
    D = p.n_devices
    ct = b.comp.max(axis=1)
    cd = b.comp.argmax(axis=1)
    lt_flat = b.link_t.reshape(B, -1)
    lt = lt_flat.max(axis=1) * b.phases
    ld = lt_flat.argmax(axis=1)
    steps = b.step.tolist()
    ms = b.m.tolist()
    feasible = b.feasible.tolist()
    objective = b.objective.tolist()
    out = []
    for i, c in enumerate(compiled):
        step, m = steps[i], ms[i]
        if lt[i] > ct[i]:
            a, z = divmod(int(ld[i]), D)
            bottleneck = (f"link {names[a]}->{names[z]} (busy {lt[i] * m / step:.0%} "
                          f"of the step)")
        else:
            bottleneck = (f"device {names[int(cd[i])]} (compute {ct[i] * m / step:.0%} "
                          f"of the step)")
        out.append(_LazyReport(
            lambda i=i: _dicts(p, b, i), step_time=step, feasible=feasible[i],
            objective=objective[i], bottleneck=bottleneck, model="analytical",
            microbatches=c.microbatches, schedule=c.schedule, extra={}, timeline=None))
    return out


def _dicts(p: Problem, b: _Batch, i: int) -> dict:
    names = p.devices
    step = float(b.step[i])
    m = float(b.m[i])
    used = b.used[i] | (b.peak[i] > 0)
    idx = np.flatnonzero(used).tolist()
    comp = b.comp[i] * m
    comm = (b.nic_out[i] + b.nic_in[i]) * m
    busy = np.minimum(np.maximum(comp, comm), step)
    L = b.L[i] + b.L[i].T if b.phases > 1 else b.L[i]    # gradients come back
    nz = np.argwhere(L > 0).tolist()
    excess = b.excess[i]
    return dict(
        peak_memory={names[d]: float(b.peak[i, d]) for d in idx},
        memory_excess={names[d]: float(excess[d]) for d in np.flatnonzero(excess > 0)},
        busy={names[d]: float(busy[d]) for d in idx},
        compute={names[d]: float(comp[d]) for d in idx},
        comm={names[d]: float(comm[d]) for d in idx},
        idle={names[d]: float(step - busy[d]) for d in idx},
        bytes_per_link={f"{names[a]}->{names[z]}": float(L[a, z]) for a, z in nz})

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
  bottleneck one after the other. 1F1B also caps the microbatches a device
  keeps in flight (see :func:`placer.cost.memory.inflight`): where the cap
  is below m, beta is at least that device's round trip (the fill from its
  first run on, both ways) over its cap;
- ``fill``: one microbatch through the pipeline: the longest path over the
  plan's runs. A group runs its ops one after another, so a run takes its
  ops' whole work on its group (both phases, launch overheads included). It
  starts once its group's previous run ended and the tensors crossing into
  it arrived: a tensor leaves when the op producing it ends (its run's
  start plus the run's work up to that op), takes the latency, then the
  run's incoming transfers their times, which queue, and is needed when the
  op taking it starts (the run may start that op's share of the run's work
  earlier); latency and transfers count twice when training (gradients
  come back). Parallel branches on different devices overlap. It is at
  least any device's compute for the microbatch (every op runs).

Step time ``T = (m - 1) * beta + fill``: for S equal stages of time t this
is ``(m + S - 1) * t``, on one device ``m * t``. A data-parallel group's
all-reduce (linear bounds of ring and hierarchical, the cheaper, per DDP
bucket) is released bucket by bucket over the group's last backward,
which ends before the step does by the last microbatch's backward drain
through the runs before the group (the backward share of their work on the
path, one way of their transfers). A device runs its groups' all-reduces
one after another, as the simulator's collective stream does, so the step
ends no earlier than, for any release point t of a group on it, t plus
everything its groups release from t on (see :func:`_allreduce_late`).
Memory is the simulator's formula.

Everything is computed per plan from its *runs* (maximal stretches of the
topological order on one group) and *slots* (the groups it uses), so the
work grows with a plan's runs and cut edges, not with its ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from .arrays import unique_ints
from .base import CostModel, register_cost_model
from .collectives import allreduce_coefficients
from .memory import inflight, peak_memory
from .problem import Problem, infeasible_objective, microbatch_edge_bytes
from .report import Report

if TYPE_CHECKING:
    from ..plan import Plan


class _Batch:
    """Figures of B plans sharing one group table (all arrays lead with B)."""


def evaluate(p: Problem, A: np.ndarray, groups: Sequence[tuple], m, gpipe) -> _Batch:
    """Vectorised estimate of plans ``A`` (B, n_ops) of group ids over the
    group table ``groups``; ``m`` and ``gpipe`` are per plan (B,) arrays.

    Everything is computed from the plans' *runs* (maximal stretches of the
    topological order on one group) and *slots* (the groups a plan uses):
    per-group sums are differences of prefix sums at run ends, the largest
    workspace a range maximum, so the work per plan grows with its runs and
    its cut edges, not its ops nor the size of the group table.

    In phases, per microbatch unless said::

        A            = the plans as the runtime runs them (Problem.as_run)
        runs, slots  = the plans cut where their group changes
        cf, cb       = each device's forward and backward compute (_compute)
        crossings    = tensors between groups: latency, link loads (_crossings)
        cf, cb      += each device's time its messages cost
        links        = per (plan, link) loads (_links)
        beta         = the most loaded resource (_beta)
        fill         = the longest path over the runs (_fill), >= any device's compute
        beta         = max(beta, a capped device's round trip / cap) under 1F1B
        step         = (m - 1) * beta + fill, + the all-reduces' tail (_allreduce_step)
        peak         = the simulator's memory formula (_memory)
    """
    A, groups = p.as_run(np.asarray(A), groups)
    B, n = A.shape
    D = p.n_devices
    G = len(groups)
    m = np.broadcast_to(np.asarray(m, dtype=float), (B,))
    gpipe = np.broadcast_to(np.asarray(gpipe, dtype=bool), (B,))
    training = p.training
    phases = 2.0 if training else 1.0
    per_mb = 1.0 / m[:, None]
    gt = _group_table(p, groups)
    pre = _precomputed(p)
    rn = _runs(A, G)
    # per-slot sums from prefix sums at run boundaries
    sl = _slots(gt, rn, D, G, pre["cum"][rn.run_end] - pre["cum"][rn.run_start])

    pieces = _run_pieces(p, A, rn) if p.granularity == "piece" else None
    heads = _task_heads(p, rn, pieces) if p.task_overhead else None
    cp = _compute(p, A, groups, gt, pre, rn, sl, m, per_mb, heads)
    x = _crossings(p, groups, gt, pre, rn, per_mb)
    cf, cb = cp.cf, cp.cb
    if x.msg is not None:
        cf = cf + x.msg
        if training:
            cb = cb + x.msg_b
    comp = cf + cb
    lk = _links(p, B, pre["speed"], per_mb[:, 0], x.k_single, x.w_single, x.k_dp, x.w_dp)
    bt = _beta(lk, cf, cb, comp, gpipe, training)

    fl = _fill(p, gt, pre, rn, x, m, per_mb, G, phases, heads, pieces)
    fill = fl.fill if cp.loss_fill is None else fl.fill + cp.loss_fill
    # every op of a microbatch runs, so it takes at least any device's share
    fill = np.maximum(fill, comp.max(axis=1))
    fr = _first_runs(rn, sl.first_d)
    held_1f1b = inflight(p, fr.run_first, rn.runs[:, None], fr.used, m[:, None], "1f1b")
    beta = bt.beta
    if training:
        beta = _round_trip_bound(rn, fr, held_1f1b, m, gpipe, beta, fill, fl.start)
    step = (m - 1) * beta + fill

    lp = np.where(sl.total(5) > 0, sl.total(3), 0.0)      # exactly 0 without parameters
    if training and G > D:
        step = _allreduce_step(p, gt, pre, rn, sl, cp, lp, m, fl, phases, step)
    peak = _memory(p, gt, pre, rn, sl, cp.s_inv, lk, fr, held_1f1b, lp, m, per_mb, gpipe)

    out = _Batch()
    out.step, out.peak, out.comp, out.links, out.nic_out, out.nic_in = \
        step, peak, comp, lk, bt.nic_out, bt.nic_in
    out.m, out.used, out.beta, out.phases = m, fr.used, beta, phases
    _objective(p, out)
    return out


class _Runs(NamedTuple):
    """The plans' runs, row-major: ``small`` the plans' group ids in a small
    integer type; each group switch's row ``hr`` and the position before it
    ``hc`` and its sort key ``skey``; per plan its run count and first run;
    per run its row, first op, end op and group."""
    small: np.ndarray
    hr: np.ndarray
    hc: np.ndarray
    skey: np.ndarray
    runs: np.ndarray
    row_first: np.ndarray
    run_row: np.ndarray
    run_start: np.ndarray
    run_end: np.ndarray
    run_group: np.ndarray

    def run_of(self, row, pos):
        """Global run index of op ``pos`` of plan ``row``."""
        n = self.small.shape[1]
        return np.searchsorted(self.skey, row * n + pos, side="right") + row


def _runs(A: np.ndarray, G: int) -> _Runs:
    """The runs of plans ``A`` (B, n) of ids into a table of ``G`` groups."""
    B, n = A.shape
    # small ids move less memory in the B x n and B x E passes below
    id_type = np.int16 if G < 2 ** 15 else np.int32
    small = A if A.dtype == id_type else A.astype(id_type)
    hr, hc = np.divmod(np.flatnonzero(small[:, 1:] != small[:, :-1]), max(n - 1, 1))
    runs = np.bincount(hr, minlength=B) + 1
    R = B + len(hr)
    row_first = np.zeros(B, dtype=np.int64)
    np.cumsum(runs[:-1], out=row_first[1:])
    run_row = np.repeat(np.arange(B), runs)
    run_start = np.zeros(R, dtype=np.int64)
    run_start[np.arange(len(hr)) + hr + 1] = hc + 1
    run_end = np.empty(R, dtype=np.int64)
    run_end[:-1] = run_start[1:]
    run_end[row_first + runs - 1] = n
    run_group = small.ravel()[run_row * n + run_start].astype(np.int64)
    return _Runs(small, hr, hc, hr * n + hc + 1, runs, row_first, run_row, run_start, run_end,
                 run_group)


class _Compute(NamedTuple):
    """Each (plan, device)'s forward ``cf`` and backward ``cb`` compute
    seconds per microbatch; per slot its backward FLOPs ``lb`` and, with
    measured times, its backward seconds per device class ``t_b`` and its
    slowest member's class ``s_slow``; per plan what the loss adds to the
    fill (None without a loss); per slot one over its group's size
    ``s_inv`` and over its plan's microbatches ``s_per_mb``."""
    cf: np.ndarray
    cb: np.ndarray
    lb: np.ndarray
    t_b: "np.ndarray | None"
    s_slow: "np.ndarray | None"
    loss_fill: "np.ndarray | None"
    s_inv: np.ndarray
    s_per_mb: np.ndarray


def _compute(p: Problem, A, groups, gt: dict, pre: dict, rn: _Runs, sl: "_Slots",
             m: np.ndarray, per_mb: np.ndarray, heads=None) -> _Compute:
    """Each device's compute per microbatch: its slots' work over its rate
    (or their measured seconds), shared by the group's replicas, with the
    task overheads (``heads``: :func:`_task_heads`),
    launch overheads, fixed parts paid whole, the recomputed forward and
    the loss on its group's first device."""
    B, D = sl.first_d.shape
    training = p.training
    U = len(sl.row)
    e_slot, e_cell = sl.e_slot, sl.e_cell
    s_inv = 1.0 / gt["size"][sl.group]
    count = sl.total(0)
    lf = sl.total(1)
    s_per_mb = per_mb[sl.row, 0]
    e_inv_rate = s_inv[e_slot] / p.rate[e_cell % D]
    launches = sl.per_device(count) * p.op_overhead
    if p.task_overhead:
        # each task of a runtime (a run, or a piece: see Problem's
        # task_overhead and granularity) costs its overhead
        launches = launches + sl.per_device(
            np.bincount(sl.run_slot, heads, minlength=U)) * p.task_overhead

    times = p.times
    t_f = t_b = s_slow = None
    if times is not None:
        # measured seconds per device class instead of FLOPs / rate
        e_cls = times.cls[e_cell % D]
        s_slow = gt["slow_cls"][sl.group]
        t_f, t_b = _slot_times(pre["times_cum"], rn.run_start, rn.run_end, sl.run_slot, U)

    if p.has_fixed:
        # an op's fixed part is paid whole by each microbatch and replica
        e_whole = (1.0 - (s_per_mb * s_inv)[e_slot]) / p.rate[e_cell % D]

    def compute_time(work, slot_times=None, fixed=None):
        if slot_times is not None:
            scaled = slot_times[e_slot, e_cls] * (s_per_mb * s_inv)[e_slot]
        else:
            scaled = (work * s_per_mb)[e_slot] * e_inv_rate
        if fixed is not None:
            scaled = scaled + fixed[e_slot] * e_whole
        return np.bincount(e_cell, scaled, minlength=B * D).reshape(B, D) + launches

    cf = compute_time(lf, t_f, sl.total(6) if p.has_fixed else None)
    if training:
        lb = sl.total(2)
        cb = compute_time(lb, t_b, sl.total(7) if p.has_fixed else None)
        if p.recompute:
            cb = cb + cf
    else:
        lb = np.zeros_like(lf)
        cb = np.zeros_like(cf)
    loss_fill = None
    if training and p.has_loss and times is None:
        d_f, d_b, loss_fill = _loss_shift(p, A, groups, m)
        cf, cb = cf + d_f, cb + d_b
    return _Compute(cf, cb, lb, t_b, s_slow, loss_fill, s_inv, s_per_mb)


def _task_heads(p: Problem, rn: _Runs, pieces=None) -> np.ndarray:
    """Per run: 1.0 where it starts a runtime task. Every run does, except
    under ``granularity="piece"``, where the runtime merges runs of one
    group into pieces (``pieces``: :func:`_run_pieces`) and a piece is one
    task however many runs it holds (its other runs: 0.0)."""
    heads = np.ones(len(rn.run_row))
    if pieces is None:
        return heads
    heads[:] = 0.0
    heads[np.unique(pieces.run_piece, return_index=True)[1]] = 1.0
    return heads


class _Pieces(NamedTuple):
    """The plans' pieces (:func:`placer.pieces.op_pieces`), row-major: each
    run's piece, and per plan its first piece and piece count."""
    run_piece: np.ndarray
    first: np.ndarray
    count: np.ndarray


def _run_pieces(p: Problem, A, rn: _Runs) -> _Pieces:
    """Each run's piece as the runtime merges runs of one group
    (``granularity="piece"``)."""
    from ..pieces import op_pieces
    local = np.arange(len(rn.run_row)) - rn.row_first[rn.run_row]
    for row in np.flatnonzero(rn.runs > 1):
        first = rn.row_first[row]
        runs = slice(first, first + rn.runs[row])
        local[runs] = op_pieces(np.asarray(A[row]), p.edge_src, p.edge_dst)[rn.run_start[runs]]
    count = np.zeros(len(rn.runs), dtype=np.int64)
    np.maximum.at(count, rn.run_row, local + 1)
    first = np.r_[0, np.cumsum(count)[:-1]].astype(np.int64)
    return _Pieces(first[rn.run_row] + local, first, count)


class _Crossings(NamedTuple):
    """The tensors crossing between groups, one per (plan, source op,
    destination group), by plan row: latency ``x_lat`` and link seconds
    ``x_w`` of the whole batch (over m per microbatch), source and
    destination runs and ops;
    the bytes they put on links between single devices (``k_single``:
    ``row * D * D + link``, ``w_single``) and on data-parallel groups'
    links (``k_dp``, ``w_dp``); each (plan, device)'s seconds per microbatch
    and phase its messages cost it (None when messages cost none), and of
    those the part a backward pays (``msg_b``: messages whose value
    requires a gradient, :attr:`Problem.output_grad`); per crossing its
    passes when training (``x_pass``: 2, or 1 when no gradient goes back)."""
    x_lat: np.ndarray
    x_w: np.ndarray
    r_src: np.ndarray
    r_dst: np.ndarray
    x_from: np.ndarray
    x_to: np.ndarray
    k_single: np.ndarray
    w_single: np.ndarray
    k_dp: np.ndarray
    w_dp: np.ndarray
    msg: "np.ndarray | None"
    msg_b: "np.ndarray | None"
    x_pass: np.ndarray


def _crossings(p: Problem, groups, gt: dict, pre: dict, rn: _Runs,
               per_mb: np.ndarray) -> _Crossings:
    """The tensors crossing between the plans' groups (see :class:`_Crossings`)."""
    B, n = rn.small.shape
    D = p.n_devices
    G = len(groups)
    x_lat = np.zeros(0)
    x_w = np.zeros(0)
    k_single = k_dp = np.zeros(0, dtype=np.int64)
    w_single = w_dp = np.zeros(0)
    r_src = r_dst = x_from = x_to = np.zeros(0, dtype=np.int64)
    msg = msg_b = None
    if p.n_edges:
        src, dst, eb = _edges_by_source(p)
        rows, cut, r_src, r_dst = _crossing_edges(pre, rn.small, rn.hr, rn.hc, src, dst,
                                                  rn.run_group, rn.run_of)
        if len(rows):
            cv = rn.run_group[r_dst]
            # an op's output goes once to each destination group; edges are
            # sorted by source, so repeats sit together
            key_e = (rows * n + src[cut]) * G + cv
            lags = pre["lags"]
            if lags <= 8:
                dup = key_e[1:] == key_e[:-1]
                for lag in range(2, lags + 1):
                    dup[lag - 1:] |= key_e[lag:] == key_e[:-lag]
                keep = np.r_[0, np.flatnonzero(~dup) + 1]
            else:
                keep = unique_ints(key_e, index=True)[1]
            rows, cv, r_src, r_dst = rows[keep], cv[keep], r_src[keep], r_dst[keep]
            cu = rn.run_group[r_src]
            nb = eb[cut[keep]]
            if p.has_edge_fixed:
                # an edge's fixed bytes go with every microbatch (see Problem)
                nb = microbatch_edge_bytes(nb, p.edge_fixed[p.edge_order][cut[keep]],
                                           1.0 / per_mb[rows, 0])
            x_from, x_to = src[cut[keep]], dst[cut[keep]]
            single = (cu < D) & (cv < D)
            if single.all():
                link = cu * D + cv
                cost = pre["inv_speed"][link]
                x_lat = pre["latency"][link]
            else:
                dm = ~single
                link = cu[single] * D + cv[single]
                cost = np.empty(len(cu))
                cost[single] = pre["inv_speed"][link]
                x_lat = np.empty(len(cu))
                x_lat[single] = pre["latency"][link]
                pairs = _pair_lookup(p, groups, gt, cu[dm] * G + cv[dm])
                cost[dm] = pairs["worst"]
                x_lat[dm] = pairs["lat"]
                # spread each (plan, group pair) total over that pair's links
                reps = pairs["nnz"]
                pos = np.repeat(pairs["start"] - np.r_[0, np.cumsum(reps)[:-1]], reps) \
                    + np.arange(reps.sum())
                k_dp = np.repeat(rows[dm], reps) * (D * D) + gt["reg_links"][pos]
                w_dp = np.repeat(nb[dm], reps) * gt["reg_fracs"][pos]
            # tensors crossing one link wait for each other: count them all
            x_w = nb * cost
            if p.message_overhead or p.message_copy_rate < np.inf:
                # each message costs its sending and its receiving devices
                # time (both phases when training), and the path both
                member = gt["member"]
                each = p.message_overhead + nb * per_mb[rows, 0] / p.message_copy_rate
                msg = np.zeros((B, D))
                np.add.at(msg, rows, (member[cu] + member[cv]) * each[:, None])
                msg_b = np.zeros((B, D))
                grad = p.output_grad[x_from]
                np.add.at(msg_b, rows[grad], (member[cu[grad]] + member[cv[grad]])
                          * each[grad, None])
                x_lat = x_lat + 2 * each
            k_single = rows[single] * (D * D) + link
            w_single = nb[single]
    # a backward sends a gradient back only for a value that requires one
    x_pass = 1.0 + (p.output_grad[x_from] if p.training else np.zeros(len(x_from)))
    return _Crossings(x_lat, x_w, r_src, r_dst, x_from, x_to, k_single, w_single, k_dp, w_dp,
                      msg, msg_b, x_pass)


class _Beta(NamedTuple):
    """Per plan the bottleneck ``beta`` (seconds per microbatch); per (plan,
    device) its interface's time out and in per microbatch, gradients
    included."""
    beta: np.ndarray
    nic_out: np.ndarray
    nic_in: np.ndarray


def _beta(lk: dict, cf, cb, comp, gpipe, training: bool) -> _Beta:
    """The most loaded resource: a device's compute, a link or an interface.
    Gradients of a->b tensors travel b->a: under 1F1B each link carries
    both directions' loads at once; GPipe runs all forwards, then all
    backwards, so each phase has its own bottleneck."""
    fwd_out, fwd_in = lk["out"], lk["in"]
    beta_f = np.maximum.reduce([cf.max(axis=1), lk["max"], fwd_out.max(axis=1),
                                fwd_in.max(axis=1)])
    if not training:
        return _Beta(beta_f, fwd_out, fwd_in)
    nic_out, nic_in = fwd_out + fwd_in, fwd_in + fwd_out
    beta = np.maximum.reduce([comp.max(axis=1), lk["both_max"],
                              nic_out.max(axis=1), nic_in.max(axis=1)])
    beta_b = np.maximum.reduce([cb.max(axis=1), lk["max"],
                                fwd_out.max(axis=1), fwd_in.max(axis=1)])
    return _Beta(np.where(gpipe, beta_f + beta_b, beta), nic_out, nic_in)


class _Fill(NamedTuple):
    """Per plan the longest path of one microbatch over its runs (the loss
    and the devices' compute not yet counted); per run when it starts on
    that path and its work ``run_w``."""
    fill: np.ndarray
    start: np.ndarray
    run_w: np.ndarray


def _fill(p: Problem, gt: dict, pre: dict, rn: _Runs, x: _Crossings, m, per_mb, G: int,
          phases: float, heads=None, pieces=None) -> _Fill:
    """One microbatch through the pipeline (forward and backward): the
    longest path over the plan's runs (see :func:`_run_paths`). A group
    runs its ops one after another, so a run takes its ops' whole work on
    its group (both phases, with their launch overheads); a tensor leaves
    when the op producing it ends and is needed when the op taking it
    starts (prefixes of the runs' work), and adds its latency and the run's
    incoming transfers their times (twice each when training), so parallel
    branches on other devices overlap."""
    size, slow = gt["size"], gt["slow"]
    run_group, run_row, run_start, run_end = rn.run_group, rn.run_row, rn.run_start, rn.run_end
    B, R = len(rn.runs), len(run_row)
    serial = pre["serial_cum"]             # (n + 1, device classes or 1)
    if p.times is None:
        scale = (slow / size)[run_group] / m[run_row]
        run_cls = np.zeros(R, dtype=np.int64)
    else:
        scale = 1.0 / size[run_group] / m[run_row]
        run_cls = gt["slow_cls"][run_group].astype(np.int64)
    per_op = p.op_overhead * phases
    run_w = ((serial[run_end, run_cls] - serial[run_start, run_cls]) * scale
             + (run_end - run_start) * per_op)
    if p.task_overhead:
        run_w = run_w + p.task_overhead * phases * heads   # a runtime task per piece and phase
    if p.has_fixed:
        # the fixed parts of a run's ops, paid whole (both phases)
        fixed_cum = pre["cum"][:, 6] + (pre["cum"][:, 7] if p.training else 0.0)
        run_whole = slow[run_group] * (1.0 - 1.0 / size[run_group] / m[run_row])
        run_w = run_w + (fixed_cum[run_end] - fixed_cum[run_start]) * run_whole
    fill = run_w[rn.row_first]              # plans of one run
    start = np.zeros(R)                     # when each run may start
    if len(rn.hr):
        from .analytical_loops import crossing_costs
        inflow = np.bincount(x.r_dst, x.x_pass * x.x_w, minlength=R) * per_mb[run_row, 0]
        lat_e = x.x_pass * x.x_lat
        if p.task_overhead:
            lat_e = lat_e + p.task_overhead * phases   # the source run's task starts first
        if pieces is not None and p.training:
            end, start = _piece_paths(p, pre, rn, pieces, x, run_cls, scale, run_w, heads,
                                      per_mb, G, run_whole if p.has_fixed else None)
            fill = np.zeros(B)
            np.maximum.at(fill, run_row, end)
            return _Fill(fill, start, run_w)
        cost_e = crossing_costs(serial, run_cls, scale, run_start, x.x_from, x.x_to, x.r_src,
                                x.r_dst, lat_e, per_op)
        if p.has_fixed:
            # the fixed parts of the ops before a tensor leaves and before
            # it is needed, as in run_w
            cost_e = cost_e + (fixed_cum[x.x_from + 1] - fixed_cum[run_start[x.r_src]]) \
                * run_whole[x.r_src] - (fixed_cum[x.x_to] - fixed_cum[run_start[x.r_dst]]) \
                * run_whole[x.r_dst]
        end, start = _run_paths(run_group, rn.row_first, rn.runs, run_w, x.r_src, x.r_dst,
                                cost_e, G, inflow)
        fill = np.zeros(B)
        np.maximum.at(fill, run_row, end)
    return _Fill(fill, start, run_w)


def _piece_paths(p: Problem, pre: dict, rn: _Runs, pieces: _Pieces, x: _Crossings, run_cls,
                 scale, run_w, heads, per_mb, G: int, run_whole):
    """:func:`_fill`'s longest path as the runtime runs a plan
    (``granularity="piece"``, training): over its pieces, each run whole
    once all its inputs arrived and sending its outputs when it ends, the
    forward through the pieces and then the backward back through them (a
    piece's backward waits for its consumers' gradients). Over runs, with
    the phases lumped, a piece merged of runs seemed to start on part of
    its inputs and a branch on another device to overlap what it feeds
    (optuna's op-level plans at 0.5-0.75x the simulator's step). Returns
    each run's piece's backward end and forward start."""
    from .analytical_loops import run_paths_phased
    run_start, run_end, run_row = rn.run_start, rn.run_end, rn.run_row
    fwd = pre["fwd_cum"]
    run_f = (fwd[run_end, run_cls] - fwd[run_start, run_cls]) * scale \
        + (run_end - run_start) * p.op_overhead
    if p.task_overhead:
        run_f = run_f + p.task_overhead * heads
    if run_whole is not None:
        cum = pre["cum"][:, 6]
        run_f = run_f + (cum[run_end] - cum[run_start]) * run_whole
    P = int(pieces.count.sum())
    rp = pieces.run_piece
    group = np.empty(P, dtype=np.int64)
    group[rp] = rn.run_group
    w_f = np.bincount(rp, run_f, minlength=P)
    w_b = np.bincount(rp, run_w - run_f, minlength=P)
    src, dst = rp[x.r_src], rp[x.r_dst]
    mb = per_mb[run_row[x.r_src], 0]
    inflow_f = np.bincount(dst, x.x_w * mb, minlength=P)
    inflow_b = np.bincount(src, (x.x_pass - 1.0) * x.x_w * mb, minlength=P)
    lat_b = np.where(x.x_pass > 1.0, x.x_lat, -1.0)
    end, start = run_paths_phased(pieces.first, pieces.count, group, w_f, w_b, src, dst,
                                  x.x_lat, lat_b, inflow_f, inflow_b, G)
    return end[rp], start[rp]


class _FirstRuns(NamedTuple):
    """Per (plan, device): whether it runs any op, and the place in its plan
    of the run holding its first op (ops are in topological order)."""
    used: np.ndarray
    run_first: np.ndarray


def _first_runs(rn: _Runs, first_d: np.ndarray) -> _FirstRuns:
    """Each device's first run from its first op ``first_d`` (n: unused)."""
    B, n = rn.small.shape
    run_first = rn.run_of(np.arange(B)[:, None], np.minimum(first_d, n - 1)) \
        - rn.row_first[:, None]
    return _FirstRuns(first_d < n, run_first)


def _round_trip_bound(rn: _Runs, fr: _FirstRuns, held, m, gpipe, beta, fill,
                      start) -> np.ndarray:
    """``beta`` at least each capped device's round trip over its cap: under
    1F1B a device keeps at most ``held`` microbatches between its forward
    and backward, so when that is below m its round trip (the fill less the
    part before its first run, both ways) is shared by at most that many."""
    g_first = np.minimum(rn.row_first[:, None] + fr.run_first, len(rn.run_row) - 1)
    before = start[g_first]
    capped = fr.used & (held < m[:, None])
    trip = np.where(capped, (fill[:, None] - before) / np.maximum(held, 1.0), 0.0)
    return np.where(gpipe, beta, np.maximum(beta, trip.max(axis=1)))


def _allreduce_step(p: Problem, gt: dict, pre: dict, rn: _Runs, sl: "_Slots", cp: _Compute,
                    lp: np.ndarray, m, fl: _Fill, phases: float, step) -> np.ndarray:
    """The step times with the data-parallel groups' all-reduces of their
    slots' parameter bytes ``lp`` (see the module doc and
    :func:`_allreduce_late`)."""
    B = len(rn.runs)
    size, slow = gt["size"], gt["slow"]
    s_row, s_group = sl.row, sl.group
    D = sl.first_d.shape[1]
    coef = gt["coef"][s_group]
    buckets = np.maximum(np.ceil(lp / p.bucket_bytes), 1.0)
    ar = np.minimum(coef[:, 0] * buckets + coef[:, 1] * lp,
                    coef[:, 2] * buckets + coef[:, 3] * lp)
    ar = np.where((lp > 0) & (s_group >= D), ar, 0.0)
    if not ar.any():
        return step
    s_per_mb = cp.s_per_mb
    if p.times is None:
        bgt = cp.lb * s_per_mb / size[s_group] * slow[s_group]
    else:
        bgt = cp.t_b[np.arange(len(s_row)), cp.s_slow] * s_per_mb / size[s_group]
    # after a group's last backward, the last microbatch's backward
    # still drains through the runs before the group's first one: the
    # backward share of their work on the path to it and one way of
    # its transfers (the path counts them both ways)
    fr = sl.first_run
    local = np.arange(len(rn.run_row)) - rn.row_first[rn.run_row]   # each run's place in its plan
    work = _row_prefix(B, rn.runs, rn.run_row, local, fl.run_w)[s_row, local[fr]]
    before = fl.start[fr]
    work = np.minimum(work, before)
    last = -(pre["bwd_share"] * work + (before - work) / phases)
    # its buckets are ready one by one over its own last backward
    first = last - bgt * (buckets - 1) / buckets
    late = _allreduce_late(B, s_row, sl.e_slot, sl.e_cell, ar, buckets, first, last)
    return np.maximum(step, step + late)


def _memory(p: Problem, gt: dict, pre: dict, rn: _Runs, sl: "_Slots", s_inv, lk: dict,
            fr: _FirstRuns, held_1f1b, lp, m, per_mb, gpipe) -> np.ndarray:
    """Each (plan, device)'s peak memory, the simulator's formula: its
    parameters ``lp``, activations, received tensors, largest workspace
    and the microbatches it holds."""
    params = sl.per_device(lp)
    acts = sl.per_device(sl.total(4) * s_inv)
    # largest workspace per slot: range maxima over its runs
    run_start, run_end = rn.run_start, rn.run_end
    lg = pre["log2"][run_end - run_start]
    table = pre["sparse_max"]
    run_ws = np.maximum(table[lg, run_start], table[lg, run_end - (1 << lg)])
    ws_slot = np.zeros(len(sl.row))
    np.maximum.at(ws_slot, sl.run_slot, run_ws)
    ws = sl.per_device(ws_slot / gt["size"][sl.group], np.maximum)
    ws *= per_mb
    held_gp = inflight(p, fr.run_first, rn.runs[:, None], fr.used, m[:, None], "gpipe")
    held = np.where(gpipe[:, None], held_gp, held_1f1b)
    return peak_memory(p, params, acts, lk["recv"], ws, held, m[:, None])


def _objective(p: Problem, out: _Batch) -> None:
    """Set ``out``'s memory excess, feasibility and objective."""
    peak, step = out.peak, out.step
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
    out.objective = np.where(out.feasible, obj, infeasible_objective(ratio, step))


def _loss_shift(p: Problem, A: np.ndarray, groups, m: np.ndarray):
    """Where the loss runs (see Problem): per plan and microbatch, the
    change to each device's forward and backward time, and to the fill,
    when an op's ``loss_flops`` run whole on its group's first device (in
    its forward) instead of split over the group's replicas."""
    B = A.shape[0]
    D = p.n_devices
    d_f = np.zeros((B, D))
    d_b = np.zeros((B, D))
    fill = np.zeros(B)
    rows = np.arange(B)
    for op in np.flatnonzero(p.loss_flops.any(axis=1)).tolist():
        lf, lb = p.loss_flops[op]
        fx = p.loss_fixed[op].sum()
        for gid in np.unique(A[:, op]).tolist():
            members = np.asarray(groups[gid], dtype=np.int64)
            k = len(members)
            on = rows[A[:, op] == gid]
            per = 1.0 / m[on][:, None] / p.rate[members][None, :]     # (plans, k)
            # the loss's fixed part is paid whole by every microbatch
            fixed = fx * (1.0 - 1.0 / m[on]) / p.rate[members[0]]
            d_f[on[:, None], members[None, :]] -= lf / k * per
            d_b[on[:, None], members[None, :]] -= lb / k * per
            d_f[on, members[0]] += (lf + lb) * per[:, 0] + fixed
            # on the path: the first replica's forward grows by what the
            # others no longer do
            fill[on] += (lf + lb) * (1.0 - 1.0 / k) * per[:, 0] + fixed
    return d_f, d_b, fill


def _row_prefix(B: int, runs, run_row, local, values) -> np.ndarray:
    """(B, max runs + 1) prefix sums of per-run ``values`` within each plan:
    ``out[b, k]`` sums the first k runs of plan b (not across plans, so a
    plan's figures do not depend on its batch)."""
    out = np.zeros((B, int(np.max(runs)) + 1))
    out[run_row, local + 1] = values
    np.cumsum(out, axis=1, out=out)
    return out


def _allreduce_late(B: int, s_row, e_slot, e_cell, ar, buckets, first, last) -> np.ndarray:
    """How far past the step's end (without all-reduce) each plan's
    all-reduces finish: a device's all-reduces run one after another, so it
    is busy from any release point t at least with the buckets released
    then or later. A slot's buckets (``ar`` seconds in all) are released
    from ``first`` to ``last`` (relative to the step's end); at t the slot
    still holds all of them (t <= first), its last bucket (t <= last) or
    none. Per (plan, device), the latest ``t + work after t`` over the
    release points of its slots, then the latest over a plan's devices."""
    late = np.full(B, -np.inf)
    pick = np.flatnonzero(ar[e_slot] > 0)
    if not len(pick):
        return late
    slot, cell = e_slot[pick], e_cell[pick]
    order = np.argsort(cell, kind="stable")
    slot, cell = slot[order], cell[order]
    # every pair (i, j) of slots on one device (i == j included)
    head = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]])
    size = np.diff(np.r_[head, len(cell)])
    k = np.repeat(size, size)
    start = np.repeat(head, size)
    i = np.repeat(np.arange(len(cell)), k)
    j = np.repeat(start, k) + np.arange(len(i)) - np.repeat(np.cumsum(k) - k, k)
    si, sj = slot[i], slot[j]
    tail = ar[sj] / buckets[sj]
    at_first = np.bincount(i, np.where(first[si] <= first[sj], ar[sj],
                                       np.where(first[si] <= last[sj], tail, 0.0)),
                           minlength=len(cell))
    at_last = np.bincount(i, np.where(last[si] <= first[sj], ar[sj],
                                      np.where(last[si] <= last[sj], tail, 0.0)),
                          minlength=len(cell))
    done = np.maximum(first[slot] + at_first, last[slot] + at_last)
    np.maximum.at(late, s_row[slot], done)
    return late


def _run_paths(run_group, row_first, runs, run_w, r_src, r_dst, cost_e, G: int, inflow):
    """Longest paths over each plan's runs: a run starts once the tensors
    crossing into it arrived (``cost_e`` after their source run's start,
    then all their transfer times ``inflow``, which queue for its devices'
    links) and the previous run of its group ended (its devices are busy
    till then), and takes ``run_w``; in one compiled pass (see
    :func:`placer.cost.analytical_loops.run_paths`). Returns each run's end
    and start. Crossing edges come by plan row (as from
    :func:`_crossing_edges`)."""
    from .analytical_loops import run_paths     # numba loads on first use
    return run_paths(row_first, runs, run_group, run_w, r_src, r_dst, cost_e, inflow, G)


def _links(p: Problem, B: int, speed: np.ndarray, per_mb: np.ndarray, k_single, w_single,
           k_dp, w_dp) -> dict:
    """Bytes per (plan, link) from the tensors between single devices
    (``k_single``: ``row * D * D + a * D + b``, bytes ``w_single``) and
    between data-parallel groups (``k_dp``, ``w_dp``), kept sparse: the
    sorted ``row``, ``link`` and ``bytes`` of every loaded link, and per
    plan the busiest link's time per microbatch (``max``, ``arg``), the same
    with both directions of a device pair added (``both_max``), each
    device's interface time out and in and bytes received (``recv``)."""
    D = p.n_devices
    DD = D * D
    if B * DD <= 1 << 18:
        # few cells: sum densely and read the loaded ones in one compiled pass
        from .analytical_loops import links_dense
        row, link, load, top, arg, both_max, out, inn, recv = links_dense(
            B, D, k_single, w_single, k_dp, w_dp, per_mb, speed.ravel(),
            np.asarray(p.nic_bandwidth, dtype=float))
        return {"row": row, "link": link, "bytes": load, "max": top, "arg": arg,
                "both_max": both_max, "out": out, "in": inn, "recv": recv}
    keys, inv = unique_ints(np.r_[k_single, k_dp], inverse=True)
    load = np.bincount(inv[:len(k_single)], w_single, minlength=len(keys))
    if len(k_dp):
        load = load + np.bincount(inv[len(k_single):], w_dp, minlength=len(keys))
    row, link = np.divmod(keys, DD)
    a, z = np.divmod(link, D)
    lmb = load * per_mb[row]
    flat = speed.ravel()
    t = lmb / flat[link]
    top = np.zeros(B)
    np.maximum.at(top, row, t)
    # the busiest link of a plan: the first (lowest index) at its maximum
    arg = np.zeros(B, dtype=np.int64)
    at_top = np.flatnonzero(t == top[row])
    first = unique_ints(row[at_top], index=True)
    arg[first[0]] = link[at_top[first[1]]]
    # a device pair's two directions together, on the slower direction
    rev = row * DD + z * D + a                  # the same pair the other way
    at = np.minimum(np.searchsorted(keys, rev), max(len(keys) - 1, 0))
    back = np.where(keys[at] == rev, lmb[at], 0.0) if len(keys) else lmb
    both = (lmb + back) / np.minimum(flat[link], flat[z * D + a])
    both_max = np.zeros(B)
    np.maximum.at(both_max, row, both)
    nic = p.nic_bandwidth[None, :]
    return {"row": row, "link": link, "bytes": load, "max": top, "arg": arg,
            "both_max": both_max,
            "out": np.bincount(row * D + a, lmb, minlength=B * D).reshape(B, D) / nic,
            "in": np.bincount(row * D + z, lmb, minlength=B * D).reshape(B, D) / nic,
            "recv": np.bincount(row * D + z, load, minlength=B * D).reshape(B, D)}


def _slot_times(times_cum, run_start, run_end, run_slot, U: int):
    """Measured forward and backward seconds of each slot's ops, per device
    class: two (U, K) arrays."""
    out = []
    for cum in times_cum:
        seg = cum[run_end] - cum[run_start]
        per_slot = np.zeros((U, seg.shape[1]))
        np.add.at(per_slot, run_slot, seg)
        out.append(per_slot)
    return out


class _Slots(NamedTuple):
    """The *slots*, (plan, group) pairs that runs use: each run's slot, each
    slot's row, group and first run; one entry per (slot, member device)
    with its cell ``row * D + device``; the first op of each (plan, device)
    (B, D), ``n`` where unused; ``seg`` the per-op columns of
    :func:`_precomputed` summed over each run."""
    run_slot: np.ndarray
    row: np.ndarray
    group: np.ndarray
    first_run: np.ndarray
    e_slot: np.ndarray
    e_cell: np.ndarray
    first_d: np.ndarray
    seg: np.ndarray

    def total(self, col: int) -> np.ndarray:
        """Column ``col`` of ``seg`` summed per slot."""
        return np.bincount(self.run_slot, self.seg[:, col], minlength=len(self.row))

    def per_device(self, values, reduce=None) -> np.ndarray:
        """(B, D) sums (or maxima) over each device's slots of ``values``."""
        B, D = self.first_d.shape
        if reduce is None:
            return np.bincount(self.e_cell, values[self.e_slot],
                               minlength=B * D).reshape(B, D)
        out = np.zeros(B * D)
        reduce.at(out, self.e_cell, values[self.e_slot])
        return out.reshape(B, D)


def _slots(gt: dict, rn: _Runs, D: int, G: int, seg: np.ndarray) -> _Slots:
    """The slots of runs ``rn`` over a table of ``G`` groups (see
    :class:`_Slots`)."""
    B, n = rn.small.shape
    keys, first_run, run_slot = unique_ints(rn.run_row * G + rn.run_group, index=True,
                                            inverse=True)
    row, group = np.divmod(keys, G)
    first = rn.run_start[first_run]       # a plan's runs are in topological order
    members = gt["pad"][group]
    ok = members < D
    e_slot = np.broadcast_to(np.arange(len(keys))[:, None], members.shape)[ok]
    e_cell = (row[:, None] * D + members)[ok]
    first_d = np.full(B * D, n, dtype=np.int64)
    np.minimum.at(first_d, e_cell, first[e_slot])
    return _Slots(run_slot, row, group, first_run, e_slot, e_cell, first_d.reshape(B, D), seg)


def _pair_lookup(p: Problem, groups, gt: dict, codes: np.ndarray) -> dict:
    """For tensors between group pairs ``codes`` (``src * G + dst``, at
    least one of them data-parallel): the slowest seconds per byte
    (``worst``) and where the pair's links and fractions start in the group
    table's registry (``start``, ``nnz``; arrays ``reg_links``,
    ``reg_fracs``). Pairs are registered once per group table."""
    uniq, inv = unique_ints(codes, inverse=True)
    reg = gt.get("reg_codes")
    if reg is None:
        reg = gt["reg_codes"] = np.zeros(0, dtype=np.int64)
        gt["reg_start"] = gt["reg_nnz"] = np.zeros(0, dtype=np.int64)
        gt["reg_worst"] = gt["reg_fracs"] = gt["reg_lat"] = np.zeros(0)
        gt["reg_links"] = np.zeros(0, dtype=np.int64)
    pos = np.minimum(np.searchsorted(reg, uniq), max(len(reg) - 1, 0))
    missing = uniq[reg[pos] != uniq] if len(reg) else uniq
    if len(missing):
        G = len(groups)
        sparse = [_pair_sparse(p, groups[k // G], groups[k % G]) for k in missing.tolist()]
        nnz = np.array([len(x[0]) for x in sparse], dtype=np.int64)
        start = len(gt["reg_links"]) + np.r_[0, np.cumsum(nnz)[:-1]]
        gt["reg_links"] = np.concatenate([gt["reg_links"]] + [x[0] for x in sparse])
        gt["reg_fracs"] = np.concatenate([gt["reg_fracs"]] + [x[1] for x in sparse])
        codes_all = np.r_[reg, missing]
        order = np.argsort(codes_all, kind="stable")
        gt["reg_codes"] = reg = codes_all[order]
        gt["reg_start"] = np.r_[gt["reg_start"], start][order]
        gt["reg_nnz"] = np.r_[gt["reg_nnz"], nnz][order]
        gt["reg_worst"] = np.r_[gt["reg_worst"], [x[2] for x in sparse]][order]
        gt["reg_lat"] = np.r_[gt["reg_lat"], [x[3] for x in sparse]][order]
        pos = np.searchsorted(reg, uniq)
    pos = pos[inv]
    return {"worst": gt["reg_worst"][pos], "lat": gt["reg_lat"][pos],
            "start": gt["reg_start"][pos],
            "nnz": gt["reg_nnz"][pos]}


def _precomputed(p: Problem) -> dict:
    """Plan-independent arrays of a problem, built once: prefix sums of the
    per-op weights and work, a sparse table of workspace range maxima and
    the link speeds."""
    return p.cache.get_or_build("analytical.precomputed", lambda: _build_precomputed(p))


def _build_precomputed(p: Problem) -> dict:
    n = p.n_ops
    cols = np.stack([np.ones(n), p.flops, p.bwd_flops, p.param_bytes, p.output_bytes,
                     (p.param_bytes > 0).astype(float), p.fixed_flops[:, 0],
                     p.fixed_flops[:, 1]], axis=1)
    cum = np.zeros((n + 1, cols.shape[1]))
    np.cumsum(cols, axis=0, out=cum[1:])
    # sparse table: table[k, i] = max(workspace[i : i + 2**k])
    levels = [p.workspace_bytes.astype(float)]
    while (1 << len(levels)) <= n:
        prev, half = levels[-1], 1 << (len(levels) - 1)
        nxt = prev.copy()
        nxt[:n - half] = np.maximum(prev[:n - half], prev[half:])
        levels.append(nxt)
    log2 = np.array([0] + [k.bit_length() - 1 for k in range(1, n + 1)], dtype=np.int64)
    # each op's work on one device, both phases (and the recomputed forward)
    if p.times is not None:
        own = p.times.forward * (2.0 if p.training and p.recompute else 1.0)
        own = own + (p.times.backward if p.training else 0.0)
    else:
        own = p.flops * (2.0 if p.training and p.recompute else 1.0)
        own = own + (p.bwd_flops if p.training else 0.0)
    own = own.reshape(n, -1)
    serial_cum = np.zeros((n + 1, own.shape[1]))
    np.cumsum(own, axis=0, out=serial_cum[1:])
    # the forward's part of it (a recomputed forward runs in the backward)
    fwd = (p.times.forward if p.times is not None else p.flops).reshape(n, -1)
    fwd_cum = np.zeros((n + 1, fwd.shape[1]))
    np.cumsum(fwd, axis=0, out=fwd_cum[1:])
    speed = np.minimum(p.bandwidth, np.minimum(p.nic_bandwidth[:, None],
                                               p.nic_bandwidth[None, :]))
    src, dst, _ = _edges_by_source(p)
    outdeg = np.bincount(src, minlength=n) if len(src) else np.zeros(1, dtype=np.int64)
    if p.times is not None:
        fwd_total, bwd_total = p.times.forward.sum(), p.times.backward.sum()
    else:
        fwd_total, bwd_total = p.flops.sum(), p.bwd_flops.sum()
    work_total = fwd_total + bwd_total
    hit = {"cum": cum,
           "bwd_share": bwd_total / work_total if work_total > 0 else 0.5,
           "sparse_max": np.stack(levels), "log2": log2,
           "serial_cum": serial_cum, "fwd_cum": fwd_cum,
           "speed": speed, "inv_speed": (1.0 / speed).ravel(),
           "latency": p.latency.ravel(), "lags": max(int(outdeg.max()) - 1, 0),
           "cut_sets": _cut_sets(src, dst, n)}
    if p.times is not None:
        hit["times_cum"] = tuple(np.concatenate([np.zeros((1, t.shape[1])), np.cumsum(t, axis=0)])
                                 for t in (p.times.forward, p.times.backward))
    return hit


def _cut_sets(src: np.ndarray, dst: np.ndarray, n: int):
    """For each position h of the topological order, the edges from an op
    at or before h to one after it (CSR: ``ptr`` (n + 1), ``edge``), so
    the edges a plan cuts are found from its group switches alone. None
    when the edges are so long that the sets would be large."""
    span = dst - src
    total = int(span.sum())
    if total > 32 * (len(src) + n):
        return None
    e_rep = np.repeat(np.arange(len(src)), span)
    pos = np.arange(total) - np.repeat(np.cumsum(span) - span, span) + src[e_rep]
    order = np.argsort(pos, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pos, minlength=n), out=ptr[1:])
    return ptr, e_rep[order]


def _crossing_edges(pre: dict, small: np.ndarray, hr: np.ndarray, hc: np.ndarray,
                    src: np.ndarray, dst: np.ndarray, run_group: np.ndarray, run_of):
    """(plan row, edge index by source, source run, destination run) of
    every edge between different groups, by row, then by the first switch
    it spans, then by edge (so edges leaving one op sit together). Such an
    edge spans a group switch (``hr``, ``hc``: row and position before it),
    so only the edges spanning the switches are compared."""
    cs = pre["cut_sets"]
    if cs is None:
        B = len(small)
        E = len(src)
        # op-major copy: gathering whole rows of B ids per edge is fast
        AT = np.ascontiguousarray(small.T)
        cut, rows = np.divmod(np.flatnonzero(AT[src] != AT[dst]), B)
        if len(rows):                                  # plan-major order
            rows, cut = np.divmod(np.sort(rows * E + cut), E)
        return rows, cut, run_of(rows, src[cut]), run_of(rows, dst[cut])
    from .analytical_loops import crossing_edges
    ptr, edge = cs
    total = int((ptr[hc + 1] - ptr[hc]).sum())
    return crossing_edges(ptr, edge, small, hr, hc, src, dst, run_group, total)


def _group_table(p: Problem, groups) -> dict:
    """Arrays of a group table (cached for the last few tables)."""
    cache = p.cache.get_or_build("analytical.group_tables", dict)
    tkey = tuple(map(tuple, groups))
    hit = cache.get(tkey)
    if hit is not None:
        return hit
    if len(cache) >= 16:
        cache.clear()
    D = p.n_devices
    G = len(tkey)
    member = np.zeros((G, D))
    size = np.empty(G)
    for gid, mem in enumerate(tkey):
        member[gid, list(mem)] = 1.0
        size[gid] = len(mem)
    share = member / size[:, None]
    slow = (member / p.rate[None, :]).max(axis=1)
    width = max(len(g) for g in tkey)
    pad = np.full((G, width), D, dtype=np.int64)
    for gid, mem in enumerate(tkey):
        pad[gid, :len(mem)] = mem
    coef = np.array([_coefficients(p, tkey[g]) if g >= D else (0, 0, 0, 0)
                     for g in range(G)], dtype=float).reshape(G, 4)
    sizes = size[D:].astype(np.int64)
    if p.times is not None:
        # each group's slowest member's device class, by total measured time
        total = (p.times.forward + p.times.backward).sum(axis=0)[p.times.cls]
        worst = np.where(pad < D, np.r_[total, -1.0][pad], -np.inf).argmax(axis=1)
        slow_cls = p.times.cls[pad[np.arange(G), worst]]
    else:
        slow_cls = None
    hit = cache[tkey] = {"slow_cls": slow_cls, "member": member, "size": size, "share": share,
                         "slow": slow,
                         "pad": pad, "coef": coef, "dp_sizes": sizes,
                         "dp_pad": np.where(pad[D:] < D, pad[D:], -1)}
    return hit


def _edges_by_source(p: Problem):
    """Edge sources, destinations and bytes sorted by (source, destination)."""
    return p.cache.get_or_build("analytical.edges_by_source", lambda o=p.edge_order: (
        p.edge_src[o], p.edge_dst[o], p.edge_bytes[o]))


def _pair_sparse(p: Problem, src, dst):
    """Non-zero (link index a*D+b, fraction) of :meth:`Problem.pair_traffic`,
    the slowest of those links' seconds per byte sent between the groups and
    the groups' largest latency (their slowest member pair's)."""
    cache = p.cache.get_or_build("analytical.pair_sparse", dict)
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
        lat = float(p.latency[np.ix_(key[0], key[1])].max())
        hit = cache[key] = (idx, w[idx], worst, lat)
    return hit


def _coefficients(p: Problem, devices: tuple) -> tuple:
    cache = p.cache.get_or_build("analytical.allreduce_coefficients", dict)
    hit = cache.get(devices)
    if hit is None:
        if len(cache) > 4096:
            cache.clear()
        coef = allreduce_coefficients(devices, p.bandwidth, p.latency, p.nic_bandwidth,
                                      p.site)
        hit = cache[devices] = tuple(c / p.collective_efficiency for c in coef)
    return hit


@register_cost_model
class Analytical(CostModel):
    """Closed-form estimate (see the module doc), batched over plans.

    ``estimate_many`` keeps each plan's compiled device indices while the
    plan lives (see :meth:`Problem.compile_many`): to change a plan after
    estimating it, replace an op's device list rather than edit it in place.

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
    batched = True

    def estimate(self, problem: Problem, plan: "Plan") -> Report:
        return self.estimate_many(problem, [plan])[0]

    def estimate_many(self, problem: Problem, plans: Sequence["Plan"]) -> list[Report]:
        if not plans:
            return []
        A, groups, m, schedules = problem.compile_many(plans)
        gp = np.array([s == "gpipe" for s in schedules])
        batch = evaluate(problem, A, groups, m, gp)
        return _reports(problem, batch, m.tolist(), schedules)

    def step_times(self, problem: Problem, assignments, *, groups=(), microbatches: int = 1,
                   schedule: str = "1f1b") -> np.ndarray:
        A = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        table = [(i,) for i in range(problem.n_devices)] + [tuple(sorted(g)) for g in groups]
        return evaluate(problem, A, table, microbatches, schedule == "gpipe").objective


_LAZY_FIELDS = ("peak_memory", "memory_excess", "busy", "compute", "comm", "idle",
                "bytes_per_link", "bottleneck")


class _LazyReport(Report):
    """A :class:`Report` whose per-device and per-link dicts are built on
    first access, so ranking thousands of plans does not pay for them."""

    def __init__(self, build, **scalars):
        self.__dict__.update(scalars)
        self.__dict__["_build"] = build

    def __getattr__(self, name):
        build = self.__dict__.get("_build")
        if name in _LAZY_FIELDS and build is not None:
            self.__dict__.update(_dicts(*build) if isinstance(build, tuple) else build())
            del self.__dict__["_build"]
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def bottleneck(self) -> str:
        """The busiest device or link, in words (built on first access)."""
        if "bottleneck" not in self.__dict__:
            self.__getattr__("bottleneck")
        return self.__dict__["bottleneck"]

    @bottleneck.setter
    def bottleneck(self, value: str) -> None:
        self.__dict__["bottleneck"] = value

    def __getstate__(self):
        for name in _LAZY_FIELDS:
            getattr(self, name)
        return super().__getstate__()


def _reports(p: Problem, b: _Batch, microbatches: list, schedules: list) -> list[Report]:
    new = object.__new__
    out = []
    for i, (step, feasible, objective, m, schedule) in enumerate(zip(
            b.step.tolist(), b.feasible.tolist(), b.objective.tolist(), microbatches,
            schedules)):
        # as _LazyReport(...), without a call per report (they are many)
        r = new(_LazyReport)
        r.__dict__.update(step_time=step, feasible=feasible, objective=objective,
                          model="analytical", microbatches=m, schedule=schedule, extra={},
                          timeline=None, _build=(p, b, i))
        out.append(r)
    return out


def _bottleneck(p: Problem, b: _Batch, i: int) -> str:
    """The busiest device (compute) or link of plan ``i``, in words."""
    names = p.devices
    step, m = float(b.step[i]), float(b.m[i])
    comp = b.comp[i]
    cd = int(comp.argmax())
    ct = comp[cd]
    lt = b.links["max"][i] * b.phases
    if lt > ct:
        a, z = divmod(int(b.links["arg"][i]), p.n_devices)
        return f"link {names[a]}->{names[z]} (busy {lt * m / step:.0%} of the step)"
    return f"device {names[cd]} (compute {ct * m / step:.0%} of the step)"


def _dicts(p: Problem, b: _Batch, i: int) -> dict:
    names = p.devices
    D = p.n_devices
    step = float(b.step[i])
    m = float(b.m[i])
    used = b.used[i] | (b.peak[i] > 0)
    idx = np.flatnonzero(used).tolist()
    comp = b.comp[i] * m
    comm = (b.nic_out[i] + b.nic_in[i]) * m
    busy = np.minimum(np.maximum(comp, comm), step)
    lk = b.links
    lo, hi = np.searchsorted(lk["row"], [i, i + 1])
    L = np.zeros(D * D)
    L[lk["link"][lo:hi]] = lk["bytes"][lo:hi]
    L = L.reshape(D, D)
    L = L + L.T if b.phases > 1 else L    # gradients come back
    nz = np.argwhere(L > 0).tolist()
    excess = b.excess[i]
    return dict(
        bottleneck=_bottleneck(p, b, i),
        peak_memory={names[d]: float(b.peak[i, d]) for d in idx},
        memory_excess={names[d]: float(excess[d]) for d in np.flatnonzero(excess > 0)},
        busy={names[d]: float(busy[d]) for d in idx},
        compute={names[d]: float(comp[d]) for d in idx},
        comm={names[d]: float(comm[d]) for d in idx},
        idle={names[d]: float(step - busy[d]) for d in idx},
        bytes_per_link={f"{names[a]}->{names[z]}": float(L[a, z]) for a, z in nz})

"""Event simulator of one training step (or one inference pass).

How a plan runs, as modelled here:

- An op placed on ``k`` devices runs as ``k`` replicas, each on ``1/k`` of
  the microbatch (data parallel), unless its piece holds an op that mixes
  the batch (``mixes_batch``): then, as the runtime runs it, the piece runs
  whole on the group's first device (:meth:`Problem.as_run`). A device runs its op replicas one at a
  time, for each microbatch in topological order.
- Runs of consecutive replicas on one device that receive nothing from other
  devices are merged into *segments* (the device would run them back to back
  anyway); each segment is one task per microbatch and phase. Outputs leave
  when the op producing them ends, not when the segment ends, so nothing is
  lost by merging.
- A tensor crossing devices is sent once per (producing replica, receiving
  device) and microbatch. It waits for its link (directed device pair) and
  both ends' network interfaces to be free, holds them for
  ``bytes / min(link, NICs)`` and arrives ``latency`` later. Gradients flow
  back the same way.
- Schedules: a device picks among its ready tasks by priority. ``gpipe``:
  forwards first, and no backward before the device finished the forward of
  every microbatch. ``1f1b``: backwards first, and a device starts a new
  microbatch only while fewer than its cap are between forward and backward
  on it (the number of pipeline runs from its first op to the end, see
  :func:`placer.cost.memory.inflight`).
- Gradients of a data-parallel op are all-reduced (the cheaper of ring and
  hierarchical, see :mod:`placer.cost.collectives`) in buckets of
  ``Problem.bucket_bytes`` (like PyTorch DDP), each as soon as every replica
  finished the backward of the op holding its last byte (last microbatch);
  a device's all-reduces run one after another on a collective stream of
  their own, beside (not sharing) the point-to-point transfers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .arrays import unique_ints
from .base import CostModel, register_cost_model
from .collectives import allreduce
from .memory import inflight, peak_memory
from .problem import Compiled, Problem, microbatch_edge_bytes
from .report import Event, Report

if TYPE_CHECKING:
    from ..plan import Plan


def _segments(dev: np.ndarray, head: np.ndarray, blocker: np.ndarray, perm: np.ndarray,
              dur: np.ndarray, D: int, merge: float):
    """Cut instances (visited in ``perm`` order) into segments at a device
    change or at an instance receiving from another device (``head``).

    A head is merged into the running segment when that segment sends
    nothing to other devices (``blocker``: then nothing it waits for can
    depend on it, so merging cannot deadlock) and has run for at most
    ``merge`` of its device's time in this phase: the segment then waits for
    the head's inputs before it starts, a small delay that saves many tasks.
    Returns segment per instance, each instance's end offset inside its
    segment, segment devices and durations."""
    n = len(perm)
    d_sorted = dev[perm]
    dur_sorted = dur[perm]
    from .event_loop import segment_heads     # numba loads on first use, not import
    limit = np.bincount(dev, dur, minlength=D) * merge
    h = segment_heads(d_sorted.astype(np.int64), head[perm], blocker[perm], dur_sorted, limit)
    seg_sorted = np.cumsum(h) - 1
    cs = np.cumsum(dur_sorted)
    base = (cs - dur_sorted)[h]
    seg = np.empty(n, dtype=np.int64)
    seg[perm] = seg_sorted
    offset = np.empty(n)
    offset[perm] = cs - base[seg_sorted]
    seg_dev = d_sorted[h]
    seg_dur = np.diff(np.r_[base, cs[-1] if n else 0.0])
    return seg, offset, seg_dev, seg_dur


def _pieces(p: Problem, g: np.ndarray) -> np.ndarray:
    """Each op's piece as the runtime splits a plan (group id per op ``g``):
    :func:`placer.pieces.op_pieces`."""
    from ..pieces import op_pieces
    return op_pieces(g, p.edge_src, p.edge_dst)


def _piece_heads(dev: np.ndarray, piece: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Per instance: whether it is the first of its (device, piece) in
    ``perm`` order (where a piece-wise segment starts)."""
    d, q = dev[perm], piece[perm]
    first = np.ones(len(perm), dtype=bool)
    first[1:] = (d[1:] != d[:-1]) | (q[1:] != q[:-1])
    out = np.empty(len(perm), dtype=bool)
    out[perm] = first
    return out


def _ends(devs: np.ndarray, D: int, offset: int):
    """First and last index (plus ``offset``) of each device in ``devs``
    (-1 for devices absent)."""
    first = np.full(D, -1, dtype=np.int64)
    last = np.full(D, -1, dtype=np.int64)
    idx = np.arange(len(devs), dtype=np.int64) + offset
    last[devs] = idx                      # the last write wins
    first[devs[::-1]] = idx[::-1]
    return first, last


def _pointers(keys: np.ndarray, n: int) -> np.ndarray:
    """CSR row pointers of ``n`` rows for entries with row ``keys``."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr


def _allreduce(p: Problem, members, nbytes: float):
    """:func:`placer.cost.collectives.allreduce` of ``nbytes`` over device
    indices ``members``, remembered per problem (plans repeat their buckets)."""
    cache = p.cache.get_or_build("simulator.allreduce", dict)
    key = (tuple(members), nbytes)
    hit = cache.get(key)
    if hit is None:
        if len(cache) > 4096:
            cache.clear()
        seconds, links, algo = allreduce(members, nbytes, p.bandwidth, p.latency,
                                         p.nic_bandwidth, p.site)
        hit = cache[key] = (seconds / p.collective_efficiency, links, algo)
    return hit


def _replica_edges(su, sv, first_u, first_v, eb):
    """Edges between replicas: replica ``a`` of an edge's source (of ``su``
    replicas, each holding rows ``[a/su, (a+1)/su)`` of the batch) sends
    replica ``b`` of its destination the rows both hold. Returns the
    instance ids ``(iu, iv)`` and bytes of every pair that overlaps, edge
    by edge and ``(a, b)`` in order. Built from one table per distinct
    ``(su, sv)``, so memory grows with the pairs kept (at most
    ``su + sv - 1`` per edge), not with ``su * sv``."""
    width = int(max(su.max(), sv.max())) + 1
    kinds, kind = np.unique(su * width + sv, return_inverse=True)
    ta, tb, tov, start, count = [], [], [], [], []
    at = 0
    for key in kinds.tolist():
        pp, q = key // width, key % width
        r = np.arange(pp * q, dtype=np.int64)
        a, b = r // q, r % q
        pa, qa = np.full(len(r), pp, dtype=np.int64), np.full(len(r), q, dtype=np.int64)
        ov = np.minimum((a + 1) / pa, (b + 1) / qa) - np.maximum(a / pa, b / qa)
        keep = ov > 1e-12
        ta.append(a[keep]), tb.append(b[keep]), tov.append(ov[keep])
        start.append(at), count.append(int(keep.sum()))
        at += count[-1]
    ta, tb, tov = np.concatenate(ta), np.concatenate(tb), np.concatenate(tov)
    cnt = np.asarray(count, dtype=np.int64)[kind]
    e_idx = np.repeat(np.arange(len(su)), cnt)
    pos = np.repeat(np.asarray(start, dtype=np.int64)[kind] - (np.cumsum(cnt) - cnt), cnt) \
        + np.arange(len(e_idx))
    return first_u[e_idx] + ta[pos], first_v[e_idx] + tb[pos], eb[e_idx] * tov[pos]


class _Instances(NamedTuple):
    """Op replicas of a plan: each one's op, device and share of the rows,
    and per op its first replica and replica count."""
    op: np.ndarray
    dev: np.ndarray
    frac: np.ndarray
    first: np.ndarray
    k: np.ndarray
    sizes: np.ndarray


class _Crossings(NamedTuple):
    """Replica edges that cross devices and the transfers they make (one
    per producing replica and receiving device)."""
    iu: np.ndarray
    iv: np.ndarray
    loss_dep: np.ndarray
    tinv: np.ndarray


class _Tasks(NamedTuple):
    """Forward and backward segments (tasks) and where each replica sits
    in them."""
    ft: np.ndarray
    bt: "np.ndarray | None"
    loss_w: np.ndarray
    fdev: np.ndarray
    foff: np.ndarray
    bdev: np.ndarray
    boff: "np.ndarray | None"
    #: each replica's end within its backward segment (== ``boff`` unless
    #: a piece sends its outputs at its end)
    bend: "np.ndarray | None"


def _instances(p: Problem, c: Compiled) -> _Instances:
    """The plan's op replicas (an op on ``k`` devices runs ``k`` of them)."""
    n = p.n_ops
    gsize = np.array([len(g) for g in c.groups], dtype=np.int64)
    g = c.op_group
    if len(g) != n:
        from ..errors import PlanError
        raise PlanError(f"assignment has {len(g)} entries, the graph {n} ops")
    sizes = gsize[g]
    if n and sizes.max() == 1:
        inst_op = np.arange(n)
        inst_dev = np.array([c.groups[x][0] for x in range(len(c.groups))],
                            dtype=np.int64)[g]
        frac = np.ones(n)
        op_first = inst_op
        inst_k = np.zeros(n, dtype=np.int64)
    else:
        members = np.full((len(c.groups), int(gsize.max())), -1, dtype=np.int64)
        for gid, mem in enumerate(c.groups):
            members[gid, :len(mem)] = mem
        inst_op = np.repeat(np.arange(n), sizes)
        op_first = np.cumsum(sizes) - sizes
        inst_k = np.arange(len(inst_op)) - op_first[inst_op]
        inst_dev = members[g[inst_op], inst_k]
        frac = 1.0 / sizes[inst_op]
    return _Instances(inst_op, inst_dev, frac, op_first, inst_k, sizes)


def _crossings(p: Problem, ins: _Instances, training: bool, m: int = 1):
    """Edges between replicas on different devices (with the loss's reads
    of every replica's rows) and the transfers they make: returns the
    :class:`_Crossings` and ``(t_inst, t_src, t_dst, t_bytes)``; bytes per
    step of ``m`` microbatches (an edge's fixed bytes go with each)."""
    D, n = p.n_devices, p.n_ops
    inst_dev, op_first, sizes = ins.dev, ins.first, ins.sizes
    NI = len(ins.op)
    # --- cross-device tensors -------------------------------------------
    src, dst, eb = p.edge_src, p.edge_dst, p.edge_bytes
    if p.has_edge_fixed:
        eb = microbatch_edge_bytes(eb, p.edge_fixed, m)
    su, sv = sizes[src], sizes[dst]
    if len(src) and (su.max() > 1 or sv.max() > 1):
        iu, iv, pb = _replica_edges(su, sv, op_first[src], op_first[dst], eb)
    else:
        iu, iv, pb = op_first[src], op_first[dst], eb
    loss_dep = np.zeros(len(iu), dtype=bool)
    if training and p.has_loss and NI > n:
        # the loss, on the first replica, reads every replica's rows of
        # the output; each replica's backward waits for the gradient of
        # its rows (see Problem). The rows are consumed by the first
        # replica's backward, where the loss is charged, so that
        # replica's own forward does not wait for them.
        extra = [(op_first[op] + k, op_first[op], p.output_bytes[op] / sizes[op])
                 for op in np.flatnonzero(p.loss_flops.any(axis=1) & (sizes > 1)).tolist()
                 for k in range(1, int(sizes[op]))]
        if extra:
            eu, ev, eb_ = (np.array(col) for col in zip(*extra))
            iu = np.r_[iu, eu.astype(np.int64)]
            iv = np.r_[iv, ev.astype(np.int64)]
            pb = np.r_[pb, eb_.astype(float)]
            loss_dep = np.r_[loss_dep, np.ones(len(eu), dtype=bool)]
    remote = inst_dev[iu] != inst_dev[iv]
    iu, iv, pb, loss_dep = iu[remote], iv[remote], pb[remote], loss_dep[remote]
    key = iu * D + inst_dev[iv]
    uk, tinv = unique_ints(key, inverse=True)
    NT = len(uk)
    t_inst = uk // D
    t_dst = uk % D
    t_src = inst_dev[t_inst]
    t_bytes = np.zeros(NT)
    np.maximum.at(t_bytes, tinv, pb)
    return _Crossings(iu, iv, loss_dep, tinv), (t_inst, t_src, t_dst, t_bytes)


class _Build:
    """A compiled plan turned into tasks, transfers and all-reduces for one
    microbatch (the simulation repeats them per microbatch). Built in
    phases: replicas, crossings, tasks, dependencies, resources."""

    def __init__(self, problem: Problem, c: Compiled):
        p = problem
        ins = _instances(p, c)
        self.inst_op, self.inst_dev, self.frac = ins.op, ins.dev, ins.frac
        cr, (self.t_inst, self.t_src, self.t_dst, self.t_bytes) = \
            _crossings(p, ins, p.training, c.microbatches)
        tasks = self._tasks(p, c, ins, cr)
        self._dependencies(p, c, ins, cr, tasks)
        self._resources(p, c, ins, tasks)

    def _tasks(self, p: Problem, c: Compiled, ins: _Instances, cr: _Crossings) -> _Tasks:
        """Each replica's forward and backward time and the segments they
        are cut into (pieces, or runs cut where inputs arrive)."""
        m, D, n, training, g = c.microbatches, p.n_devices, p.n_ops, p.training, c.op_group
        inst_op, inst_dev, frac, inst_k = ins.op, ins.dev, ins.frac, ins.k
        iv, loss_dep, t_inst = cr.iv, cr.loss_dep, self.t_inst
        NI, NT = len(inst_op), len(self.t_inst)
        bt = None
        # --- segments ---------------------------------------------------------
        times = p.times
        if times is None:
            ft = p.op_overhead + p.flops[inst_op] * frac / m / p.rate[inst_dev]
        else:
            inst_cls = times.cls[inst_dev]
            ft = p.op_overhead + times.forward[inst_op, inst_cls] * frac / m
        fixed_f = fixed_b = 0.0
        if p.has_fixed:
            # an op's fixed part is paid whole by each microbatch and replica
            whole = (1.0 - frac / m) / p.rate[inst_dev]
            fixed_f = p.fixed_flops[inst_op, 0] * whole
            fixed_b = p.fixed_flops[inst_op, 1] * whole
            ft = ft + fixed_f
        pieces = p.granularity == "piece"
        if pieces:
            # the runtime's tasks: each piece whole (see Problem's granularity)
            piece = _pieces(p, g)
            head = np.zeros(n, dtype=bool)
            head[np.unique(piece, return_index=True)[1]] = True     # a task per piece
        else:
            # a run of consecutive ops on one group is one task of a runtime
            head = np.ones(n, dtype=bool)
            head[1:] = g[1:] != g[:-1]
        if p.task_overhead:
            task = p.task_overhead * head[inst_op]
            ft = ft + task
        loss_b = None
        loss_w = np.zeros(NI)
        if training and p.has_loss and times is None:
            # the loss runs whole, forward and backward, on the group's first
            # device (see Problem), not split over the replicas; it is
            # charged at the start of that replica's backward, which waits
            # for every replica's rows (below)
            lf = p.loss_flops[inst_op, 0] / m / p.rate[inst_dev]
            lb = p.loss_flops[inst_op, 1] / m / p.rate[inst_dev]
            # the part that does not shrink with the rows, whole per microbatch
            fixed = p.loss_fixed[inst_op].sum(axis=1) * (1.0 - 1.0 / m) / p.rate[inst_dev]
            ft = ft - lf * frac
            loss_w = (inst_k == 0) * (lf + lb + fixed)
            loss_b = lb * frac - loss_w
        has_in = np.zeros(NI, dtype=bool)
        has_in[iv] = True
        has_out = np.zeros(NI, dtype=bool)
        has_out[t_inst] = True
        if pieces:
            # a piece starts once all its inputs are there and sends its
            # outputs when it ends, as the runtime runs it
            inst_piece = piece[inst_op]
            permF = np.lexsort((inst_op, inst_piece, inst_dev))
            first = _piece_heads(inst_dev, inst_piece, permF)
            fseg, foff, fdev, fdur = _segments(inst_dev, first, has_out, permF, ft, D, 0.0)
            foff = fdur[fseg]
        else:
            permF = np.argsort(inst_dev, kind="stable")
            fseg, foff, fdev, fdur = _segments(inst_dev, has_in, has_out, permF, ft, D,
                                               p.merge)
        NF = len(fdev)
        if training:
            if times is None:
                bt = p.op_overhead + p.bwd_flops[inst_op] * frac / m / p.rate[inst_dev]
            else:
                bt = p.op_overhead + times.backward[inst_op, inst_cls] * frac / m
            bt = bt + fixed_b
            if p.task_overhead:
                bt = bt + task
            if loss_b is not None:
                bt = bt - loss_b
            if p.recompute:
                bt = bt + ft
            if pieces:
                permB = np.lexsort((-inst_op, -inst_piece, inst_dev))
                head_b = _piece_heads(inst_dev, inst_piece, permB)
            else:
                permB = np.lexsort((-inst_op, inst_dev))
                head_b = has_out
            if loss_dep.any():
                # the loss's replica starts a backward segment: it waits there
                head_b = head_b.copy()
                head_b[iv[loss_dep]] = True
            bseg, boff, bdev, bdur = _segments(inst_dev, head_b, has_in, permB, bt, D,
                                               0.0 if pieces else p.merge)
            bend = boff
            if pieces:
                boff = bdur[bseg]
        else:
            bseg = boff = bend = None
            bdev = np.zeros(0, dtype=np.int64)
            bdur = np.zeros(0)
        NB = len(bdev)
        NS = NF + NB
        self.NF, self.NB, self.NS, self.NT = NF, NB, NS, NT
        self.task_dev = np.r_[fdev, bdev].astype(np.int64)
        self.task_dur = np.r_[fdur, bdur]
        self.fseg, self.bseg = fseg, bseg

        return _Tasks(ft, bt, loss_w, fdev, foff, bdev, boff, bend)

    def _dependencies(self, p: Problem, c: Compiled, ins: _Instances, cr: _Crossings,
                      tk: _Tasks) -> None:
        """Who waits for whom inside one microbatch (the next task of a
        device, transfers' senders and receivers) and what messages cost
        the tasks at both ends."""
        m, D, training = c.microbatches, p.n_devices, p.training
        inst_op = ins.op
        iv, loss_dep, tinv = cr.iv, cr.loss_dep, cr.tinv
        t_inst, t_bytes = self.t_inst, self.t_bytes
        NF, NB, NS, NT = self.NF, self.NB, self.NS, self.NT
        fseg, bseg, foff, boff = self.fseg, self.bseg, tk.foff, tk.boff
        fdev, bdev, bt, loss_w = tk.fdev, tk.bdev, tk.bt, tk.loss_w
        # --- dependencies inside one microbatch -----------------------------
        NX = NT * 2 if training else NT
        self.NX = NX
        pend = np.zeros(NS, dtype=np.int64)
        task_dev = self.task_dev
        # a task's successor on its device in the same phase (-1: none)
        nxt = np.full(NS, -1, dtype=np.int64)
        same = np.flatnonzero(task_dev[1:] == task_dev[:-1])
        same = same[same != NF - 1]                 # no chain across the phases
        nxt[same] = same + 1
        pend[same + 1] += 1
        self.first_f, self.last_f = _ends(fdev, D, 0)
        # forward transfers: sent by the producing segment (in transfer
        # order), received by every consuming segment
        o_seg = [fseg[t_inst]]
        o_x = [np.arange(NT, dtype=np.int64)]
        o_off = [foff[t_inst]]
        x_npend = np.zeros(NX, dtype=np.int64)
        x_npend[:NT] = 1
        fwd = ~loss_dep
        pairs = unique_ints(tinv[fwd] * NF + fseg[iv[fwd]]) if NT else np.zeros(0, dtype=np.int64)
        c_x = [pairs // NF]
        c_s = [pairs % NF]
        if loss_dep.any():
            pairs = unique_ints(tinv[loss_dep] * NB + bseg[iv[loss_dep]])
            c_x.append(pairs // NB)
            c_s.append(NF + pairs % NB)
        if training:
            self.first_b, self.last_b = _ends(bdev, D, NF)
            # backward transfers: sent by every consuming segment (the last
            # of its ops' offsets), in order of first appearance, to the
            # producing segment
            # a value that requires no gradient (indices, masks) gets none
            # back: no transfer, and its producer's backward waits for none
            grad = p.output_grad[inst_op[t_inst]]
            if len(iv):
                key = tinv * NB + bseg[iv]
                uk, first, inv = unique_ints(key, index=True, inverse=True)
                off = np.full(len(uk), -1.0)
                sent = boff[iv]
                if loss_dep.any():
                    # the gradient of the rows leaves once the loss is done,
                    # before the loss's replica runs its own backward (also
                    # when that backward is a piece's, as the runtime's sink
                    # task sends it)
                    sent = np.where(loss_dep, tk.bend[iv] - (bt - loss_w)[iv], sent)
                np.maximum.at(off, inv, sent)
                order = np.argsort(first, kind="stable")
                uk, off = uk[order], off[order]
                keep = grad[uk // NB]
                uk, off = uk[keep], off[keep]
                o_seg.append(NF + uk % NB)
                o_x.append(NT + uk // NB)
                o_off.append(off)
                x_npend[NT:] = np.bincount(uk // NB, minlength=NT)
            c_x.append(NT + np.flatnonzero(grad))
            c_s.append(NF + bseg[t_inst[grad]])
            used_b = self.first_b >= 0
            pend[self.first_b[used_b]] += 1      # waits for this device's forward
        else:
            self.first_b = self.last_b = np.full(D, -1, dtype=np.int64)
        seg_all = np.concatenate(o_seg)
        order = np.argsort(seg_all, kind="stable")
        self.ox_ptr = _pointers(seg_all, NS)
        self.ox_x = np.concatenate(o_x)[order].astype(np.int64)
        self.ox_off = np.concatenate(o_off)[order].astype(float)
        cons_x = np.concatenate(c_x).astype(np.int64)
        cons_s = np.concatenate(c_s).astype(np.int64)
        # bytes each transfer moves per microbatch (gradients go back as well)
        # backward transfers of values that require no gradient are never sent
        sent = np.r_[np.ones(NT, dtype=bool), grad] if training else np.ones(NT, dtype=bool)
        self.x_sent = sent
        self.x_bytes = (np.r_[t_bytes, t_bytes] if training else t_bytes) * sent / m
        if p.message_overhead or p.message_copy_rate < np.inf:
            # every message costs its sender's and its receiver's task time:
            # a segment's receives before its work, each send before it
            # leaves (a send's offset moves by those and the sends before it)
            cost = (p.message_overhead + self.x_bytes / p.message_copy_rate) * sent  # per end
            seg_sorted = seg_all[order]
            own = cost[self.ox_x]
            sends = np.bincount(seg_sorted, own, minlength=NS)
            recvs = np.bincount(cons_s, cost[cons_x], minlength=NS)
            upto = np.cumsum(own)
            first = self.ox_ptr[seg_sorted]
            within = upto - (upto[first] - own[first])   # this send and those before it
            self.ox_off = self.ox_off + recvs[seg_sorted] + within
            self.task_dur = self.task_dur + sends + recvs
        order = np.argsort(cons_x, kind="stable")
        self.xc_ptr = _pointers(cons_x, NX)
        self.xc_s = cons_s[order]
        pend += np.bincount(cons_s, minlength=NS)
        self.pend, self.nxt, self.x_npend = pend, nxt, x_npend

    def _resources(self, p: Problem, c: Compiled, ins: _Instances, tk: _Tasks) -> None:
        """In-flight caps, the transfers' links and interfaces, the
        all-reduce buckets and the peak memory."""
        m, D, n, training, g = c.microbatches, p.n_devices, p.n_ops, p.training, c.op_group
        inst_op, inst_dev, frac, op_first, sizes = ins.op, ins.dev, ins.frac, ins.first, \
            ins.sizes
        NI, NF = len(inst_op), self.NF
        t_src, t_dst, t_bytes, sent = self.t_src, self.t_dst, self.t_bytes, self.x_sent
        bseg, boff = self.bseg, tk.boff
        # 1F1B: in-flight cap per device by the order of first ops
        first_op = np.full(D, n, dtype=np.int64)
        np.minimum.at(first_op, inst_dev, inst_op)
        used = first_op < n
        self.used = used
        self.first_op = first_op
        run = np.r_[0, np.cumsum(g[1:] != g[:-1])] if n else np.zeros(0, dtype=np.int64)
        runs = int(run[-1]) + 1 if n else 0
        run_first = run[np.minimum(first_op, max(n - 1, 0))] if n else np.zeros(D)
        self.held = inflight(p, run_first, runs, used, m, c.schedule)
        self.cap = self.held.astype(np.int64)

        # transfer resources
        xs = np.r_[t_src, t_dst] if training else t_src
        xd = np.r_[t_dst, t_src] if training else t_dst
        speed = np.minimum(p.bandwidth[xs, xd], np.minimum(p.nic_bandwidth[xs],
                                                           p.nic_bandwidth[xd]))
        self.x_src, self.x_dst = xs, xd
        self.x_dur = self.x_bytes / speed
        # a fast interface is held only for its share of a slower link's time
        self.x_hold_out = self.x_bytes / p.nic_bandwidth[xs]
        self.x_hold_in = self.x_bytes / p.nic_bandwidth[xd]
        self.x_lat = p.latency[xs, xd] * sent

        # --- all-reduce buckets ---------------------------------------------
        self.ar = []   # (sources [(local B task, offset)], members, seconds, links)
        if training and NI > n:
            dp = np.flatnonzero((sizes > 1) & (p.param_bytes > 0))
            by_group: dict[int, list[int]] = {}
            for op in dp.tolist():
                by_group.setdefault(int(g[op]), []).append(op)
            cap = p.bucket_bytes if c.bucket_bytes is None else c.bucket_bytes
            overlap = p.allreduce_overlap if c.overlap is None else c.overlap
            for gid, ops in by_group.items():
                mem = c.groups[gid]
                back = ops[::-1]                    # backward order
                cum = np.cumsum(p.param_bytes[back])
                total = float(cum[-1])
                count = max(1, int(np.ceil(total / cap - 1e-9)))
                # bucket k holds bytes [k cap, (k+1) cap) and is ready when the
                # op holding its last byte finished its backward
                ends = np.minimum((np.arange(count) + 1) * cap, total)
                lastpos = np.minimum(np.searchsorted(cum, ends - 1e-6 * cap), len(back) - 1)
                sizes_b = np.diff(np.r_[0.0, ends])
                for last_i, nbytes in zip(lastpos.tolist(), sizes_b.tolist()):
                    last = back[last_i]
                    sources = []
                    for k in range(len(mem)):
                        if overlap:
                            i = op_first[last] + k
                            sources.append((NF + int(bseg[i]), float(boff[i])))
                        else:   # after the member's last task of the step
                            t = int(self.last_b[mem[k]])
                            sources.append((t, float(self.task_dur[t])))
                    seconds, links, algo = _allreduce(p, mem, nbytes)
                    self.ar.append((sources, list(mem), seconds, links, algo, nbytes))

        # memory
        params = np.bincount(inst_dev, p.param_bytes[inst_op], minlength=D)
        acts = np.bincount(inst_dev, p.output_bytes[inst_op] * frac, minlength=D)
        recv = np.bincount(t_dst, t_bytes, minlength=D)
        ws = np.zeros(D)
        np.maximum.at(ws, inst_dev, p.workspace_bytes[inst_op] * frac / m)
        self.peak = peak_memory(p, params, acts, recv, ws, self.held, m)




def _run(problem: Problem, b: _Build, c: Compiled):
    """The event loop (:func:`placer.cost.event_loop.run_events`). Returns
    the end time, task starts, transfer starts and all-reduce (start, end)
    per bucket."""
    from .event_loop import run_events
    m = c.microbatches
    NS, NX, NF = b.NS, b.NX, b.NF
    D = problem.n_devices
    gpipe = c.schedule == "gpipe"
    training = problem.training
    pend = np.tile(b.pend, m)
    if training and m > 1 and not gpipe:
        # 1F1B: a device's first forward of microbatch j waits for its last
        # backward of microbatch j - cap
        for d in np.flatnonzero(b.first_f >= 0).tolist():
            pend[np.arange(int(b.cap[d]), m) * NS + b.first_f[d]] += 1
    f_to_b = np.full(NS, -1, dtype=np.int64)
    b_to_f = np.full(NS, -1, dtype=np.int64)
    b_to_f_cap = np.zeros(NS, dtype=np.int64)
    if training:
        used = b.first_b >= 0
        f_to_b[b.last_f[used]] = b.first_b[used]
        if not gpipe:
            b_to_f[b.last_b[used]] = b.first_f[used]
            b_to_f_cap[b.last_b[used]] = b.cap[used]
    later = m * NS              # priority offset of the phase that waits
    prio = np.where((np.arange(NS) >= NF) == gpipe, later, 0).astype(np.int64)
    ar_task = [s for sources, *_ in b.ar for s, _off in sources]
    ar_k = np.array([k for k, a in enumerate(b.ar) for _ in a[0]], dtype=np.int64)
    ar_off = np.array([off for sources, *_ in b.ar for _s, off in sources], dtype=float)
    order = np.argsort(np.array(ar_task, dtype=np.int64), kind="stable")
    ar_ptr = _pointers(np.array(ar_task, dtype=np.int64), NS)
    ar_mem_ptr = _pointers(np.repeat(np.arange(len(b.ar)), [len(a[1]) for a in b.ar]),
                           len(b.ar))
    ar_mem = np.array([x for a in b.ar for x in a[1]], dtype=np.int64)
    n_ar = len(b.ar)
    ar_pending = np.array([len(a[0]) for a in b.ar], dtype=np.int64)
    ar_seconds = np.array([a[2] for a in b.ar], dtype=float)
    start = np.zeros(NS * m)
    x_start = np.zeros(NX * m)
    ar_s = np.zeros(n_ar)
    ar_e = np.zeros(n_ar)
    end_time, stuck = run_events(
        m, NS, NX, D, gpipe, training, pend, np.tile(b.x_npend, m),
        b.task_dur, b.task_dev, prio, b.nxt, b.ox_ptr, b.ox_x, b.ox_off, b.xc_ptr, b.xc_s,
        f_to_b, b_to_f, b_to_f_cap,
        b.x_src.astype(np.int64), b.x_dst.astype(np.int64), b.x_dur, b.x_lat,
        b.x_hold_out, b.x_hold_in, ar_ptr, ar_k[order], ar_off[order],
        ar_pending, ar_mem_ptr, ar_mem, ar_seconds, start, x_start, ar_s, ar_e,
        np.full(D, problem.resume_overhead), b.x_bytes,
        np.where(np.isfinite(problem.bandwidth), problem.link_burst, 0.0).ravel().astype(float))
    if stuck:
        raise RuntimeError("simulator deadlock: some tasks never became ready")
    return end_time, start, x_start, list(zip(ar_s.tolist(), ar_e.tolist()))


@register_cost_model
class Simulator(CostModel):
    """Discrete-event simulation of the plan's schedule (see the module doc).

    >>> from placer import Graph, Op, Edge, Cluster, Device, Plan
    >>> g = Graph("t", [Op("a", flops=1e9), Op("b", flops=1e9)], [Edge("a", "b", 1e6)],
    ...           training=False)
    >>> c = Cluster.from_rules("c", [Device("x", 1e12, 1e10, efficiency=1.0),
    ...                              Device("y", 1e12, 1e10, efficiency=1.0)],
    ...                        default=(1e9, 0.0))
    >>> r = Simulator().estimate(Problem(g, c, op_overhead=0.0),
    ...                          Plan({"a": ["x"], "b": ["y"]}, microbatches=1))
    >>> round(r.step_time, 6)        # 1 ms + 1 MB at 1 GB/s + 1 ms
    0.003
    """

    name = "simulator"

    def estimate(self, problem: Problem, plan: "Plan") -> Report:
        return self.estimate_compiled(problem, problem.compile(plan))

    def estimate_compiled(self, problem: Problem, c: Compiled, *,
                          timeline: bool = True) -> Report:
        """Estimate an already compiled plan (as the runtime runs it,
        :meth:`Problem.as_run`)."""
        c = problem.as_run_compiled(c)
        b = _Build(problem, c)
        step, starts, x_starts, ar_times = _run(problem, b, c)
        return _report(problem, c, b, step, starts, x_starts, ar_times, timeline)

    def step_times(self, problem: Problem, assignments, *, groups=(), microbatches: int = 1,
                   schedule: str = "1f1b") -> np.ndarray:
        rows = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        out = np.empty(len(rows))
        for i, row in enumerate(rows):
            c = problem.as_run_compiled(problem.compile_array(
                row, groups, microbatches=microbatches, schedule=schedule))
            b = _Build(problem, c)
            step = _run(problem, b, c)[0]
            out[i] = _objective(problem, b, step)
        return out


def _segment_ops(b: "_Build") -> dict[int, list[int]]:
    """Segment index -> the op indices it runs (forward segments, then
    backward ones offset by ``b.NF``)."""
    seg_ops: dict[int, list[int]] = {}
    for i, seg in enumerate(b.fseg.tolist()):
        seg_ops.setdefault(seg, []).append(int(b.inst_op[i]))
    if b.bseg is not None:
        for i, seg in enumerate(b.bseg.tolist()):
            seg_ops.setdefault(b.NF + seg, []).append(int(b.inst_op[i]))
    return seg_ops


def executed_orders(problem: Problem, plan: "Plan") -> dict:
    """Device name -> the tasks the simulation of ``plan`` runs on it, in
    order, as ``("F"|"B", microbatch, op ids)`` (a task is a segment of ops,
    see the module doc). :func:`placer.schedule.from_simulation` turns them
    into the runtime's schedule, so ranks run the order predicted."""
    c = problem.compile(plan)
    b = _Build(problem, c)
    _end, starts, _x, _ar = _run(problem, b, c)
    NS, NF = b.NS, b.NF
    seg_ops = _segment_ops(b)
    tasks = sorted(range(NS * c.microbatches),
                   key=lambda t: (int(b.task_dev[t % NS]), float(starts[t]), t))
    out: dict = {}
    for t in tasks:
        m, local = divmod(t, NS)
        ops = tuple(problem.ids[o] for o in seg_ops.get(local, []))
        out.setdefault(problem.devices[int(b.task_dev[local])], []).append(
            ("F" if local < NF else "B", m, ops))
    return out


def _objective(p: Problem, b: _Build, step: float) -> float:
    """The report's objective without building the report (search only
    needs this number; the report's per-device figures cost more than the
    simulation of a small graph)."""
    excess = b.peak - p.memory
    ratio = float((excess / p.memory).max()) if (excess > 0).any() else 0.0
    return float(p.objective_value(step, float((b.peak / p.memory).max()), ratio))


def _report(p: Problem, c: Compiled, b: _Build, step: float, starts, x_starts, ar_times,
            timeline: bool) -> Report:
    m = c.microbatches
    D = p.n_devices
    names = p.devices
    dur = np.tile(b.task_dur, m)
    tdev = np.tile(b.task_dev, m)
    nx = len(x_starts)
    xdur = np.tile(b.x_dur, m)
    xsrc = np.tile(b.x_src, m)
    xdst = np.tile(b.x_dst, m)
    compute = np.bincount(tdev, dur, minlength=D)
    comm = np.bincount(xsrc, xdur, minlength=D) + np.bincount(xdst, xdur, minlength=D)
    iv_dev = [tdev, xsrc, xdst]
    iv_s = [starts, x_starts, x_starts]
    iv_e = [starts + dur, x_starts + xdur, x_starts + xdur]
    link_bytes = np.zeros((D, D))
    np.add.at(link_bytes, (b.x_src, b.x_dst), b.x_bytes * m)
    link_busy = np.zeros((D, D))
    np.add.at(link_busy, (b.x_src, b.x_dst), b.x_dur * m)
    for (sources, mem, seconds, links, algo, nbytes), (s0, e0) in zip(b.ar, ar_times):
        for x in mem:
            comm[x] += seconds
        k = len(mem)
        iv_dev.append(np.array(mem))
        iv_s.append(np.full(k, s0))
        iv_e.append(np.full(k, e0))
        for a, d, nbytes_l in links:
            link_bytes[a, d] += nbytes_l
    devs = np.concatenate(iv_dev)
    s_all = np.concatenate(iv_s)
    e_all = np.concatenate(iv_e)
    busy = _union(devs, s_all, e_all, D, step)
    peak = b.peak
    excess = peak - p.memory
    over = excess > 0
    feasible = not over.any()
    objective = _objective(p, b, step)
    dev_util = busy / step if step > 0 else np.zeros(D)
    link_util = link_busy / step if step > 0 else link_busy
    bottleneck = ""
    if step > 0:
        comp_util = compute / step
        d = int(np.argmax(comp_util))
        li = int(np.argmax(link_util))
        a, z = divmod(li, D)
        if link_util.flat[li] > comp_util[d]:
            bottleneck = (f"link {names[a]}->{names[z]} (busy {link_util.flat[li]:.0%} "
                          f"of the step)")
        else:
            bottleneck = (f"device {names[d]} (compute {comp_util[d]:.0%}, busy "
                          f"{dev_util[d]:.0%} of the step)")
    nz = np.argwhere(link_bytes > 0)
    bytes_per_link = {f"{names[a]}->{names[z]}": float(link_bytes[a, z]) for a, z in nz}
    used = b.used | (peak > 0)
    dev_names = [names[i] for i in range(D) if used[i]]

    def pick(arr):
        return {names[i]: float(arr[i]) for i in range(D) if used[i]}

    report = Report(
        step_time=float(step), feasible=feasible, objective=float(objective),
        peak_memory=pick(peak), memory_excess={names[i]: float(excess[i])
                                               for i in np.flatnonzero(over)},
        busy=pick(busy), compute=pick(compute), comm=pick(comm),
        idle=pick(np.maximum(step - busy, 0.0)), bytes_per_link=bytes_per_link,
        bottleneck=bottleneck, model="simulator", microbatches=m, schedule=c.schedule,
        extra={"devices_used": dev_names, "transfers": int(nx),
               "allreduces": [{"devices": [names[x] for x in a[1]], "bytes": a[5],
                               "seconds": a[2], "algorithm": a[4]} for a in b.ar]})
    if timeline:
        report.timeline = _timeline(p, c, b, starts, x_starts, ar_times)
    return report


def _union(devs, starts, ends, D: int, step: float) -> np.ndarray:
    """Length of the union of intervals per device."""
    if len(devs) == 0:
        return np.zeros(D)
    span = step * 2 + 1.0
    s = starts + devs * span
    e = ends + devs * span
    order = np.argsort(s, kind="stable")
    s, e, dv = s[order], e[order], devs[order]
    prev = np.maximum.accumulate(e)
    prev = np.r_[-np.inf, prev[:-1]]
    gain = np.maximum(0.0, e - np.maximum(s, prev))
    return np.bincount(dv, gain, minlength=D)


def _timeline(p: Problem, c: Compiled, b: _Build, starts, x_starts, ar_times):
    """A callable producing the timeline's events (built on demand)."""
    def events():
        names = p.devices
        m = c.microbatches
        NS, NF = b.NS, b.NF
        seg_ops = _segment_ops(b)
        out = []
        for task in range(NS * m):
            mb, local = divmod(task, NS)
            ops = seg_ops.get(local, [])
            phase = "forward" if local < NF else "backward"
            label = p.ids[min(ops)] if ops else "?"
            if len(ops) > 1:
                label += f" +{len(ops) - 1}"
            out.append(Event(names[int(b.task_dev[local])], f"{phase[0].upper()}{mb} {label}",
                             phase, float(starts[task]), float(b.task_dur[local]),
                             {"microbatch": mb, "ops": [p.ids[o] for o in ops[:50]]}))
        for gx in range(len(x_starts)):
            mb, x = divmod(gx, b.NX)
            if not b.x_sent[x]:
                continue          # no gradient goes back (see _Build)
            a, z = int(b.x_src[x]), int(b.x_dst[x])
            kind = "activation" if x < b.NT else "gradient"
            op = p.ids[int(b.inst_op[b.t_inst[x % b.NT]])]
            out.append(Event(f"{names[a]}->{names[z]}", f"{kind} {op} mb{mb}", "transfer",
                             float(x_starts[gx]), float(b.x_dur[x]),
                             {"bytes": float(b.x_bytes[x]), "latency": float(b.x_lat[x]),
                              "microbatch": int(mb)}))
        for (sources, mem, seconds, links, algo, nbytes), (s0, e0) in zip(b.ar, ar_times):
            for x in mem:
                out.append(Event(names[x], f"all-reduce {nbytes / 1e6:.3g} MB ({algo})",
                                 "allreduce", s0, e0 - s0, {"bytes": nbytes}))
        return out
    return events

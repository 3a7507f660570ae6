"""The simulator's event loop, compiled with numba.

:func:`run_events` is the whole discrete-event simulation of
:mod:`placer.cost.simulator` on flat arrays: task dependencies, per-device
ready queues ordered by schedule priority, directed links served first come
first served, network interfaces, and the all-reduces' collective streams.
The Python loop it replaces spent three quarters of a simulation in heap
operations and list indexing; compiled, the loop is a small part of one.

Every heap here orders by a unique key, so the order in which events and
tasks are taken does not depend on the heap's layout: results are the same
as a Python ``heapq`` version's, bit for bit. With ``NUMBA_DISABLE_JIT=1``
the same code runs as plain Python (slowly), which is what the tests compare
against.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

DONE, XREADY, XARRIVE, LINKFREE = 0, 1, 2, 3


@njit(cache=True)
def segment_heads(dev, head, blocker, dur, limit):
    """Where segments start, for instances in device order (see
    :func:`placer.cost.simulator._segments`): at a device change, or at an
    instance receiving from another device (``head``) unless the running
    segment sends nothing away (``blocker``) and has run at most its
    device's ``limit``."""
    n = len(dev)
    h = np.zeros(n, np.bool_)
    prev = -1
    run = 0.0
    blocked = False
    for pos in range(n):
        d = dev[pos]
        if d != prev or (head[pos] and (blocked or run > limit[d])):
            h[pos] = True
            run = 0.0
            blocked = False
            prev = d
        run += dur[pos]
        if blocker[pos]:
            blocked = True
    return h


#: the event heap: times, sequence numbers (equal times: first pushed first),
#: kinds, ids; ``count`` holds [events in the heap, last sequence number]
Events = namedtuple("Events", "t q kind ident count")
#: per-device ready heaps (device ``d``'s: ``heap[base[d]:]``, ``size[d]``
#: keys), whether each device is idle, when its last task ended, and the
#: seconds a task that does not follow its device's previous one starts late
Devices = namedtuple("Devices", "heap base size idle free_at resume")
#: tasks: ``m`` microbatches of ``NS`` local tasks; per global task
#: (``mb * NS + local``) unmet inputs and start time, per local task its
#: duration, device, priority offset, successor on its device and the
#: schedule's hops between a device's phases; ``later`` the offset of the
#: phase that waits
Tasks = namedtuple("Tasks", "m NS gpipe training later pend start dur dev prio nxt "
                            "f_to_b b_to_f b_to_f_cap")
#: transfers between tasks: ``NX`` per microbatch, unmet inputs and ready
#: time per global transfer (``mb * NX + local``), CSR of the transfers each
#: local task sends (with offsets from its start) and of the tasks each
#: transfer feeds
Sends = namedtuple("Sends", "NX pend ready ox_ptr ox_x ox_off xc_ptr xc_s")
#: directed links ``a * D + b`` and network interfaces: per local transfer
#: its ends, link seconds, latency, interface holds and bytes; per global
#: transfer its start; per link a token bucket (size ``burst``, ``tokens``
#: at ``tok_t``), when it frees and its first-come-first-served queue
Links = namedtuple("Links", "D src dst dur lat hold_out hold_in nbytes x_start burst "
                            "tokens tok_t free head tail next nic_out nic_in")
#: all-reduce buckets: CSR of the buckets each local task of the last
#: microbatch readies (with offsets), per bucket unmet sources, ready time,
#: seconds, member devices (CSR), start and end; per device its collective
#: stream's free time
Buckets = namedtuple("Buckets", "ptr k off pending ready seconds mem_ptr mem s e coll")


@njit(cache=True)
def _ev_push(ev, time, kind, ident):
    """Push an event at ``time`` with the next sequence number."""
    t, q, k, x = ev.t, ev.q, ev.kind, ev.ident
    seq = ev.count[1] + 1
    ev.count[1] = seq
    i = ev.count[0]
    while i > 0:
        parent = (i - 1) >> 1
        if t[parent] < time or (t[parent] == time and q[parent] < seq):
            break
        t[i], q[i], k[i], x[i] = t[parent], q[parent], k[parent], x[parent]
        i = parent
    t[i], q[i], k[i], x[i] = time, seq, kind, ident
    ev.count[0] += 1


@njit(cache=True)
def _ev_pop(ev):
    """Remove the earliest event; returns its (time, kind, id)."""
    t, q, kind, ident = ev.t, ev.q, ev.kind, ev.ident
    top = (t[0], kind[0], ident[0])
    n = ev.count[0] - 1
    ev.count[0] = n
    if n == 0:
        return top
    lt, lq, lk, lx = t[n], q[n], kind[n], ident[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (t[c + 1] < t[c] or (t[c + 1] == t[c] and q[c + 1] < q[c])):
            c += 1
        if lt < t[c] or (lt == t[c] and lq < q[c]):
            break
        t[i], q[i], kind[i], ident[i] = t[c], q[c], kind[c], ident[c]
        i = c
    t[i], q[i], kind[i], ident[i] = lt, lq, lk, lx
    return top


@njit(cache=True)
def _rq_push(dv, d, key):
    """Push ``key`` onto device ``d``'s ready heap."""
    heap = dv.heap
    b = dv.base[d]
    i = dv.size[d]
    while i > 0:
        parent = (i - 1) >> 1
        if heap[b + parent] < key:
            break
        heap[b + i] = heap[b + parent]
        i = parent
    heap[b + i] = key
    dv.size[d] += 1


@njit(cache=True)
def _rq_pop(dv, d):
    """Pop the smallest key of device ``d``'s ready heap."""
    heap = dv.heap
    b = dv.base[d]
    top = heap[b]
    n = dv.size[d] - 1
    dv.size[d] = n
    if n > 0:
        last = heap[b + n]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and heap[b + c + 1] < heap[b + c]:
                c += 1
            if last < heap[b + c]:
                break
            heap[b + i] = heap[b + c]
            i = c
        heap[b + i] = last
    return top


@njit(cache=True)
def _release(tk, dv, t, s):
    """Global task ``t`` (local ``s``) has one input less; at none it joins
    its device's ready heap. Returns whether it did."""
    tk.pend[t] -= 1
    if tk.pend[t] == 0:
        _rq_push(dv, tk.dev[s], t + tk.prio[s])
        return True
    return False


@njit(cache=True)
def _send_ready(sd, ev, mb, local, now):
    """Task ``local`` of microbatch ``mb`` started at ``now``: the transfers
    it sends are ready once their producing op ends."""
    base = mb * sd.NX
    for j in range(sd.ox_ptr[local], sd.ox_ptr[local + 1]):
        gx = base + sd.ox_x[j]
        t = now + sd.ox_off[j]
        if t > sd.ready[gx]:
            sd.ready[gx] = t
        sd.pend[gx] -= 1
        if sd.pend[gx] == 0:
            _ev_push(ev, sd.ready[gx], XREADY, gx)


@njit(cache=True)
def _buckets_ready(bk, local, now):
    """Task ``local`` of the last microbatch started at ``now``: time the
    all-reduce buckets it completes."""
    for j in range(bk.ptr[local], bk.ptr[local + 1]):
        k = bk.k[j]
        t = now + bk.off[j]
        if t > bk.ready[k]:
            bk.ready[k] = t
        bk.pending[k] -= 1
        if bk.pending[k] == 0:
            # a device's all-reduces run one at a time on a collective
            # stream of their own (as NCCL's), beside point-to-point traffic
            s0 = bk.ready[k]
            for i in range(bk.mem_ptr[k], bk.mem_ptr[k + 1]):
                if bk.coll[bk.mem[i]] > s0:
                    s0 = bk.coll[bk.mem[i]]
            e0 = s0 + bk.seconds[k]
            for i in range(bk.mem_ptr[k], bk.mem_ptr[k + 1]):
                bk.coll[bk.mem[i]] = e0
            bk.s[k] = s0
            bk.e[k] = e0


@njit(cache=True)
def _start_task(tk, sd, bk, ev, dv, d, now):
    """Start device ``d``'s most urgent ready task if it is idle: schedule
    its end, ready the transfers (and, in the last microbatch, the
    all-reduce buckets) it completes. A task that does not follow its
    device's previous one at once (the device waited, or it is the first)
    starts ``resume[d]`` late."""
    if not dv.idle[d] or dv.size[d] == 0:
        return
    key = _rq_pop(dv, d)
    task = key - tk.later if key >= tk.later else key
    dv.idle[d] = False
    if now > dv.free_at[d]:
        now = now + dv.resume[d]
    tk.start[task] = now
    mb = task // tk.NS
    local = task - mb * tk.NS
    _ev_push(ev, now + tk.dur[local], DONE, task)
    _send_ready(sd, ev, mb, local, now)
    if mb == tk.m - 1:
        _buckets_ready(bk, local, now)


@njit(cache=True)
def _phase_hops(tk, dv, mb, local):
    """The schedule's hops from finished task ``local`` of microbatch ``mb``
    to its device's other phase; returns the device a backward-to-forward
    hop readied a task on (-1: none)."""
    NS, m = tk.NS, tk.m
    s = tk.f_to_b[local]
    if s >= 0:
        if tk.gpipe:
            if mb == m - 1:
                for j in range(m):
                    _release(tk, dv, j * NS + s, s)
        else:
            _release(tk, dv, mb * NS + s, s)
    s = tk.b_to_f[local]
    if s >= 0 and mb + tk.b_to_f_cap[local] < m:
        if _release(tk, dv, (mb + tk.b_to_f_cap[local]) * NS + s, s):
            return tk.dev[s]
    return -1


@njit(cache=True)
def _finish_task(tk, sd, bk, ev, dv, task, now):
    """Global ``task`` ended at ``now``: free its device, release its
    successors, start the next tasks."""
    mb = task // tk.NS
    local = task - mb * tk.NS
    d = tk.dev[local]
    dv.idle[d] = True
    dv.free_at[d] = now
    s = tk.nxt[local]
    if s >= 0:
        _release(tk, dv, mb * tk.NS + s, s)
    other = _phase_hops(tk, dv, mb, local) if tk.training else -1
    _start_task(tk, sd, bk, ev, dv, d, now)
    if other >= 0:
        _start_task(tk, sd, bk, ev, dv, other, now)


@njit(cache=True)
def _burst_share(lk, link, x, t0, dur):
    """The share of transfer ``x``'s bytes that the token bucket in front of
    ``link`` does not cover at ``t0`` (the bucket refills at the link's
    rate; a ``tc tbf`` shaper lets a burst through at once)."""
    if not (lk.burst[link] > 0.0 and dur > 0.0):
        return 1.0
    nbytes = lk.nbytes[x]
    rate = nbytes / dur
    level = lk.tokens[link] + (t0 - lk.tok_t[link]) * rate
    if level > lk.burst[link]:
        level = lk.burst[link]
    if level >= nbytes:
        lk.tokens[link] = level - nbytes
        lk.tok_t[link] = t0
        return 0.0
    share = (nbytes - level) / nbytes
    lk.tokens[link] = 0.0
    lk.tok_t[link] = t0 + dur * share
    return share


@njit(cache=True)
def _transmit(lk, ev, gx, x, link, now):
    """Send global transfer ``gx`` (local ``x``) over its free ``link`` once
    both network interfaces are free; returns when the link frees. The
    interfaces are held only once the link is free, so a tensor queued
    behind a slow link does not block the device's others."""
    a = lk.src[x]
    b = lk.dst[x]
    t0 = now
    if lk.nic_out[a] > t0:
        t0 = lk.nic_out[a]
    if lk.nic_in[b] > t0:
        t0 = lk.nic_in[b]
    dur = lk.dur[x]
    share = _burst_share(lk, link, x, t0, dur)
    dur = dur * share               # exact when the bucket covers nothing (1.0)
    t1 = t0 + dur
    lk.free[link] = t1
    lk.nic_out[a] = t0 + lk.hold_out[x] * share
    lk.nic_in[b] = t0 + lk.hold_in[x] * share
    lk.x_start[gx] = t0
    _ev_push(ev, t1 + lk.lat[x], XARRIVE, gx)
    return t1


@njit(cache=True)
def _transfer_ready(lk, ev, NX, gx, now):
    """Global transfer ``gx`` is ready: send it, or queue it behind its busy
    link (one tensor at a time per link, first come first served; the first
    in line asks to be woken when the link frees)."""
    x = gx % NX
    link = lk.src[x] * lk.D + lk.dst[x]
    if lk.free[link] > now:
        if lk.head[link] < 0:
            _ev_push(ev, lk.free[link], LINKFREE, link)
            lk.head[link] = gx
        else:
            lk.next[lk.tail[link]] = gx
        lk.tail[link] = gx
        lk.next[gx] = -1
        return
    _transmit(lk, ev, gx, x, link, now)


@njit(cache=True)
def _link_freed(lk, ev, NX, link, now):
    """``link`` is free: send the first transfer in its queue."""
    gx = lk.head[link]
    lk.head[link] = lk.next[gx]
    if lk.head[link] < 0:
        lk.tail[link] = -1
    t1 = _transmit(lk, ev, gx, gx % NX, link, now)
    if lk.head[link] >= 0:
        _ev_push(ev, t1, LINKFREE, link)


@njit(cache=True)
def _arrive(tk, sd, bk, ev, dv, gx, now):
    """Global transfer ``gx`` arrived: the tasks it feeds have an input
    less; start those that became ready on idle devices."""
    mb = gx // sd.NX
    x = gx - mb * sd.NX
    base = mb * tk.NS
    for j in range(sd.xc_ptr[x], sd.xc_ptr[x + 1]):
        s = sd.xc_s[j]
        if _release(tk, dv, base + s, s):
            _start_task(tk, sd, bk, ev, dv, tk.dev[s], now)


@njit(cache=True)
def _simulate(tk, sd, lk, bk, ev, dv):
    """Take events in time order until none is left; returns (end time,
    number of tasks never run)."""
    for task in range(tk.m * tk.NS):
        if tk.pend[task] == 0:
            local = task % tk.NS
            _rq_push(dv, tk.dev[local], task + tk.prio[local])
    for d in range(lk.D):
        _start_task(tk, sd, bk, ev, dv, d, 0.0)
    end_time = 0.0
    while ev.count[0] > 0:
        now, kind, ident = _ev_pop(ev)
        if kind == DONE:
            end_time = now
            _finish_task(tk, sd, bk, ev, dv, ident, now)
        elif kind == XREADY:
            _transfer_ready(lk, ev, sd.NX, ident, now)
        elif kind == LINKFREE:
            _link_freed(lk, ev, sd.NX, ident, now)
        else:
            if now > end_time:
                end_time = now
            _arrive(tk, sd, bk, ev, dv, ident, now)
    stuck = 0
    for task in range(tk.m * tk.NS):
        if tk.pend[task] > 0:
            stuck += 1
    for k in range(len(bk.e)):
        if bk.e[k] > end_time:
            end_time = bk.e[k]
    return end_time, stuck


@njit(cache=True)
def _devices(tk, D, resume):
    """Empty ready heaps, each sized by its device's task count; every
    device idle and never run."""
    base = np.zeros(D, np.int64)
    for s in range(tk.NS):
        if tk.dev[s] + 1 < D:
            base[tk.dev[s] + 1] += tk.m
    for d in range(1, D):
        base[d] += base[d - 1]
    return Devices(np.empty(max(tk.m * tk.NS, 1), np.int64), base, np.zeros(D, np.int64),
                   np.ones(D, np.bool_), np.full(D, -1.0), resume)


@njit(cache=True)
def _events(cap):
    """An empty event heap of ``cap`` places."""
    return Events(np.empty(cap), np.empty(cap, np.int64), np.empty(cap, np.int64),
                  np.empty(cap, np.int64), np.zeros(2, np.int64))


@njit(cache=True)
def run_events(m, NS, NX, D, gpipe, training,
               pend, x_pend, task_dur, task_dev, prio, nxt,
               ox_ptr, ox_x, ox_off, xc_ptr, xc_s,
               f_to_b, b_to_f, b_to_f_cap,
               xs, xd, xdur, xlat, x_out, x_in,
               ar_ptr, ar_k, ar_off, ar_pending, ar_mem_ptr, ar_mem, ar_seconds,
               start, x_start, ar_s, ar_e, resume, x_bytes, burst):
    """Simulate; fills ``start``, ``x_start``, ``ar_s``/``ar_e`` and returns
    (end time, number of tasks never run).

    ``burst`` (per directed link ``a * D + b``, bytes; 0: none) is a token
    bucket in front of the link, full at the start and refilled at the
    link's rate: a transfer of ``x_bytes`` takes only the bytes the bucket
    cannot cover at that rate (a ``tc tbf`` shaper lets a burst through at
    once).

    ``pend``/``x_pend`` are per global task (``mb * NS + local``) and
    transfer (``mb * NX + local``) counts of unmet inputs, consumed in place.
    ``nxt`` is each local task's successor on its device (-1: none);
    ``f_to_b``/``b_to_f`` the schedule's hops between a device's phases.
    CSR arrays: ``ox_*`` the transfers each local task sends (with their
    offsets from its start), ``xc_*`` the tasks each transfer feeds, ``ar_*``
    the all-reduce buckets each local task of the last microbatch readies,
    ``ar_mem*`` each bucket's devices.

    The arrays are bundled by what they describe (:class:`Tasks`,
    :class:`Sends`, :class:`Links`, :class:`Buckets`) with the loop's state
    (:class:`Events`, :class:`Devices`) and handed to :func:`_simulate`::

        ready tasks join their device's heap; every idle device starts one
        while events are left, take the earliest:
            DONE     free the device, release successors, start next tasks
            XREADY   send over the link, or queue behind it
            LINKFREE send the link's first queued transfer
            XARRIVE  release the tasks it feeds, start them if idle
    """
    n_x = NX * m
    tk = Tasks(m, NS, gpipe, training, NS * m, pend, start, task_dur, task_dev, prio, nxt,
               f_to_b, b_to_f, b_to_f_cap)
    sd = Sends(NX, x_pend, np.zeros(n_x), ox_ptr, ox_x, ox_off, xc_ptr, xc_s)
    lk = Links(D, xs, xd, xdur, xlat, x_out, x_in, x_bytes, x_start, burst, burst.copy(),
               np.zeros(D * D), np.zeros(D * D), np.full(D * D, -1, np.int64),
               np.full(D * D, -1, np.int64), np.full(max(n_x, 1), -1, np.int64),
               np.zeros(D), np.zeros(D))
    bk = Buckets(ar_ptr, ar_k, ar_off, ar_pending, np.zeros(len(ar_pending)), ar_seconds,
                 ar_mem_ptr, ar_mem, ar_s, ar_e, np.zeros(D))
    return _simulate(tk, sd, lk, bk, _events(NS * m + 3 * n_x + 8), _devices(tk, D, resume))

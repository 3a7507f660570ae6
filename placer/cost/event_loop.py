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

:func:`run_events` allocates the loop's state, bundles it with its inputs
in one :class:`LoopState` and hands it to :func:`_loop`, which takes events
in time order and gives each kind to a kernel of its own. The kernels, and
the heaps under them, are compiled without numba's reference counting
(``_nrt=False``): they allocate nothing and only index arrays that
:func:`run_events` holds. With it, every array a kernel is passed or takes
from the bundle costs two calls into numba's runtime: with counting, these
kernels ran 4-11 times as long as the loop written as one function, and
without it they take about 0.7 of its time.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

DONE, XREADY, XARRIVE, LINKFREE = 0, 1, 2, 3

#: a loop kernel: allocates nothing, so no reference counting (module doc)
_kernel = njit(cache=True, _nrt=False)

LoopState = namedtuple("LoopState", [
    # sizes: microbatches, local tasks and transfers, devices; the priority
    # offset of a device's waiting phase; the schedule; training or not
    "m", "NS", "NX", "D", "later", "gpipe", "training",
    # per local task (CSR: the transfers it sends, the buckets it readies)
    "task_dur", "task_dev", "prio", "nxt", "f_to_b", "b_to_f", "b_to_f_cap",
    "ox_ptr", "ox_x", "ox_off", "ar_ptr", "ar_k", "ar_off",
    # per local transfer (CSR: the tasks it feeds)
    "xs", "xd", "xdur", "xlat", "x_out", "x_in", "x_bytes", "xc_ptr", "xc_s",
    # per global task and transfer
    "pend", "start", "x_pend", "x_ready", "x_start", "q_next",
    # per device: ready heaps in one array, interfaces, collective stream
    "rq", "rq_base", "rq_size", "idle", "free_at", "resume", "nic_out", "nic_in", "coll",
    # per directed link: when it frees, token bucket, queue of transfers
    "link_free", "burst", "tokens", "tok_t", "q_head", "q_tail",
    # per all-reduce bucket
    "ar_pending", "ar_ready", "ar_mem_ptr", "ar_mem", "ar_seconds", "ar_s", "ar_e",
    # the event heap: time, sequence number (the tie break), kind, task/transfer/link
    "ev_t", "ev_q", "ev_k", "ev_i",
])
LoopState.__doc__ = """What the loop's kernels read and write, inputs and state, as
:func:`run_events` names them."""


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


@_kernel
def _ev_push(t, q, kind, ident, n, time, seq, k, x):
    """Push event (time, seq) onto the heap of ``n`` events; returns n + 1."""
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if t[parent] < time or (t[parent] == time and q[parent] < seq):
            break
        t[i], q[i], kind[i], ident[i] = t[parent], q[parent], kind[parent], ident[parent]
        i = parent
    t[i], q[i], kind[i], ident[i] = time, seq, k, x
    return n + 1


@_kernel
def _ev_pop(t, q, kind, ident, n):
    """Remove the root of a heap of ``n`` events (read it before); returns n - 1."""
    n -= 1
    if n == 0:
        return 0
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
    return n


@_kernel
def _rq_push(heap, base, size, d, key):
    """Push ``key`` onto device ``d``'s ready heap (``heap[base[d]:]``)."""
    b = base[d]
    i = size[d]
    while i > 0:
        parent = (i - 1) >> 1
        if heap[b + parent] < key:
            break
        heap[b + i] = heap[b + parent]
        i = parent
    heap[b + i] = key
    size[d] += 1


@_kernel
def _rq_pop(heap, base, size, d):
    """Pop the smallest key of device ``d``'s ready heap."""
    b = base[d]
    top = heap[b]
    n = size[d] - 1
    size[d] = n
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


@_kernel
def _push(s, seq, n_ev, time, kind, ident):
    """Push the next event onto the loop's heap; returns (seq, n_ev)."""
    seq += 1
    return seq, _ev_push(s.ev_t, s.ev_q, s.ev_k, s.ev_i, n_ev, time, seq, kind, ident)


@_kernel
def _ready(s, d, t, local):
    """Queue global task ``t`` (local ``local``) on device ``d``'s ready heap."""
    _rq_push(s.rq, s.rq_base, s.rq_size, d, t + s.prio[local])


@_kernel
def _allreduce(s, k):
    """Bucket ``k``'s last gradient is ready: run its all-reduce."""
    # a device's all-reduces run one at a time on a collective stream of
    # their own (as NCCL's), beside point-to-point traffic
    coll, ar_mem = s.coll, s.ar_mem
    s0 = s.ar_ready[k]
    for i in range(s.ar_mem_ptr[k], s.ar_mem_ptr[k + 1]):
        if coll[ar_mem[i]] > s0:
            s0 = coll[ar_mem[i]]
    e0 = s0 + s.ar_seconds[k]
    for i in range(s.ar_mem_ptr[k], s.ar_mem_ptr[k + 1]):
        coll[ar_mem[i]] = e0
    s.ar_s[k] = s0
    s.ar_e[k] = e0


@_kernel
def _dispatch(s, d, now, seq, n_ev):
    """Start device ``d``'s most urgent ready task if it is idle: schedule
    its end, ready the transfers (and, in the last microbatch, the
    all-reduce buckets) it completes. A task that does not follow its
    device's previous one at once (the device waited, or it is the first)
    starts ``resume[d]`` late. Returns (seq, n_ev)."""
    if not s.idle[d] or s.rq_size[d] == 0:
        return seq, n_ev
    key = _rq_pop(s.rq, s.rq_base, s.rq_size, d)
    task = key - s.later if key >= s.later else key
    s.idle[d] = False
    if now > s.free_at[d]:
        now = now + s.resume[d]
    s.start[task] = now
    mb = task // s.NS
    local = task - mb * s.NS
    seq, n_ev = _push(s, seq, n_ev, now + s.task_dur[local], DONE, task)
    x_ready, x_pend = s.x_ready, s.x_pend
    base = mb * s.NX
    for j in range(s.ox_ptr[local], s.ox_ptr[local + 1]):
        gx = base + s.ox_x[j]
        t = now + s.ox_off[j]
        if t > x_ready[gx]:
            x_ready[gx] = t
        x_pend[gx] -= 1
        if x_pend[gx] == 0:
            seq, n_ev = _push(s, seq, n_ev, x_ready[gx], XREADY, gx)
    if mb == s.m - 1:
        for j in range(s.ar_ptr[local], s.ar_ptr[local + 1]):
            k = s.ar_k[j]
            t = now + s.ar_off[j]
            if t > s.ar_ready[k]:
                s.ar_ready[k] = t
            s.ar_pending[k] -= 1
            if s.ar_pending[k] == 0:
                _allreduce(s, k)
    return seq, n_ev


@_kernel
def _release(s, ident):
    """Count the end of task ``ident`` against the tasks that wait on it on
    its device (its successor, the schedule's hops between phases) and queue
    those now ready. Returns the device of a forward it readied in a later
    microbatch (1F1B; -1: none)."""
    NS, m, pend, task_dev = s.NS, s.m, s.pend, s.task_dev
    mb = ident // NS
    local = ident - mb * NS
    base = mb * NS
    other = -1
    u = s.nxt[local]
    if u >= 0:
        t = base + u
        pend[t] -= 1
        if pend[t] == 0:
            _ready(s, task_dev[u], t, u)
    if s.training:
        u = s.f_to_b[local]
        if u >= 0:
            if s.gpipe:
                if mb == m - 1:
                    for j in range(m):
                        t = j * NS + u
                        pend[t] -= 1
                        if pend[t] == 0:
                            _ready(s, task_dev[u], t, u)
            else:
                t = base + u
                pend[t] -= 1
                if pend[t] == 0:
                    _ready(s, task_dev[u], t, u)
        u = s.b_to_f[local]
        cap = s.b_to_f_cap[local]
        if u >= 0 and mb + cap < m:
            t = (mb + cap) * NS + u
            pend[t] -= 1
            if pend[t] == 0:
                _ready(s, task_dev[u], t, u)
                other = task_dev[u]
    return other


@_kernel
def _on_done(s, now, ident, seq, n_ev):
    """Task ``ident`` ended: its device is free, the tasks waiting on it
    may start. Returns (seq, n_ev)."""
    d = s.task_dev[ident % s.NS]
    s.idle[d] = True
    s.free_at[d] = now
    other = _release(s, ident)
    if s.rq_size[d] > 0:
        seq, n_ev = _dispatch(s, d, now, seq, n_ev)
    if other >= 0 and s.idle[other] and s.rq_size[other] > 0:
        seq, n_ev = _dispatch(s, other, now, seq, n_ev)
    return seq, n_ev


@_kernel
def _burst(s, link, nbytes, dur, t0):
    """The share of a transfer's ``nbytes`` that ``link``'s token bucket
    cannot cover when it starts at ``t0`` (refilled at the rate of the
    transfer's ``dur``); takes the tokens it uses."""
    tokens, tok_t = s.tokens, s.tok_t
    rate = nbytes / dur
    tk = tokens[link] + (t0 - tok_t[link]) * rate
    if tk > s.burst[link]:
        tk = s.burst[link]
    if tk >= nbytes:
        tokens[link] = tk - nbytes
        tok_t[link] = t0
        return 0.0
    share = (nbytes - tk) / nbytes
    tokens[link] = 0.0
    tok_t[link] = t0 + dur * share
    return share


@_kernel
def _on_link(s, now, kind, ident, seq, n_ev):
    """A transfer is ready (``XREADY``, ``ident`` the transfer) or a link
    freed (``LINKFREE``, ``ident`` the link): queue the transfer behind a
    busy link, or start the one at the link's head once both interfaces are
    free and schedule its arrival. Returns (seq, n_ev)."""
    q_head, q_tail, q_next = s.q_head, s.q_tail, s.q_next
    if kind == XREADY:
        x = ident % s.NX
        link = s.xs[x] * s.D + s.xd[x]
        if s.link_free[link] > now:
            # one tensor at a time per link, first come first served;
            # the first in line asks to be woken when the link frees
            if q_head[link] < 0:
                seq, n_ev = _push(s, seq, n_ev, s.link_free[link], LINKFREE, link)
                q_head[link] = ident
            else:
                q_next[q_tail[link]] = ident
            q_tail[link] = ident
            q_next[ident] = -1
            return seq, n_ev
    else:
        link = ident
        ident = q_head[link]
        q_head[link] = q_next[ident]
        if q_head[link] < 0:
            q_tail[link] = -1
        x = ident % s.NX
    # interfaces are held only once the link is free, so a tensor
    # queued behind a slow link does not block the device's others
    nic_out, nic_in = s.nic_out, s.nic_in
    a = s.xs[x]
    c2 = s.xd[x]
    t0 = now
    if nic_out[a] > t0:
        t0 = nic_out[a]
    if nic_in[c2] > t0:
        t0 = nic_in[c2]
    dur = s.xdur[x]
    share = 1.0
    if s.burst[link] > 0.0 and dur > 0.0:
        share = _burst(s, link, s.x_bytes[x], dur, t0)
        dur = dur * share
    t1 = t0 + dur
    s.link_free[link] = t1
    nic_out[a] = t0 + s.x_out[x] * share
    nic_in[c2] = t0 + s.x_in[x] * share
    s.x_start[ident] = t0
    seq, n_ev = _push(s, seq, n_ev, t1 + s.xlat[x], XARRIVE, ident)
    if kind == LINKFREE and q_head[link] >= 0:
        seq, n_ev = _push(s, seq, n_ev, t1, LINKFREE, link)
    return seq, n_ev


@_kernel
def _on_arrive(s, now, ident, seq, n_ev):
    """Transfer ``ident`` landed: the tasks it feeds may start. Returns
    (seq, n_ev)."""
    NS, pend, task_dev = s.NS, s.pend, s.task_dev
    mb = ident // s.NX
    x = ident - mb * s.NX
    base = mb * NS
    for j in range(s.xc_ptr[x], s.xc_ptr[x + 1]):
        u = s.xc_s[j]
        t = base + u
        pend[t] -= 1
        if pend[t] == 0:
            e = task_dev[u]
            _ready(s, e, t, u)
            if s.idle[e]:
                seq, n_ev = _dispatch(s, e, now, seq, n_ev)
    return seq, n_ev


@_kernel
def _loop(s):
    """Run the simulation to its last event; returns the last task end or
    transfer arrival."""
    seq = n_ev = 0
    for task in range(s.NS * s.m):
        if s.pend[task] == 0:
            local = task % s.NS
            _ready(s, s.task_dev[local], task, local)
    for d in range(s.D):
        seq, n_ev = _dispatch(s, d, 0.0, seq, n_ev)
    end_time = 0.0
    while n_ev > 0:
        now = s.ev_t[0]
        kind = s.ev_k[0]
        ident = s.ev_i[0]
        n_ev = _ev_pop(s.ev_t, s.ev_q, s.ev_k, s.ev_i, n_ev)
        if kind == DONE:
            end_time = now
            seq, n_ev = _on_done(s, now, ident, seq, n_ev)
        elif kind == XREADY or kind == LINKFREE:
            seq, n_ev = _on_link(s, now, kind, ident, seq, n_ev)
        else:
            if now > end_time:
                end_time = now
            seq, n_ev = _on_arrive(s, now, ident, seq, n_ev)
    return end_time


@njit(cache=True)
def _end(end_time, pend, ar_e):
    """The step's end (the last event or all-reduce) and the number of
    tasks never run."""
    stuck = 0
    for task in range(len(pend)):
        if pend[task] > 0:
            stuck += 1
    for k in range(len(ar_e)):
        if ar_e[k] > end_time:
            end_time = ar_e[k]
    return end_time, stuck


@njit(cache=True)
def _ready_heaps(m, NS, D, task_dev):
    """Offsets of the per-device ready heaps in one array, each sized by the
    device's task count."""
    rq_base = np.zeros(D, np.int64)
    for s in range(NS):
        if task_dev[s] + 1 < D:
            rq_base[task_dev[s] + 1] += m
    for d in range(1, D):
        rq_base[d] += rq_base[d - 1]
    return rq_base


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
    ``ar_mem*`` each bucket's devices."""
    n_tasks = NS * m
    n_x = NX * m
    cap = n_tasks + 3 * n_x + 8
    L = D * D
    s = LoopState(
        m, NS, NX, D, n_tasks, gpipe, training,
        task_dur, task_dev, prio, nxt, f_to_b, b_to_f, b_to_f_cap,
        ox_ptr, ox_x, ox_off, ar_ptr, ar_k, ar_off,
        xs, xd, xdur, xlat, x_out, x_in, x_bytes, xc_ptr, xc_s,
        pend, start, x_pend, np.zeros(n_x), x_start, np.full(max(n_x, 1), -1, np.int64),
        np.empty(max(n_tasks, 1), np.int64), _ready_heaps(m, NS, D, task_dev),
        np.zeros(D, np.int64), np.ones(D, np.bool_),
        np.full(D, -1.0),       # when each device's last task ended
        resume, np.zeros(D), np.zeros(D), np.zeros(D),
        np.zeros(L), burst, burst.copy(), np.zeros(L),
        np.full(L, -1, np.int64), np.full(L, -1, np.int64),
        ar_pending, np.zeros(len(ar_pending)), ar_mem_ptr, ar_mem, ar_seconds, ar_s, ar_e,
        np.empty(cap), np.empty(cap, np.int64), np.empty(cap, np.int64),
        np.empty(cap, np.int64))
    return _end(_loop(s), pend, ar_e)

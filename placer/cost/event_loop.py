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

:func:`run_events` drives the loop; each kind of event has a kernel of its
own, and what starting a task needs travels as one :class:`Starts` bundle.
The kernels, and the heaps under them, are compiled without numba's
reference counting (``_nrt=False``): they allocate nothing and only index
arrays that :func:`run_events` holds. With it, every array a kernel is
passed or takes from a bundle costs two calls into numba's runtime (the
split loop ran a third slower than the loop written as one function; a
bundle of everything ran four to eleven times as long). Without it, this
split takes about 0.7 of the one function's time. One bundle for every
kernel ran as fast but took three times as long to compile.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

DONE, XREADY, XARRIVE, LINKFREE = 0, 1, 2, 3

#: a loop kernel: allocates nothing, so no reference counting (module doc)
_kernel = njit(cache=True, _nrt=False)

Starts = namedtuple("Starts", [
    # microbatches, local tasks and transfers; the priority offset of a
    # device's waiting phase
    "m", "NS", "NX", "later",
    # per device: ready heaps in one array (``_rq_push``), state
    "rq", "rq_base", "rq_size", "idle", "resume", "free_at", "coll",
    # per global task; per local task (CSR: the transfers it sends)
    "start", "task_dur", "ox_ptr", "ox_x", "ox_off",
    # the event heap (``_ev_push``)
    "ev_t", "ev_q", "ev_k", "ev_i",
    # per global transfer
    "x_ready", "x_pend",
    # the all-reduce buckets each local task of the last microbatch readies
    # (CSR), and per bucket
    "ar_ptr", "ar_k", "ar_off", "ar_ready", "ar_pending", "ar_mem_ptr", "ar_mem",
    "ar_seconds", "ar_s", "ar_e",
])
Starts.__doc__ = """What :func:`_dispatch` reads and writes to start a task, as
:func:`run_events` names it."""


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
def _dispatch(d, now, seq, n_ev, st):
    """Start device ``d``'s most urgent ready task if it is idle: schedule
    its end, ready the transfers (and, in the last microbatch, the
    all-reduce buckets) it completes. A task that does not follow its
    device's previous one at once (the device waited, or it is the first)
    starts ``resume[d]`` late. Returns (seq, n_ev)."""
    (m, NS, NX, later, rq, rq_base, rq_size, idle, resume, free_at, coll, start, task_dur,
     ox_ptr, ox_x, ox_off, ev_t, ev_q, ev_k, ev_i, x_ready, x_pend, ar_ptr, ar_k, ar_off,
     ar_ready, ar_pending, ar_mem_ptr, ar_mem, ar_seconds, ar_s, ar_e) = st
    if not idle[d] or rq_size[d] == 0:
        return seq, n_ev
    key = _rq_pop(rq, rq_base, rq_size, d)
    task = key - later if key >= later else key
    idle[d] = False
    if now > free_at[d]:
        now = now + resume[d]
    start[task] = now
    mb = task // NS
    local = task - mb * NS
    seq += 1
    n_ev = _ev_push(ev_t, ev_q, ev_k, ev_i, n_ev, now + task_dur[local], seq, DONE, task)
    base = mb * NX
    for j in range(ox_ptr[local], ox_ptr[local + 1]):
        gx = base + ox_x[j]
        t = now + ox_off[j]
        if t > x_ready[gx]:
            x_ready[gx] = t
        x_pend[gx] -= 1
        if x_pend[gx] == 0:
            seq += 1
            n_ev = _ev_push(ev_t, ev_q, ev_k, ev_i, n_ev, x_ready[gx], seq, XREADY, gx)
    if mb == m - 1:
        for j in range(ar_ptr[local], ar_ptr[local + 1]):
            k = ar_k[j]
            t = now + ar_off[j]
            if t > ar_ready[k]:
                ar_ready[k] = t
            ar_pending[k] -= 1
            if ar_pending[k] == 0:
                # a device's all-reduces run one at a time on a collective
                # stream of their own (as NCCL's), beside point-to-point traffic
                s0 = ar_ready[k]
                for i in range(ar_mem_ptr[k], ar_mem_ptr[k + 1]):
                    if coll[ar_mem[i]] > s0:
                        s0 = coll[ar_mem[i]]
                e0 = s0 + ar_seconds[k]
                for i in range(ar_mem_ptr[k], ar_mem_ptr[k + 1]):
                    coll[ar_mem[i]] = e0
                ar_s[k] = s0
                ar_e[k] = e0
    return seq, n_ev


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


@_kernel
def _release(ident, m, NS, gpipe, training, pend, rq, rq_base, rq_size, task_dev, prio, nxt,
             f_to_b, b_to_f, b_to_f_cap):
    """Count the end of task ``ident`` against the tasks of its device that
    wait on it (its successor, the schedule's hops between phases) and queue
    those now ready. Returns the device of a forward it readied in a later
    microbatch (1F1B; -1: none)."""
    mb = ident // NS
    local = ident - mb * NS
    base = mb * NS
    other = -1
    s = nxt[local]
    if s >= 0:
        t = base + s
        pend[t] -= 1
        if pend[t] == 0:
            _rq_push(rq, rq_base, rq_size, task_dev[s], t + prio[s])
    if training:
        s = f_to_b[local]
        if s >= 0:
            if gpipe:
                if mb == m - 1:
                    for j in range(m):
                        t = j * NS + s
                        pend[t] -= 1
                        if pend[t] == 0:
                            _rq_push(rq, rq_base, rq_size, task_dev[s], t + prio[s])
            else:
                t = base + s
                pend[t] -= 1
                if pend[t] == 0:
                    _rq_push(rq, rq_base, rq_size, task_dev[s], t + prio[s])
        s = b_to_f[local]
        if s >= 0 and mb + b_to_f_cap[local] < m:
            t = (mb + b_to_f_cap[local]) * NS + s
            pend[t] -= 1
            if pend[t] == 0:
                _rq_push(rq, rq_base, rq_size, task_dev[s], t + prio[s])
                other = task_dev[s]
    return other


@_kernel
def _burst(tokens, tok_t, burst, link, nbytes, dur, t0):
    """The share of a transfer's ``nbytes`` that ``link``'s token bucket
    cannot cover when it starts at ``t0`` (refilled at the rate of the
    transfer's ``dur``); takes the tokens it uses."""
    rate = nbytes / dur
    tk = tokens[link] + (t0 - tok_t[link]) * rate
    if tk > burst[link]:
        tk = burst[link]
    if tk >= nbytes:
        tokens[link] = tk - nbytes
        tok_t[link] = t0
        return 0.0
    share = (nbytes - tk) / nbytes
    tokens[link] = 0.0
    tok_t[link] = t0 + dur * share
    return share


@_kernel
def _on_link(now, kind, ident, seq, n_ev, NX, D, xs, xd, xdur, xlat, x_out, x_in, x_bytes,
             burst, tokens, tok_t, link_free, q_head, q_tail, q_next, nic_out, nic_in,
             x_start, ev_t, ev_q, ev_k, ev_i):
    """A transfer is ready (``XREADY``, ``ident`` the transfer) or a link
    freed (``LINKFREE``, ``ident`` the link): queue the transfer behind a
    busy link, or start the one at the link's head once both interfaces are
    free and schedule its arrival. Returns (seq, n_ev)."""
    if kind == XREADY:
        x = ident % NX
        link = xs[x] * D + xd[x]
        if link_free[link] > now:
            # one tensor at a time per link, first come first served;
            # the first in line asks to be woken when the link frees
            if q_head[link] < 0:
                seq += 1
                n_ev = _ev_push(ev_t, ev_q, ev_k, ev_i, n_ev, link_free[link], seq,
                                LINKFREE, link)
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
        x = ident % NX
    # interfaces are held only once the link is free, so a tensor
    # queued behind a slow link does not block the device's others
    a = xs[x]
    c2 = xd[x]
    t0 = now
    if nic_out[a] > t0:
        t0 = nic_out[a]
    if nic_in[c2] > t0:
        t0 = nic_in[c2]
    dur = xdur[x]
    share = 1.0
    if burst[link] > 0.0 and dur > 0.0:
        share = _burst(tokens, tok_t, burst, link, x_bytes[x], dur, t0)
        dur = dur * share
    t1 = t0 + dur
    link_free[link] = t1
    nic_out[a] = t0 + x_out[x] * share
    nic_in[c2] = t0 + x_in[x] * share
    x_start[ident] = t0
    seq += 1
    n_ev = _ev_push(ev_t, ev_q, ev_k, ev_i, n_ev, t1 + xlat[x], seq, XARRIVE, ident)
    if kind == LINKFREE and q_head[link] >= 0:
        seq += 1
        n_ev = _ev_push(ev_t, ev_q, ev_k, ev_i, n_ev, t1, seq, LINKFREE, link)
    return seq, n_ev


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

    The loop takes the earliest event, ends a task (``_release``, then
    ``_dispatch`` on the devices it freed or fed), moves a transfer onto
    its link (``_on_link``) or lands one (its consumers may start)."""
    n_tasks = NS * m
    n_x = NX * m
    later = n_tasks
    rq_base = _ready_heaps(m, NS, D, task_dev)
    rq = np.empty(max(n_tasks, 1), np.int64)
    rq_size = np.zeros(D, np.int64)
    idle = np.ones(D, np.bool_)
    cap = n_tasks + 3 * n_x + 8
    ev_t = np.empty(cap)
    ev_q = np.empty(cap, np.int64)
    ev_k = np.empty(cap, np.int64)
    ev_i = np.empty(cap, np.int64)
    n_ev = 0
    seq = 0
    x_ready = np.zeros(n_x)
    link_free = np.zeros(D * D)
    tokens = burst.copy()
    tok_t = np.zeros(D * D)
    q_head = np.full(D * D, -1, np.int64)
    q_tail = np.full(D * D, -1, np.int64)
    q_next = np.full(max(n_x, 1), -1, np.int64)
    nic_out = np.zeros(D)
    nic_in = np.zeros(D)
    coll = np.zeros(D)
    ar_ready = np.zeros(len(ar_pending))
    free_at = np.full(D, -1.0)      # when each device's last task ended
    st = Starts(m, NS, NX, later, rq, rq_base, rq_size, idle, resume, free_at, coll, start,
                task_dur, ox_ptr, ox_x, ox_off, ev_t, ev_q, ev_k, ev_i, x_ready, x_pend, ar_ptr,
                ar_k, ar_off, ar_ready, ar_pending, ar_mem_ptr, ar_mem, ar_seconds, ar_s, ar_e)

    for task in range(n_tasks):
        if pend[task] == 0:
            local = task % NS
            _rq_push(rq, rq_base, rq_size, task_dev[local], task + prio[local])
    for d in range(D):
        seq, n_ev = _dispatch(d, 0.0, seq, n_ev, st)
    end_time = 0.0
    while n_ev > 0:
        now = ev_t[0]
        kind = ev_k[0]
        ident = ev_i[0]
        n_ev = _ev_pop(ev_t, ev_q, ev_k, ev_i, n_ev)
        if kind == DONE:
            end_time = now
            d = task_dev[ident % NS]
            idle[d] = True
            free_at[d] = now
            other = _release(ident, m, NS, gpipe, training, pend, rq, rq_base, rq_size,
                             task_dev, prio, nxt, f_to_b, b_to_f, b_to_f_cap)
            if rq_size[d] > 0:
                seq, n_ev = _dispatch(d, now, seq, n_ev, st)
            if other >= 0 and idle[other] and rq_size[other] > 0:
                seq, n_ev = _dispatch(other, now, seq, n_ev, st)
        elif kind == XREADY or kind == LINKFREE:
            seq, n_ev = _on_link(now, kind, ident, seq, n_ev, NX, D, xs, xd, xdur, xlat,
                                 x_out, x_in, x_bytes, burst, tokens, tok_t, link_free,
                                 q_head, q_tail, q_next, nic_out, nic_in, x_start,
                                 ev_t, ev_q, ev_k, ev_i)
        else:
            if now > end_time:
                end_time = now
            mb = ident // NX
            x = ident - mb * NX
            base = mb * NS
            for j in range(xc_ptr[x], xc_ptr[x + 1]):
                s = xc_s[j]
                t = base + s
                pend[t] -= 1
                if pend[t] == 0:
                    e = task_dev[s]
                    _rq_push(rq, rq_base, rq_size, e, t + prio[s])
                    if idle[e]:
                        seq, n_ev = _dispatch(e, now, seq, n_ev, st)
    return _end(end_time, pend, ar_e)

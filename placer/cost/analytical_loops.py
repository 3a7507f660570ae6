"""The analytical model's sequential passes, compiled with numba.

Two walk each plan's group switches or runs in order, which NumPy can only
do one position at a time across the batch (a Python loop of small array
operations); the others read the per-link loads and the crossing tensors'
offsets in one pass each instead of a dozen array operations. Results are
the same as the vectorised versions they replace, bit for bit: the passes
take maxima and add each term in the same order.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def crossing_edges(ptr, edge, small, hr, hc, src, dst, run_group, total):
    """Edges between different groups found from the plans' group switches
    (see :func:`placer.cost.analytical._crossing_edges`): for each switch
    (``hr``, ``hc``: plan row and the position before it, row-major) the
    edges spanning it (cut set ``edge[ptr[hc]:ptr[hc + 1]]``) whose source
    is after the plan's previous switch (so each edge is found at the first
    switch it spans) and whose destination's group differs from the run
    before the switch. ``total`` bounds the count. Returns (row, edge,
    source run, destination run) arrays."""
    S = len(hr)
    rows = np.empty(total, np.int64)
    cut = np.empty(total, np.int64)
    r_src = np.empty(total, np.int64)
    r_dst = np.empty(total, np.int64)
    k = 0
    for j in range(S):
        r = hr[j]
        before = hc[j - 1] if j > 0 and hr[j - 1] == r else -1
        group = run_group[j + r]
        for i in range(ptr[hc[j]], ptr[hc[j] + 1]):
            e = edge[i]
            if src[e] <= before:
                continue
            to = dst[e]
            if small[r, to] == group:
                continue
            # the run holding the destination: after the last switch of
            # this row before it (run j + r ends at switch j)
            s = j + 1
            while s < S and hr[s] == r and hc[s] < to:
                s += 1
            rows[k] = r
            cut[k] = e
            r_src[k] = j + r
            r_dst[k] = s + r
            k += 1
    return rows[:k], cut[:k], r_src[:k], r_dst[:k]


@njit(cache=True)
def _by_key(keys, R):
    """CSR of indices ``0..len(keys)-1`` grouped by ``keys`` (in order)."""
    ptr = np.zeros(R + 1, np.int64)
    for e in range(len(keys)):
        ptr[keys[e] + 1] += 1
    for r in range(R):
        ptr[r + 1] += ptr[r]
    fill = ptr[:-1].copy()
    out = np.empty(len(keys), np.int64)
    for e in range(len(keys)):
        out[fill[keys[e]]] = e
        fill[keys[e]] += 1
    return ptr, out


@njit(cache=True)
def _latest(ptr, order, r, at, times, cost):
    """The latest ``times[at[e]] + cost[e]`` over the tensors ``e`` listed
    for run ``r`` (``order[ptr[r]:ptr[r + 1]]``, a :func:`_by_key` CSR), in
    their order; -inf when none."""
    best = -np.inf
    for i in range(ptr[r], ptr[r + 1]):
        e = order[i]
        v = times[at[e]] + cost[e]
        if v > best:
            best = v
    return best


@njit(cache=True)
def run_paths(row_first, runs, run_group, run_w, r_src, r_dst, cost_e, inflow, G):
    """Longest paths over each plan's runs (see
    :func:`placer.cost.analytical._run_paths`): a tensor ``e`` reaches its
    run ``cost_e[e]`` after its source run's start. Returns each run's end
    and start."""
    R = len(run_group)
    # tensors by the run they enter, in their order
    ptr, into = _by_key(r_dst, R)
    h = np.zeros(R)
    ready = inflow.copy()
    last = np.full(G, -1, np.int64)          # the group's previous run in this plan
    for b in range(len(runs)):
        first = row_first[b]
        for r in range(first, first + runs[b]):
            if ptr[r + 1] > ptr[r]:
                ready[r] += _latest(ptr, into, r, r_src, ready, cost_e)
            g = run_group[r]
            begin = ready[r]
            if last[g] >= 0 and h[last[g]] > begin:
                begin = h[last[g]]
            elif last[g] < 0 and begin < 0.0:
                begin = 0.0
            ready[r] = begin
            h[r] = begin + run_w[r]
            last[g] = r
        for r in range(first, first + runs[b]):
            last[run_group[r]] = -1
    return h, ready


@njit(cache=True)
def crossing_costs(serial, run_cls, scale, run_start, x_from, x_to, r_src, r_dst, lat, per_op):
    """For each tensor crossing between runs (from op ``x_from`` of run
    ``r_src`` to op ``x_to`` of run ``r_dst``), when it is needed after its
    source run's start, relative to its destination run's start: the source
    run's work up to and including ``x_from``, plus ``lat``, less the
    destination run's work before ``x_to`` (see
    :func:`placer.cost.analytical._fill`). ``serial``: prefix sums of the
    ops' work per device class; a run's work is its class's column times
    its ``scale``, plus ``per_op`` per op."""
    E = len(r_src)
    out = np.empty(E)
    for e in range(E):
        a = r_src[e]
        z = r_dst[e]
        s0 = run_start[a]
        s1 = run_start[z]
        u = x_from[e] + 1
        v = x_to[e]
        dep = (serial[u, run_cls[a]] - serial[s0, run_cls[a]]) * scale[a] + (u - s0) * per_op
        arr = (serial[v, run_cls[z]] - serial[s1, run_cls[z]]) * scale[z] + (v - s1) * per_op
        out[e] = dep + lat[e] - arr
    return out


@njit(cache=True)
def links_dense(B, D, k_single, w_single, k_dp, w_dp, per_mb, speed, nic):
    """Per (plan, link) loads summed densely, then the loaded cells in key
    order (see :func:`placer.cost.analytical._links`, whose outputs these
    are, in the same order of additions): row, link and bytes of each loaded
    link; per plan the busiest link's time per microbatch and the first link
    at it, the same with a pair's two directions added; each device's
    interface time out and in and the bytes it receives."""
    DD = D * D
    cells = B * DD
    dense = np.zeros(cells)
    for i in range(len(k_single)):
        dense[k_single[i]] += w_single[i]
    if len(k_dp):
        extra = np.zeros(cells)
        for i in range(len(k_dp)):
            extra[k_dp[i]] += w_dp[i]
        for c in range(cells):
            dense[c] = dense[c] + extra[c]
    count = 0
    for c in range(cells):
        if dense[c] != 0.0:
            count += 1
    row = np.empty(count, np.int64)
    link = np.empty(count, np.int64)
    load = np.empty(count)
    top = np.zeros(B)
    arg = np.zeros(B, np.int64)
    both_max = np.zeros(B)
    out = np.zeros((B, D))
    inn = np.zeros((B, D))
    recv = np.zeros((B, D))
    j = 0
    for c in range(cells):
        if dense[c] == 0.0:
            continue
        r = c // DD
        lk = c - r * DD
        a = lk // D
        z = lk - a * D
        row[j] = r
        link[j] = lk
        load[j] = dense[c]
        lmb = dense[c] * per_mb[r]
        t = lmb / speed[lk]
        if t > top[r]:
            top[r] = t
        back = 0.0
        rev = r * DD + z * D + a
        if dense[rev] != 0.0:
            back = dense[rev] * per_mb[r]
        slow = speed[lk] if speed[lk] < speed[z * D + a] else speed[z * D + a]
        both = (lmb + back) / slow
        if both > both_max[r]:
            both_max[r] = both
        out[r, a] += lmb
        inn[r, z] += lmb
        recv[r, z] += dense[c]
        j += 1
    # the busiest link of a plan: the first (lowest index) at its maximum
    done = np.zeros(B, np.bool_)
    for j in range(count):
        r = row[j]
        if not done[r] and load[j] * per_mb[r] / speed[link[j]] == top[r]:
            arg[r] = link[j]
            done[r] = True
    for r in range(B):
        for d in range(D):
            out[r, d] = out[r, d] / nic[d]
            inn[r, d] = inn[r, d] / nic[d]
    return row, link, load, top, arg, both_max, out, inn, recv


@njit(cache=True)
def run_paths_phased(row_first, runs, run_group, w_f, w_b, r_src, r_dst, lat_f, lat_b,
                     inflow_f, inflow_b, G):
    """Longest paths over each plan's runs, the forward then the backward
    (see :func:`placer.cost.analytical._fill` under ``granularity="piece"``):
    forward, a run starts once its group's previous run ended and every
    tensor crossing into it arrived (``lat_f[e]`` after its source run's
    forward end, then the run's transfers ``inflow_f``); the backward starts
    when the last forward ended and walks the runs in reverse, a run's
    waiting for its group's later run and for the gradients of its outputs
    (``lat_b[e]`` after the consuming run's backward end, ``lat_b < 0``: no
    gradient goes back, then ``inflow_b``). Returns each run's backward end
    and forward start."""
    R = len(run_group)
    ptr_in, into = _by_key(r_dst, R)
    ptr_out, outof = _by_key(r_src, R)
    end_f = np.zeros(R)
    start_f = np.zeros(R)
    end_b = np.zeros(R)
    last = np.full(G, -1, np.int64)
    for b in range(len(runs)):
        first = row_first[b]
        stop = first + runs[b]
        top = 0.0
        for r in range(first, stop):
            begin = 0.0
            if ptr_in[r + 1] > ptr_in[r]:
                begin = _latest(ptr_in, into, r, r_src, end_f, lat_f) + inflow_f[r]
            g = run_group[r]
            if last[g] >= 0 and end_f[last[g]] > begin:
                begin = end_f[last[g]]
            start_f[r] = begin
            end_f[r] = begin + w_f[r]
            last[g] = r
            if end_f[r] > top:
                top = end_f[r]
        for r in range(first, stop):
            last[run_group[r]] = -1
        for r in range(stop - 1, first - 1, -1):
            begin = top
            best = -np.inf
            for i in range(ptr_out[r], ptr_out[r + 1]):
                e = outof[i]
                if lat_b[e] >= 0.0:
                    v = end_b[r_dst[e]] + lat_b[e]
                    if v > best:
                        best = v
            if best > -np.inf and best + inflow_b[r] > begin:
                begin = best + inflow_b[r]
            g = run_group[r]
            if last[g] >= 0 and end_b[last[g]] > begin:
                begin = end_b[last[g]]
            end_b[r] = begin + w_b[r]
            last[g] = r
        for r in range(first, stop):
            last[run_group[r]] = -1
    return end_b, start_f

""":class:`gnn.model.FastDecoder`'s walk over the units, compiled with numba.

Each unit's decision depends on every earlier one, so NumPy could only
vectorise one unit at a time across the batch: a dozen small array
operations and two matrix products per unit, whose call overheads were most
of the time. Here a unit is a few passes over the batch's (row, device)
cells, in float32 as before, the hidden layer summed in the order of the
matrix product it replaces (the placements are the NumPy version's on the
benchmark's graphs and clusters, sampled and refining too).
"""

from __future__ import annotations

import numpy as np
from numba import njit

N_DYNAMIC = 12   # gnn.model's (not imported: this module stays free of torch)


@njit(cache=True)
def decode_units(assign, refine, greedy, uniform, scale, pre, w_dyn, w_out, add_time, need,
                 workspace, memory, inv_memory, inv_bw, latency, inv_t_unit,
                 in_ptr, in_src, in_share, in_bytes, out_ptr, out_dst, out_share, tie):
    """Decide every unit of every row of ``assign`` (k, U) in place (see
    :meth:`gnn.model.FastDecoder.decode`): ``refine`` starts from its
    devices, else it holds -1. Rows from ``greedy`` on add Gumbel noise to
    the logits, ``-log(-log(1 - x))`` of ``uniform[u, row - greedy]`` (in
    (0, 1), as ``numpy.random.Generator.gumbel`` computes it from its
    draws; only the units decided here pay the logarithms). ``pre`` (U,
    Hd + 1, D) holds the static hidden pre-activations and, last, the
    static logits; ``w_dyn`` (12, Hd + 1) the dynamic features' weights,
    ``w_out`` (Hd + 1,) the output layer's; producers (``in_*``) and
    consumers (``out_*``) of each unit in CSR form, with their shares of its
    bytes (and, for producers, the bytes)."""
    k, U = assign.shape
    D = memory.shape[0]
    n = k * D
    # the state, row-major over (row, device) cells
    load = np.zeros(n, np.float32)
    mem = np.zeros(n, np.float32)
    peak = np.zeros(n, np.float32)   # largest transient workspace placed so far
    if refine:
        for r in range(k):
            for u in range(U):
                a = r * D + assign[r, u]
                load[a] += add_time[u, assign[r, u]]
                mem[a] += need[u]
    feat = np.zeros((N_DYNAMIC, n), np.float32)
    logit = np.zeros(n, np.float32)
    for u in range(U):
        if refine:   # take u out of the state before re-deciding it
            for r in range(k):
                c = assign[r, u]
                load[r * D + c] -= add_time[u, c]
                mem[r * D + c] -= need[u]
        if tie[u] == u:
            _features(u, feat, assign, refine, load, mem, add_time, need, inv_memory, inv_bw,
                      latency, inv_t_unit, in_ptr, in_src, in_share, in_bytes, out_ptr,
                      out_dst, out_share)
            _logits(feat, pre[u], k, w_dyn, w_out, logit)
        for r in range(k):
            if tie[u] != u:
                a = assign[r, tie[u]]
            else:
                a = _choose(u, r, greedy, uniform, scale, logit, mem, peak, need,
                            workspace, memory)
            assign[r, u] = a
            c = r * D + a
            load[c] += add_time[u, a]
            mem[c] += need[u]
            peak[c] = max(peak[c], workspace[u])
    return assign


@njit(cache=True)
def _features(u, feat, assign, refine, load, mem, add_time, need, inv_memory, inv_bw, latency,
              inv_t_unit, in_ptr, in_src, in_share, in_bytes, out_ptr, out_dst, out_share):
    """The dynamic features (12, k * D) of unit ``u``, stored unhalved."""
    k = assign.shape[0]
    D = inv_memory.shape[0]
    f32 = np.float32
    zero, one = f32(0.0), f32(1.0)
    aff = np.zeros(D)      # affinities are summed in float64, like np.bincount
    secs = np.zeros(D, np.float32)
    for r in range(k):
        o = r * D
        # 0 and 11: where the producers are (all placed: units are in
        # topological order) and the time to fetch their outputs
        for d in range(D):
            aff[d] = 0.0
            secs[d] = zero
        for i in range(in_ptr[u], in_ptr[u + 1]):
            s = assign[r, in_src[i]]
            aff[s] += in_share[i]
            b = in_bytes[i]
            for d in range(D):
                secs[d] += inv_bw[s, d] * b + latency[s, d]
        fetched = in_ptr[u + 1] > in_ptr[u]
        for d in range(D):
            feat[0, o + d] = aff[d]
            feat[11, o + d] = np.log1p(secs[d] * inv_t_unit) / f32(3.0) if fetched else zero
        # 1: where the consumers are (refinement only)
        if refine:
            for d in range(D):
                aff[d] = 0.0
            for i in range(out_ptr[u], out_ptr[u + 1]):
                aff[assign[r, out_dst[i]]] += out_share[i]
            for d in range(D):
                feat[1, o + d] = aff[d]
        top = load[o]
        used = 0
        for d in range(D):
            x = load[o + d]
            top = max(top, x)
            used += x > zero
        top = min(top, f32(8.0))
        share = f32(used / D)
        for d in range(D):
            feat[7, o + d] = zero
            feat[9, o + d] = top
            feat[10, o + d] = share
        if u > 0:   # 7: the previous unit's device; 8 (the position) is in pre
            feat[7, o + assign[r, u - 1]] = one
    for c in range(k * D):
        d = c % D
        x = load[c]
        feat[2, c] = min(x, f32(8.0))
        feat[3, c] = min(x + add_time[u, d], f32(8.0))
        feat[4, c] = min(mem[c] * inv_memory[d], f32(4.0))
        feat[5, c] = min((mem[c] + need[u]) * inv_memory[d], f32(4.0))
        feat[6, c] = one if x > zero else zero


@njit(cache=True)
def _logits(feat, pre_u, k, w_dyn, w_out, logit):
    """``logit`` (k * D) from the features and the unit's static terms
    ``pre_u`` (Hd + 1, D), the same for every row: the hidden layer (ReLU
    but on the last column) summed in the order of a matrix product, then
    the output layer."""
    H1, D = pre_u.shape
    for c in range(k * D):
        logit[c] = np.float32(0.0)
    for h in range(H1):
        w0, w1, w2, w3 = w_dyn[0, h], w_dyn[1, h], w_dyn[2, h], w_dyn[3, h]
        w4, w5, w6, w7 = w_dyn[4, h], w_dyn[5, h], w_dyn[6, h], w_dyn[7, h]
        w9, w10, w11 = w_dyn[9, h], w_dyn[10, h], w_dyn[11, h]
        wo = w_out[h]
        relu = h < H1 - 1
        for r in range(k):
            for d in range(D):
                c = r * D + d
                # feature 8 has weight 0 (folded into pre)
                z = (feat[0, c] * w0 + feat[1, c] * w1 + feat[2, c] * w2 + feat[3, c] * w3
                     + feat[4, c] * w4 + feat[5, c] * w5 + feat[6, c] * w6 + feat[7, c] * w7
                     + feat[9, c] * w9 + feat[10, c] * w10 + feat[11, c] * w11) + pre_u[h, d]
                if relu:
                    z = max(z, np.float32(0.0))
                logit[c] += z * wo


@njit(cache=True)
def _choose(u, r, greedy, uniform, scale, logit, mem, peak, need, workspace, memory):
    """Row ``r``'s device for unit ``u``: the best logit (plus noise for a
    sampled row) among the devices where the unit fits in memory, or among
    all when it fits nowhere."""
    D = memory.shape[0]
    o = r * D
    fits_any = False
    for d in range(D):
        if max(peak[o + d], workspace[u]) + (mem[o + d] + need[u]) <= memory[d]:
            fits_any = True
            break
    best = -np.inf
    a = 0
    for d in range(D):
        v = logit[o + d] * scale
        if fits_any and not (max(peak[o + d], workspace[u]) + (mem[o + d] + need[u])
                             <= memory[d]):
            v = np.float32(-1e9)
        if r >= greedy:
            v += np.float32(-np.log(-np.log(1.0 - uniform[u, r - greedy, d])))
        if v > best:
            best = v
            a = d
    return a

"""Pieces: the runs of one device group that run as one unit.

A plan, walked in topological order, falls into runs of consecutive ops of
one device group; runs of the same group are merged into one piece while
the pieces stay acyclic. The runtime splits a model so
(:mod:`placer.runtime.split`) and the simulator's ``granularity="piece"``
predicts it so (:mod:`placer.cost.simulator`, and the analytical model
counts its tasks so): one function, no torch.
"""
from __future__ import annotations

import heapq

import numpy as np

from .dag import contract


def merge_runs(groups: list, edges) -> list[int]:
    """Run -> piece: runs of one group (``groups[r]``; ``edges``: (run, run)
    pairs of a DAG) merged while the pieces stay acyclic, without graph
    copies (a plan is simulated often): each later run joins the first earlier one of its
    group that no path of two or more steps joins it to, either way;
    pieces are numbered in the lexicographic topological order of their
    first runs."""
    R = len(groups)
    succ: list[set] = [set() for _ in range(R)]
    pred: list[set] = [set() for _ in range(R)]
    for a, b in edges:
        if a != b:
            succ[a].add(b)
            pred[b].add(a)
    rep = list(range(R))

    def reaches(start: int, goal: int) -> bool:
        """A path start -> k -> ... -> goal with k != goal."""
        stack = [k for k in succ[start] if k != goal]
        seen = set(stack)
        while stack:
            k = stack.pop()
            for nxt in succ[k]:
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    for j in range(R):
        for i in range(j):
            if rep[i] != i or rep[j] != j or groups[i] != groups[j]:
                continue
            if reaches(i, j) or reaches(j, i):
                continue
            contract(succ, pred, i, j)
            for r in range(R):
                if rep[r] == j:
                    rep[r] = i
            break
    nodes = sorted(set(rep))
    indeg = {v: len(pred[v]) for v in nodes}
    ready = [v for v in nodes if indeg[v] == 0]
    heapq.heapify(ready)
    order: dict = {}
    while ready:
        v = heapq.heappop(ready)
        order[v] = len(order)
        for k in succ[v]:
            indeg[k] -= 1
            if indeg[k] == 0:
                heapq.heappush(ready, k)
    return [order[rep[r]] for r in range(R)]


def op_pieces(g: np.ndarray, edge_src: np.ndarray, edge_dst: np.ndarray) -> np.ndarray:
    """Each op's piece as the runtime splits a plan (group id per op ``g``,
    ops in topological order, edges as op indices): runs of one group,
    merged while the pieces stay acyclic (:func:`merge_runs`); piece ids
    in a topological order."""
    n = len(g)
    if not n:
        return np.zeros(0, dtype=np.int64)
    run = np.r_[0, np.cumsum(g[1:] != g[:-1])].astype(np.int64)
    run_group = g[np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]]
    if len(np.unique(run_group)) == len(run_group):
        return run                   # no group twice: nothing to merge
    rs, rd = run[edge_src], run[edge_dst]
    cross = rs != rd
    merged = merge_runs(run_group.tolist(), zip(rs[cross].tolist(), rd[cross].tolist()))
    return np.array(merged, dtype=np.int64)[run]


def unshard_mixing(A: np.ndarray, groups: list, mixing: np.ndarray, edge_src: np.ndarray,
                   edge_dst: np.ndarray) -> tuple:
    """Plans ``A`` ((B, n) or (n,) group ids over the table ``groups`` of
    device-index tuples, ops in topological order) as the runtime runs
    them: a piece (:func:`op_pieces`) on several devices that holds an op
    that mixes the batch (``mixing[i]``: batch statistics, a reduction over
    the rows; see :mod:`placer.runtime.scaling`) runs unsharded on its
    group's first device. Its ops move to a group of that one device that
    stays apart from the device's own (the runtime keeps the piece as it
    is: one task, merged with no other). Returns ``(A, groups)``: both
    themselves when no plan has such a piece, else copies, the table
    extended by those one-device groups."""
    if not mixing.any():
        return A, groups
    rows = np.atleast_2d(A)
    multi = np.array([len(t) > 1 for t in groups], dtype=bool)
    need = np.flatnonzero(multi[rows[:, mixing]].any(axis=1))
    if not len(need):
        return A, groups
    table = list(groups)
    alone: dict[int, int] = {}          # multi group id -> its one-device twin
    out = rows.astype(np.int64)
    for r in need.tolist():
        g = out[r]
        piece = op_pieces(g, edge_src, edge_dst)
        moved = np.flatnonzero(np.isin(piece, piece[mixing & multi[g]]))
        for k in np.unique(g[moved]).tolist():
            if k not in alone:
                alone[k] = len(table)
                table.append((min(groups[k]),))
        out[r, moved] = [alone[k] for k in g[moved].tolist()]
    out = out.astype(rows.dtype) if len(table) < np.iinfo(rows.dtype).max else out
    return (out if A.ndim == 2 else out[0]), table

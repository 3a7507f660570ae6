"""Pieces: the runs of one device group that run as one unit.

A plan, walked in topological order, falls into runs of consecutive ops of
one device group; runs of the same group are merged into one piece while
the pieces stay acyclic. The runtime splits a model so
(:mod:`placer.runtime.split`) and the simulator's ``granularity="piece"``
predicts it so (:mod:`placer.cost.simulator`): one function, no torch.
"""
from __future__ import annotations

import heapq

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

"""Coarsening: merge ops into fewer groups without creating a cycle.

Used by :meth:`placer.Graph.coarsen`, which builds the smaller graph from
the groups found here; see there for the contract. Plain data in and out,
so the graph module sits above this one.
"""

from __future__ import annotations

import heapq

from .dag import contract
from .errors import GraphError


def partition(order: list[str], edges, weight: dict[str, float],
              max_nodes: int) -> dict[str, list[str]]:
    """The ops of a DAG (``order``: its topological order; ``edges``: (src,
    dst) pairs; ``weight``: per op) in at most ``max_nodes`` groups whose
    quotient is acyclic: group id (the member earliest in ``order``) ->
    members."""
    if not isinstance(max_nodes, int) or max_nodes < 1:
        raise GraphError(f"max_nodes must be a positive integer, got {max_nodes!r}",
                         field="max_nodes")
    position = {op_id: i for i, op_id in enumerate(order)}
    # group id is the member earliest in topological order
    members = {op_id: [op_id] for op_id in order}
    succ: dict[str, set] = {op_id: set() for op_id in order}
    pred: dict[str, set] = {op_id: set() for op_id in order}
    for src, dst in edges:
        succ[src].add(dst)
        pred[dst].add(src)
    weight = dict(weight)

    def merge(keep: str, gone: str) -> None:
        """Contract group ``gone`` into ``keep`` (caller checked safety)."""
        members[keep].extend(members.pop(gone))
        weight[keep] += weight.pop(gone)
        contract(succ, pred, keep, gone)
        del succ[gone], pred[gone]

    # Phase 1: contract edges u->v where u has one consumer or v one producer.
    # No other u~>v path can then exist, so the contraction keeps the DAG acyclic.
    # Cheapest pairs first, never above a quarter of the average group, keeps groups
    # balanced (a quarter of the average group leaves room for phase 2);
    # zero-cost ops (elementwise, views) fold into their neighbours.
    cap = sum(weight.values()) / (4 * max_nodes)
    heap: list[tuple[float, int, int, str, str]] = []

    def push(u: str, v: str) -> None:
        if (len(succ[u]) == 1 or len(pred[v]) == 1) and weight[u] + weight[v] <= cap:
            heapq.heappush(heap, (weight[u] + weight[v], position[u], position[v], u, v))

    for u in order:
        for v in succ[u]:
            push(u, v)
    while len(members) > max_nodes and heap:
        priority, _, _, u, v = heapq.heappop(heap)
        if u not in members or v not in members or v not in succ[u]:
            continue
        if weight[u] + weight[v] != priority:
            push(u, v)  # stale entry: re-queue with the current weight
            continue
        if not (len(succ[u]) == 1 or len(pred[v]) == 1):
            continue
        merge(u, v)
        for p in pred[u]:
            push(p, u)
        for s in succ[u]:
            push(u, s)

    # Phase 2: cut a topological order of the groups into contiguous runs with
    # the smallest possible heaviest run. Quotients of contiguous intervals of a
    # topological order are acyclic.
    if len(members) > max_nodes:
        group_order = _group_topological_order(members, succ, pred, position)
        runs = _linear_partition([weight[g] for g in group_order], max_nodes)
        merged: dict[str, list[str]] = {}
        for start, stop in runs:
            run = group_order[start:stop]
            merged[run[0]] = [m for g in run for m in members[g]]
        members = merged
    return members


def _linear_partition(weights: list[float], parts: int) -> list[tuple[int, int]]:
    """Split ``weights`` into exactly ``min(parts, len(weights))`` contiguous
    runs whose heaviest run is as light as possible: binary search on the cap
    with greedy packing, then split the heaviest runs until every slot is used
    (a refinement never makes the heaviest run heavier)."""

    def pack(cap: float) -> list[tuple[int, int]] | None:
        runs, start, acc = [], 0, 0.0
        for i, w in enumerate(weights):
            if i > start and acc + w > cap:
                runs.append((start, i))
                start, acc = i, 0.0
                if len(runs) >= parts:
                    return None
            acc += w
        runs.append((start, len(weights)))
        return runs

    low, high = max(weights, default=0.0), sum(weights)
    best = pack(high) or [(0, len(weights))]
    for _ in range(60):
        if high - low <= 1e-9 * max(high, 1.0):
            break
        mid = (low + high) / 2
        runs = pack(mid)
        if runs is None:
            low = mid
        else:
            best, high = runs, mid
    if len(best) > parts:  # only possible through float ties; merge the tail
        best = best[:parts - 1] + [(best[parts - 1][0], len(weights))]
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    heap = [(-(prefix[b] - prefix[a]), a, b) for a, b in best]
    heapq.heapify(heap)
    done = []
    while heap and len(heap) + len(done) < parts:
        _, a, b = heapq.heappop(heap)
        if b - a < 2:
            done.append((a, b))
            continue
        half = (prefix[a] + prefix[b]) / 2
        cut = min(range(a + 1, b), key=lambda i: (abs(prefix[i] - half), i))
        heapq.heappush(heap, (-(prefix[cut] - prefix[a]), a, cut))
        heapq.heappush(heap, (-(prefix[b] - prefix[cut]), cut, b))
    return sorted(done + [(a, b) for _, a, b in heap])


def _group_topological_order(members, succ, pred, position) -> list[str]:
    indegree = {g: len(pred[g]) for g in members}
    ready = [(position[g], g) for g, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, g = heapq.heappop(ready)
        out.append(g)
        for s in succ[g]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (position[s], s))
    return out

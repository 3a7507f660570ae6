"""Coarsening: merge ops into fewer groups without creating a cycle.

Used by :meth:`placer.Graph.coarsen`; see there for the contract.
"""

from __future__ import annotations

import heapq

from .errors import GraphError
from .graph import Edge, Graph, Op


class _UnionFind:
    def __init__(self, items):
        self.parent = {x: x for x in items}

    def find(self, x):
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
        return ra


def coarsen(graph: Graph, max_nodes: int) -> Graph:
    """Return ``graph`` merged into at most ``max_nodes`` acyclic groups."""
    if not isinstance(max_nodes, int) or max_nodes < 1:
        raise GraphError(f"max_nodes must be a positive integer, got {max_nodes!r}",
                         field="max_nodes")
    order = graph.topological_order()
    position = {op_id: i for i, op_id in enumerate(order)}
    # group id is the member earliest in topological order
    members = {op_id: [op_id] for op_id in order}
    succ = {op_id: set(graph.nx.successors(op_id)) for op_id in order}
    pred = {op_id: set(graph.nx.predecessors(op_id)) for op_id in order}
    weight = {op.id: op.flops + op.bwd_flops for op in graph}

    def merge(keep: str, gone: str) -> None:
        """Contract group ``gone`` into ``keep`` (caller checked safety)."""
        members[keep].extend(members.pop(gone))
        weight[keep] += weight.pop(gone)
        for s in succ.pop(gone):
            pred[s].discard(gone)
            if s != keep:
                pred[s].add(keep)
                succ[keep].add(s)
        for p in pred.pop(gone):
            succ[p].discard(gone)
            if p != keep:
                succ[p].add(keep)
                pred[keep].add(p)
        succ[keep].discard(keep)
        pred[keep].discard(keep)

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

    return _quotient(graph, members, position)


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


def _quotient(graph: Graph, members: dict[str, list[str]], position) -> Graph:
    owner = {m: g for g, ms in members.items() for m in ms}
    # colocate labels: union labels that end up in one group
    labels = _UnionFind({op.colocate for op in graph if op.colocate is not None})
    for ms in members.values():
        found = [graph.op(m).colocate for m in ms if graph.op(m).colocate is not None]
        for label in found[1:]:
            labels.union(found[0], label)
    ops = []
    for group in sorted(members, key=position.__getitem__):
        ms = sorted(members[group], key=position.__getitem__)
        if len(ms) == 1:
            original = graph.op(ms[0])
            ops.append(Op(original.id, original.op, original.flops, original.bwd_flops,
                          original.param_bytes, original.output_bytes,
                          None if original.colocate is None else labels.find(original.colocate),
                          {**original.extra, "members": ms}))
            continue
        label = next((labels.find(graph.op(m).colocate) for m in ms
                      if graph.op(m).colocate is not None), None)
        kinds = sorted({graph.op(m).op for m in ms})
        ops.append(Op(
            id=group, op="group" if len(kinds) > 1 else kinds[0],
            flops=sum(graph.op(m).flops for m in ms),
            bwd_flops=sum(graph.op(m).bwd_flops for m in ms),
            param_bytes=sum(graph.op(m).param_bytes for m in ms),
            output_bytes=sum(graph.op(m).output_bytes for m in ms),
            colocate=label, extra={"members": ms}))
    # A tensor is sent once to each destination group: per (source op, group)
    # keep the largest edge, then sum over source ops.
    sent: dict[tuple[str, str], float] = {}
    for edge in graph.edges:
        a, b = owner[edge.src], owner[edge.dst]
        if a == b:
            continue
        key = (edge.src, b)
        sent[key] = max(sent.get(key, 0.0), edge.bytes)
    between: dict[tuple[str, str], float] = {}
    for (src, b), size in sent.items():
        key = (owner[src], b)
        between[key] = between.get(key, 0.0) + size
    edges = [Edge(a, b, size) for (a, b), size in
             sorted(between.items(), key=lambda kv: (position[kv[0][0]], position[kv[0][1]]))]
    meta = dict(graph.meta)
    meta["coarsened_from"] = {"name": graph.name, "ops": len(graph),
                              "fingerprint": graph.fingerprint()}
    return Graph(graph.name, ops, edges, training=graph.training, meta=meta)

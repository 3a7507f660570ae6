"""A DAG held as successor and predecessor sets, shrunk by contracting
nodes: what coarsening (:mod:`placer.coarsen`) and the runtime's pieces
(:mod:`placer.pieces`) both do, without a graph copy per step.

>>> succ = {"a": {"b"}, "b": {"c"}, "c": set()}
>>> pred = {"a": set(), "b": {"a"}, "c": {"b"}}
>>> contract(succ, pred, "a", "b")
>>> succ, pred
({'a': {'c'}, 'b': set(), 'c': set()}, {'a': set(), 'b': set(), 'c': {'a'}})
"""

from __future__ import annotations


def contract(succ, pred, keep, gone) -> None:
    """Contract node ``gone`` into ``keep`` in place: ``gone``'s edges
    become ``keep``'s, an edge between the two disappears (no self-loop)
    and ``gone`` is left with no edges. ``succ``/``pred`` map a node (dict
    key or list index) to the set of its successors/predecessors. Whether
    the result stays acyclic is the caller's to check."""
    for s in succ[gone]:
        pred[s].discard(gone)
        if s != keep:
            pred[s].add(keep)
            succ[keep].add(s)
    for p in pred[gone]:
        succ[p].discard(gone)
        if p != keep:
            succ[p].add(keep)
            pred[keep].add(p)
    succ[keep].discard(keep)
    pred[keep].discard(keep)
    succ[gone], pred[gone] = set(), set()

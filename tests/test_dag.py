"""placer.dag.contract: the contraction coarsening and the runtime's pieces
share, against networkx's contracted_nodes on random DAGs."""
import random

import networkx as nx

from placer.dag import contract


def adjacency(g: nx.DiGraph, keyed_by_list: bool):
    nodes = sorted(g)
    succ = {v: set(g.successors(v)) for v in nodes}
    pred = {v: set(g.predecessors(v)) for v in nodes}
    if keyed_by_list:
        return [succ[v] for v in nodes], [pred[v] for v in nodes]
    return succ, pred


def test_contract_matches_networkx_on_dicts_and_lists():
    rng = random.Random(3)
    for trial in range(300):
        n = rng.randint(2, 12)
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from((a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.3)
        succ, pred = adjacency(g, keyed_by_list=trial % 2 == 1)
        for _ in range(rng.randint(1, n - 1)):
            alive = sorted(g)
            keep, gone = rng.sample(alive, 2)
            g = nx.contracted_nodes(g, keep, gone, self_loops=False)
            contract(succ, pred, keep, gone)
            assert not succ[gone] and not pred[gone]
            for v in g:
                assert succ[v] == set(g.successors(v)), (trial, v)
                assert pred[v] == set(g.predecessors(v)), (trial, v)

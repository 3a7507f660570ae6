import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer import Edge, Graph, Op
from placer.errors import GraphError


@st.composite
def dags(draw):
    n = draw(st.integers(1, 40))
    ops = []
    for i in range(n):
        ops.append(Op(f"n{i}", "x",
                      flops=draw(st.floats(0, 1e9, allow_nan=False)),
                      bwd_flops=draw(st.floats(0, 2e9, allow_nan=False)),
                      param_bytes=draw(st.integers(0, 10**6)),
                      output_bytes=draw(st.integers(0, 10**6)),
                      colocate=draw(st.sampled_from([None, None, None, "c0", "c1"]))))
    edges = []
    for j in range(1, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            edges.append(Edge(f"n{i}", f"n{j}", draw(st.integers(0, 10**5))))
    # shuffle file order so topological order != file order
    perm = draw(st.permutations(range(n)))
    return Graph("h", [ops[p] for p in perm], edges)


def expected_group_bytes(graph, coarse):
    owner = {m: g for g, ms in coarse.subgraph_members().items() for m in ms}
    sent = {}
    for e in graph.edges:
        a, b = owner[e.src], owner[e.dst]
        if a != b:
            sent[(e.src, b)] = max(sent.get((e.src, b), 0), e.bytes)
    out = {}
    for (src, b), size in sent.items():
        out[(owner[src], b)] = out.get((owner[src], b), 0) + size
    return out


@settings(max_examples=150, deadline=None)
@given(dags(), st.integers(1, 45))
def test_coarsen_keeps_totals_and_stays_acyclic(graph, k):
    coarse = graph.coarsen(k)
    assert len(coarse) == min(k, len(graph))  # every slot used, never more
    assert nx.is_directed_acyclic_graph(coarse.nx)
    assert coarse.total_flops() == pytest.approx(graph.total_flops(), rel=1e-9, abs=1e-6)
    assert coarse.total_bwd_flops() == pytest.approx(graph.total_bwd_flops(), rel=1e-9, abs=1e-6)
    assert coarse.total_param_bytes() == graph.total_param_bytes()
    assert coarse.total_output_bytes() == graph.total_output_bytes()
    members = [m for ms in coarse.subgraph_members().values() for m in ms]
    assert sorted(members) == sorted(graph.ids)
    got = {(e.src, e.dst): e.bytes for e in coarse.edges}
    assert got == expected_group_bytes(graph, coarse)
    # colocated ops end in groups with one shared label
    owner = {m: g for g, ms in coarse.subgraph_members().items() for m in ms}
    for label, ops in graph.colocation_groups().items():
        labels = {coarse.op(owner[o]).colocate for o in ops}
        assert len(labels) == 1 and None not in labels


def test_coarsen_chain_is_balanced():
    chain = Graph("chain", [Op(f"n{i}", flops=1.0) for i in range(100)],
                  [Edge(f"n{i}", f"n{i + 1}", 1) for i in range(99)])
    coarse = chain.coarsen(10)
    assert len(coarse) == 10
    assert {op.flops for op in coarse} == {10.0}


def test_coarsen_uses_every_slot_beside_a_dominant_op():
    # one op heavier than all others together used to collapse the rest
    ops = [Op(f"n{i}", flops=1.0) for i in range(300)] + [Op("head", flops=1e6)]
    edges = [Edge(f"n{i}", f"n{i + 1}", 1) for i in range(299)] + [Edge("n299", "head", 1)]
    coarse = Graph("dominant", ops, edges).coarsen(40)
    assert len(coarse) == 40
    assert max(op.flops for op in coarse if op.id != "head") <= 10


def test_coarsen_no_op_when_small(tiny_graph):
    coarse = tiny_graph.coarsen(10)
    assert coarse.ids == tiny_graph.ids
    assert coarse.meta["coarsened_from"]["fingerprint"] == tiny_graph.fingerprint()


def test_coarsen_rejects_bad_target(tiny_graph):
    with pytest.raises(GraphError):
        tiny_graph.coarsen(0)


def test_expand_plan_from_coarse(tiny_graph):
    from placer import Plan
    coarse = tiny_graph.coarsen(2)
    plan = Plan({g: ["d0"] for g in coarse.ids})
    full = plan.expand(coarse)
    assert set(full.placement) == set(tiny_graph.ids)

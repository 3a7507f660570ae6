"""Ops that mix the batch (``mixes_batch``, :mod:`placer.runtime.scaling`):
the runtime runs a data-parallel piece holding one unsharded on its first
device, and both cost models price the plan so, piece by piece."""

from __future__ import annotations

import pytest
import torch

import placer
from placer.cost import Problem, get_cost_model
from placer.pieces import op_pieces
from placer.runtime.common import prepare
from placer.runtime.scaling import mark_fixed_bytes


class _Normed(torch.nn.Module):
    """Linear -> BatchNorm -> Linear -> Linear: the BatchNorm's statistics
    mix the batch in training."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.b = torch.nn.Linear(16, 16)
        self.c = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(self.bn(self.a(x)))))


def _normed():
    torch.manual_seed(0)
    return _Normed(), (torch.randn(8, 8),)


def _moe():
    from placer import zoo
    return zoo.build("moe", batch=8, seq=16, tiny=True, n_layer=2, n_head=4, d_model=32,
                     vocab=64)


def _marked(module, inputs):
    graph = placer.trace(module, inputs)
    marked = placer.Graph.from_dict(graph.to_dict())
    mark_fixed_bytes(marked, module, inputs)
    return graph, marked


@pytest.fixture(scope="module")
def moe():
    module, inputs = _moe()
    return (module, inputs, *_marked(module, inputs))


@pytest.fixture(scope="module")
def normed():
    module, inputs = _normed()
    return (module, inputs, *_marked(module, inputs))


def _cluster():
    return placer.Cluster.from_rules("two", [placer.Device(d, 1e11, 1e10) for d in ("r0", "r1")],
                                     default=(1e9, 1e-5))


def test_batch_statistics_and_a_static_capacity_are_marked(moe, normed):
    _, _, traced, marked = normed
    assert {op.id for op in marked if op.extra.get("mixes_batch")} == {"bn"}
    assert not any("mixes_batch" in op.extra for op in traced)      # untouched
    _, _, _, marked = moe
    mixing = [op.id for op in marked if op.extra.get("mixes_batch")]
    # the router's dispatch into per-expert capacity, not the token stream
    assert mixing and all(not op.startswith(("wte", "ln_f", "lm_head")) for op in mixing)
    back = placer.Graph.from_dict(marked.to_dict())
    assert [op.id for op in back if op.extra.get("mixes_batch")] == mixing


def _runtime_pieces(module, inputs, graph, plan):
    """(frozenset of op ids, device group, sharded) per piece of the runtime's split."""
    g, _, sp, _, _ = prepare(module, plan, inputs, graph=graph, training=True)
    op_of = {op.extra.get("fx"): op.id for op in g}
    out = set()
    for p in sp.pieces:
        ops = frozenset(op_of[n] for n in p.nodes if n in op_of)
        if ops:
            out.add((ops, tuple(sorted(p.group)), p.sharded or len(p.group) == 1))
    return out


def _model_pieces(graph, plan, runtime):
    """The same as the cost models run the plan (:meth:`Problem.as_run`),
    over the ops the runtime's pieces compute (not the inputs)."""
    known = set().union(*(ops for ops, _, _ in runtime))
    p = Problem(graph, _cluster(), granularity="piece")
    c = p.compile(plan)
    ran = p.as_run_compiled(c)
    piece = op_pieces(ran.op_group, p.edge_src, p.edge_dst)
    out = set()
    for k in set(piece.tolist()):
        idx = [i for i in range(p.n_ops) if piece[i] == k]
        planned = c.groups[c.op_group[idx[0]]]
        devs = ran.groups[ran.op_group[idx[0]]]
        ops = frozenset(p.ids[i] for i in idx) & known
        if ops:
                out.add((ops, tuple(sorted(p.devices[d] for d in planned)),
                     len(devs) == len(planned)))
    return out


def _dp_plan(graph, lo: str, hi: str, m: int = 1):
    """r0 before ``lo``, both ranks from ``lo`` to ``hi``, r1 after it."""
    order = graph.topological_order()
    a, b = order.index(lo), order.index(hi)
    placement = {op: (["r0"] if i < a else ["r0", "r1"] if i <= b else ["r1"])
                 for i, op in enumerate(order)}
    return placer.Plan(placement, microbatches=m)


@pytest.mark.parametrize("span", [("a", "b"), ("b", "c")])
def test_the_models_run_the_pieces_the_runtime_runs_bn(normed, span):
    module, inputs, _, marked = normed
    plan = _dp_plan(marked, *span)
    runtime = _runtime_pieces(module, inputs, marked, plan)
    assert _model_pieces(marked, plan, runtime) == runtime
    # the span holding the BatchNorm runs unsharded, the other sharded
    assert any(not sharded for _, group, sharded in runtime if len(group) > 1) \
        == (span[0] == "a")


def test_the_models_run_the_pieces_the_runtime_runs_moe(moe):
    module, inputs, _, marked = moe
    mixing = [op.id for op in marked if op.extra.get("mixes_batch")]
    order = marked.topological_order()
    first = min(order.index(op) for op in mixing)
    # one span over the first mixing op, one before it (sharded)
    plan = _dp_plan(marked, order[first - 6], order[first + 4], m=2)
    runtime = _runtime_pieces(module, inputs, marked, plan)
    assert _model_pieces(marked, plan, runtime) == runtime
    assert any(not sharded for *_, sharded in runtime)
    early = _dp_plan(marked, order[3], order[first - 8], m=2)
    runtime = _runtime_pieces(module, inputs, marked, early)
    assert _model_pieces(marked, early, runtime) == runtime
    assert all(sharded for *_, sharded in runtime)


@pytest.mark.parametrize("model", ["simulator", "analytical"])
def test_both_models_price_a_mixing_piece_on_its_first_device(normed, model):
    _, _, traced, marked = normed
    cost = get_cost_model(model)
    dp = _dp_plan(marked, marked.topological_order()[0], "b")
    # the same pieces, the span on r0 alone: r0 r1 | r1 -> r0 | r1
    alone = placer.Plan({op: (["r0"] if len(d) > 1 else d) for op, d in dp.placement.items()})
    options = dict(granularity="piece", task_overhead=1e-4, op_overhead=1e-5)
    on = cost.estimate(Problem(marked, _cluster(), **options), dp)
    assert on.step_time == pytest.approx(
        cost.estimate(Problem(marked, _cluster(), **options), alone).step_time, rel=1e-9)
    # unmarked, the span is priced data-parallel: half its compute on r1
    off = cost.estimate(Problem(traced, _cluster(), **options), dp)
    assert off.compute["r1"] > on.compute["r1"]
    assert on.compute["r1"] == pytest.approx(
        cost.estimate(Problem(marked, _cluster(), **options), alone).compute["r1"])


def test_step_times_of_arrays_honour_the_marks(normed):
    _, _, _, marked = normed
    p = Problem(marked, _cluster(), granularity="piece")
    dp = _dp_plan(marked, "a", "b")
    c = p.compile(dp)
    for name in ("simulator", "analytical"):
        cost = get_cost_model(name)
        fast = cost.step_times(p, c.op_group[None], groups=c.groups[p.n_devices:])
        assert fast[0] == pytest.approx(cost.estimate(p, dp).objective, rel=1e-9)

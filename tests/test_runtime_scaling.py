"""Tensors that keep their size in a microbatch (:mod:`placer.runtime.scaling`):
the runtime sends them whole with every microbatch, and with the graph's
``fixed_bytes`` the simulator prices the bytes the runtime sends."""

from __future__ import annotations

import math

import pytest
import torch

import placer
from placer.runtime.common import prepare, sink_device
from placer.runtime.engine import Routes
from placer.runtime.scaling import mark_fixed_bytes


def _moe():
    from placer import zoo
    return zoo.build("moe", batch=8, seq=16, tiny=True, n_layer=2, n_head=4, d_model=32,
                     vocab=64)


def _runtime_bytes(module, inputs, graph, plan) -> float:
    """Bytes a step's messages between devices carry (both phases)."""
    _, _, sp, _, mb_rows = prepare(module, plan, inputs, graph=graph, training=True)
    routes = Routes(sp, mb_rows, sink_device(sp))
    total = 0.0
    for m, msgs in enumerate(routes.msgs):
        for msg in msgs.values():
            if routes.device_of[msg.src] == msg.dst:
                continue
            info = sp.values[msg.value]
            rows = msg.rows[1] - msg.rows[0] if msg.rows else mb_rows[m]
            nbytes = math.prod(info.shape(rows)) * torch.empty(0, dtype=info.dtype).element_size()
            total += nbytes * (2 if msg.grad else 1)
    return total


def _sim_bytes(graph, plan) -> float:
    cluster = placer.Cluster.from_rules("two", [placer.Device(d, 1e11, 1e10) for d in ("r0", "r1")],
                                        default=(1e9, 1e-5))
    report = placer.simulate(graph, cluster, plan)
    return sum(e.args["bytes"] for e in report.events() if e.category == "transfer")


@pytest.fixture(scope="module")
def moe():
    module, inputs = _moe()
    return module, inputs, placer.trace(module, inputs)


def test_the_experts_static_capacity_is_marked(moe):
    module, inputs, graph = moe
    marked = placer.Graph.from_dict(graph.to_dict())
    assert mark_fixed_bytes(marked, module, inputs) > 0
    fixed = {(e.src, e.dst): e.extra.get("fixed_bytes", 0.0) for e in marked.edges}
    # an expert's input (capacity, d) does not shrink with the rows; the
    # token stream does
    expert = [k for k in fixed if k[0] == "blocks.1.mlp.experts.0.fc"]
    assert expert and all(fixed[k] > 0 for k in expert)
    assert fixed[("wte", "add")] == 0.0
    assert "fixed_bytes" not in graph.edges[0].extra   # the traced graph untouched


@pytest.mark.parametrize("m", [1, 4])
def test_simulator_prices_the_bytes_the_runtime_sends(moe, m):
    module, inputs, graph = moe
    experts = {op.id for op in graph if ".experts.0." in op.id or ".experts.1." in op.id}
    plan = placer.Plan({op: ["r1" if op in experts else "r0"] for op in graph.ids},
                       microbatches=m)
    sent = _runtime_bytes(module, inputs, graph, plan)
    marked = placer.Graph.from_dict(graph.to_dict())
    mark_fixed_bytes(marked, module, inputs)
    assert _sim_bytes(marked, plan) == pytest.approx(sent, rel=1e-6)
    if m > 1:
        # the traced bytes alone split the experts' tensors over the microbatches
        assert _sim_bytes(graph, plan) < 0.8 * sent


def test_prepare_marks_a_copy_only_when_needed(moe):
    module, inputs, graph = moe
    plan = placer.Plan({op: ["r0"] for op in graph.ids}, microbatches=2)
    got = prepare(module, plan, inputs, graph=graph, training=True)[0]
    assert got is not graph and any("fixed_bytes" in e.extra for e in got.edges)
    assert not any("fixed_bytes" in e.extra for e in graph.edges)
    # probed once per graph object: the same copy again
    assert prepare(module, plan, inputs, graph=graph, training=True)[0] is got
    # a graph that says it already is taken as it is
    assert prepare(module, plan, inputs, graph=got, training=True)[0] is got

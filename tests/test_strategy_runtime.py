"""Contract: every strategy's plan runs on the runtime and trains like the
unplaced model (parametrized over placer.strategies(), so strategies added
later are covered too). The models reuse weights across ops (an LSTM cell
at every time step, tied embeddings), branch (inception, MoE experts) and
hold batch statistics (BatchNorm); the cluster makes splitting pay, so most
plans use both devices."""

from __future__ import annotations

import functools

import pytest
import torch

import placer
from placer import zoo
from placer.runtime import default_loss
from placer.runtime.engine import microbatch_rows
from placer.search.base import microbatch_candidates, traced_batch

from runtime_helpers import one_thread  # noqa: F401

MODELS = ["gpt-125m", "inception", "gnmt", "moe"]
BATCH = 4


def cluster() -> placer.Cluster:
    """Two slow devices on a fast link: most strategies split the tiny models."""
    return placer.Cluster.from_dict({
        "format": "placer.cluster/v1", "name": "two-ranks",
        "devices": [{"name": "r0", "flops": 1e8, "memory": 1e9},
                    {"name": "r1", "flops": 1e8, "memory": 1e9}],
        "links": {"default": {"bandwidth": 1e11, "latency": 1e-5}}})


def build(name: str):
    return zoo.build(name, tiny=True, batch=BATCH)


@functools.lru_cache(maxsize=None)
def traced(name: str):
    module, inputs = build(name)
    return placer.trace(module, inputs)


def strategy_plan(name: str, method: str) -> placer.Plan:
    return placer.optimize(traced(name), cluster(), method, seed=0, time_budget=None,
                           evaluations=20)


def microbatched_reference(module, inputs, microbatches: int):
    """Loss and gradients of the unplaced model over the plan's microbatches
    (rows as the runtime cuts them, losses weighted by rows): a MoE's
    capacity and BatchNorm's statistics are per microbatch in both."""
    rows = microbatch_rows(BATCH, microbatches)
    module.zero_grad(set_to_none=True)
    total, start = 0.0, 0
    for n in rows:
        part = [t[start:start + n] for t in inputs]
        loss = default_loss(module(*part)) * (n / BATCH)
        loss.backward()
        total += float(loss.detach())
        start += n
    grads = {k: p.grad.detach().clone() for k, p in module.named_parameters()
             if p.grad is not None}
    return total, grads


def check_matches(result_loss, result_grads, module, inputs, microbatches):
    loss, grads = microbatched_reference(module, inputs, microbatches)
    assert abs(result_loss - loss) <= 1e-5 + 1e-4 * abs(loss), (result_loss, loss)
    assert set(result_grads) == set(grads), set(grads) ^ set(result_grads)
    for k, g in grads.items():
        # float32 sums in another order: errors scale with the largest entry
        # (BatchNorm'd convolutions have gradients of 10-30)
        scale = max(1.0, float(g.abs().max()))
        torch.testing.assert_close(result_grads[k], g, atol=1e-5 * scale, rtol=1e-4,
                                   msg=lambda m, k=k: f"{k}: {m}")


def test_microbatch_candidates_divide_the_traced_batch():
    graph = traced("moe")
    assert traced_batch(graph) == BATCH
    assert microbatch_candidates(graph) == [1, 2, 4]
    assert microbatch_candidates(placer.Graph("g", [placer.Op("x")], meta={"batch": 12}),
                                 limit=8) == [1, 2, 4]
    # BatchNorm cannot train on one row: at least two per microbatch
    assert microbatch_candidates(traced("inception")) == [1, 2]
    # unknown batch: every power of two up to the limit
    assert microbatch_candidates(placer.Graph("g", [placer.Op("x")]), limit=8) == [1, 2, 4, 8]
    # m_etf once chose 8 microbatches for this batch of 4
    for method in ("m_etf", "evolution", "heft"):
        plan = strategy_plan("moe", method)
        assert BATCH % plan.microbatches == 0


def test_a_cell_reused_at_every_step_keeps_its_weights_through_the_split():
    # the split's shape probe once left such a cell's weights on the meta device
    from placer.runtime.run import prepare
    module, inputs = build("gnmt")
    plan = strategy_plan("gnmt", "heft")
    assert len(plan.devices_used()) == 2
    *_, sp, _, _ = prepare(module, plan, inputs)
    assert not any(p.is_meta for p in module.parameters())
    assert not any(p.is_meta for piece in sp.pieces for p in piece.module.parameters())


def test_a_value_batched_along_another_dim_crosses_at_its_microbatch_shape():
    # a MoE router's (top_k, tokens, experts): the ranks once received it at
    # the whole batch's shape, half filled (a run-to-run different loss)
    from placer.runtime.split import _info
    full = ("tensor", (2, 64, 4), torch.float32, False)
    half = ("tensor", (2, 32, 4), torch.float32, False)
    info = _info(full, half, 4, 2)
    assert not info.batched and info.shape(1) == (2, 16, 4) and info.shape(4) == (2, 64, 4)
    rows = _info(("tensor", (64, 8), torch.float32, False),
                 ("tensor", (32, 8), torch.float32, False), 4, 2)
    assert rows.batched and rows.shape(1) == (16, 8)
    fixed = _info(("tensor", (3, 8), torch.float32, False),
                  ("tensor", (3, 8), torch.float32, False), 4, 2)
    assert fixed.shape(1) == (3, 8)


@pytest.mark.parametrize("method", placer.strategies())
@pytest.mark.parametrize("name", MODELS)
def test_strategy_plan_runs_and_matches_unplaced(name, method):
    plan = strategy_plan(name, method)
    module, inputs = build(name)
    result = placer.run(module, plan, inputs, steps=1, warmup=0, graph=traced(name))
    module, inputs = build(name)
    check_matches(result.loss, result.gradients, module, inputs, plan.microbatches)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_strategy_plans_run_on_two_ranks(name):
    """Every strategy's plan on gloo ranks (one launch per set of devices)."""
    from placer.bench.fidelity import measure_plans
    plans = [strategy_plan(name, m) for m in placer.strategies()]
    results = measure_plans(plans, name, batch=BATCH, steps=1, warmup=0, keep_gradients=True)
    module, inputs = build(name)
    for method, plan, res in zip(placer.strategies(), plans, results):
        assert res.get("error") is None, (method, res.get("error"))
        check_matches(res["loss"], res["gradients"], module, inputs, plan.microbatches)

"""Several processes over gloo (CPU ranks): the same numbers as one device."""

from __future__ import annotations

import functools

import pytest
import torch

import placer
from placer import Plan, zoo
from placer.errors import PlanError
from placer.runtime.dist import launch, rank_devices

from runtime_helpers import (meta_build, meta_reference, one_thread,  # noqa: F401
                             random_plan, reference)


def _check(result, out, loss, grads):
    torch.testing.assert_close(result["outputs"], out, atol=1e-5, rtol=1e-4)
    assert abs(result["loss"] - loss) < 1e-5
    assert set(result["gradients"]) == set(grads)
    for name, g in grads.items():
        torch.testing.assert_close(result["gradients"][name], g, atol=1e-5, rtol=1e-4)


def test_gloo_ranks_match_unplaced():
    build = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=4)
    model, inputs = build()
    graph = placer.trace(model, inputs)
    out, loss, grads = reference(model, inputs)
    # data-parallel middle, two microbatches, a device used twice
    plan = random_plan(graph, ["a", "b", "c"], seed=0, microbatches=2)
    assert any(len(v) > 1 for v in plan.placement.values())
    result = launch(plan, build, steps=1, warmup=0, timeout=120)
    _check(result, out, loss, grads)
    report = result["report"]
    assert report["step_time"] > 0 and set(report["busy"]) == {"a", "b", "c"}


def test_ranks_build_only_their_pieces_of_a_meta_model():
    # every rank gets the model without weights and builds its own pieces
    full, inputs = meta_reference("gpt-125m")
    graph = placer.trace(full, inputs)
    out, loss, grads = reference(full, inputs)
    plan = random_plan(graph, ["a", "b"], seed=3, microbatches=2)
    result = launch(plan, functools.partial(meta_build, "gpt-125m"),
                    nproc=len(plan.devices_used()), steps=1, warmup=0, timeout=120)
    _check(result, out, loss, grads)


@pytest.mark.slow
@pytest.mark.parametrize("name,seed,schedule", [("bert-base", 1, "gpipe"), ("dlrm", 2, "1f1b")])
def test_gloo_more_models(name, seed, schedule):
    build = functools.partial(zoo.build, name, tiny=True, batch=4)
    model, inputs = build()
    graph = placer.trace(model, inputs)
    out, loss, grads = reference(model, inputs)
    plan = random_plan(graph, ["a", "b", "c"], seed=seed, microbatches=2, schedule=schedule)
    result = launch(plan, build, nproc=len(plan.devices_used()), steps=1, warmup=0, timeout=120)
    _check(result, out, loss, grads)


def test_rank_order_and_nproc_check():
    plan = Plan({"x": ["b"], "y": ["a", "c"]})
    assert rank_devices(plan) == ["b", "a", "c"]
    cluster = placer.Cluster.from_rules("c", [placer.Device(d, 1e12, 1e10) for d in "abc"],
                                        default=(1e9, 1e-4))
    assert rank_devices(plan, cluster) == ["a", "b", "c"]
    with pytest.raises(PlanError):
        launch(plan, functools.partial(zoo.build, "gpt-125m", tiny=True), nproc=2)


def test_pinned_ranks_run_on_their_own_cores_and_match_unplaced():
    import os
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(usable) < 2:
        pytest.skip("pinning two ranks needs two usable cores")
    build = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=4)
    model, inputs = build()
    graph = placer.trace(model, inputs)
    out, loss, grads = reference(model, inputs)
    plan = random_plan(graph, ["a", "b"], seed=3, microbatches=2)
    result = launch(plan, build, steps=1, warmup=0, timeout=120, pin=True)
    _check(result, out, loss, grads)
    cores = result["cores"]
    assert set(cores) == {"a", "b"} and all(cores.values())
    assert not set(cores["a"]) & set(cores["b"])   # no core shared
    assert set(cores["a"]) | set(cores["b"]) <= set(usable)


def test_pin_cores_splits_the_usable_cores():
    import os
    from placer.runtime.dist import pin_cores
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this OS")
    usable = sorted(os.sched_getaffinity(0))
    try:
        assert pin_cores(0, len(usable) + 1) is None      # fewer cores than ranks
        assert sorted(os.sched_getaffinity(0)) == usable  # left alone
        last = pin_cores(len(usable) - 1, len(usable))
        assert last == [usable[-1]] and sorted(os.sched_getaffinity(0)) == last
        os.sched_setaffinity(0, usable)
        assert pin_cores(0, 1) == usable
    finally:
        os.sched_setaffinity(0, usable)


def test_ranks_run_the_schedule_like_the_simulator_and_match_unplaced():
    # a device holding the first and the last piece (with the loss): 1F1B
    # runs a microbatch's backward as soon as its loss is done, before the
    # other microbatch's last forward, as the simulator's rule orders it
    # (placer.schedule), and the numbers match one device
    build = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=4)
    model, inputs = build()
    graph = placer.trace(model, inputs)
    out, loss, grads = reference(model, inputs)
    order = graph.topological_order()
    third = len(order) // 3
    placement = {op: ["a" if i < third or i >= 2 * third else "b"]
                 for i, op in enumerate(order)}
    for members in graph.colocation_groups().values():
        for op in members[1:]:
            placement[op] = list(placement[members[0]])
    plan = Plan(placement, microbatches=2, schedule="1f1b")
    result = launch(plan, build, steps=2, warmup=0, timeout=120, pin=True)
    _check(result, out, loss, grads)
    assert result["schedule"] == "1f1b"
    bars = sorted((e for e in result["events"] if e[0] == "a"), key=lambda e: e[3])
    kinds = [e[1][0] for e in bars if e[2] in ("forward", "backward")]
    # a microbatch's backward beats the other's remaining forwards
    assert kinds.index("B") < len(kinds) - 1 - kinds[::-1].index("F")

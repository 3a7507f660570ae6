"""Helpers for the runtime tests: random plans and the unplaced reference."""

from __future__ import annotations

import random

import torch

from placer import Plan


def random_plan(graph, devices, *, seed: int, microbatches: int = 1, schedule: str = "1f1b",
                max_group: int = 2, segments: int = 4, dp: float = 0.4) -> Plan:
    """Cut the topological order into ``segments`` runs and give each a
    random device or data-parallel group; colocated ops share the group of
    the first of them."""
    rng = random.Random(seed)
    order = graph.topological_order()
    cuts = sorted(rng.sample(range(1, len(order)), min(segments - 1, len(order) - 1)))
    bounds = [0, *cuts, len(order)]
    placement = {}
    for a, b in zip(bounds, bounds[1:]):
        if max_group > 1 and rng.random() < dp:
            group = rng.sample(devices, rng.randint(2, min(max_group, len(devices))))
        else:
            group = [rng.choice(devices)]
        for op_id in order[a:b]:
            placement[op_id] = list(group)
    for members in graph.colocation_groups().values():
        for op_id in members[1:]:
            placement[op_id] = list(placement[members[0]])
    return Plan(placement, microbatches=microbatches, schedule=schedule)


def meta_build(name: str, batch: int = 4):
    """A zoo model built on the meta device (no weights) with real inputs,
    and the same model materialised on the CPU (the reference)."""
    from placer import zoo
    meta, _ = zoo.build(name, tiny=True, batch=batch, device="meta")
    _, inputs = zoo.build(name, tiny=True, batch=batch)
    return meta, inputs


def meta_reference(name: str, batch: int = 4):
    """:func:`meta_build`'s model materialised whole on the CPU, and its inputs."""
    from placer import zoo
    meta, inputs = meta_build(name, batch)
    return zoo.materialize(meta, "cpu"), inputs


def reference(model, inputs, loss_fn=None):
    """Outputs, loss and gradients of the unplaced model on one device."""
    from placer.runtime import default_loss
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    loss = (loss_fn or default_loss)(out)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    out = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.detach(), out)
    return out, float(loss.detach()), grads


def assert_close_result(result, out, loss, grads, *, atol=1e-5, rtol=1e-4):
    """Placed and unplaced agree to float32 tolerance."""
    torch.testing.assert_close(result.outputs, out, atol=atol, rtol=rtol)
    assert abs(result.loss - loss) <= atol + rtol * abs(loss), (result.loss, loss)
    assert set(result.gradients) == set(grads), set(grads) ^ set(result.gradients)
    for name, g in grads.items():
        torch.testing.assert_close(result.gradients[name], g, atol=atol, rtol=rtol,
                                   msg=lambda m, name=name: f"{name}: {m}")


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on small shared CI machines, OpenMP threads that
    spin while cores are busy make tiny models 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Branchy(torch.nn.Module):
    """Two parallel branches between a shared stem and head, and a weight
    used twice (the stem's, again in the head): op-level plans can split
    the branches, the stem and the head over devices."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.stem = torch.nn.Linear(width, width)
        self.left = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                        torch.nn.Linear(width, width))
        self.right = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        y = self.left(h) + self.right(h)
        y = torch.nn.functional.linear(y, self.stem.weight)   # the stem's weight again
        return self.head(y)


def branchy_build(batch: int = 8, width: int = 16):
    """A :class:`Branchy` model and its inputs (deterministic, picklable)."""
    torch.manual_seed(0)
    return Branchy(width), (torch.randn(batch, width),)

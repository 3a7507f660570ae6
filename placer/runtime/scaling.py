"""Which tensors keep their size when the batch is split into microbatches.

A graph's edge says how many bytes a tensor has at the traced batch; the
cost models send ``bytes / m`` of it per microbatch. Most tensors shrink
with the rows, but some do not: a mixture of experts with a static
capacity (GShard's dense dispatch) hands every expert ``(capacity, d)``
rows whatever the microbatch, so a runtime sends the whole tensor with
every microbatch (measured on the zoo's ``moe`` with 8 microbatches over
two ranks: 41.6 MB a step where the graph's bytes said 12.7 MB).
:func:`mark_fixed_bytes` runs the captured model on meta tensors at two
batch sizes (:func:`placer.runtime.split.probe`, what the runtime's split
does) and writes, on every edge whose tensor does not shrink in
proportion, ``fixed_bytes``: the part of its bytes each microbatch sends
whole (``placer.graph/v1``; :class:`placer.cost.Problem` reads it).
"""

from __future__ import annotations

import math
import operator
import weakref

import torch

__all__ = ["node_fixed_fractions", "apply_fixed_bytes", "with_fixed_bytes", "mark_fixed_bytes"]


def _tensor_bytes(desc) -> float | None:
    kind, shape, dtype, _grad = desc
    if kind != "tensor":
        return None
    return float(math.prod(shape)) * torch.empty(0, dtype=dtype).element_size()


def _node_bytes(node, values: dict) -> float | None:
    """Bytes of ``node``'s value: a tensor's, or the sum of the tensors its
    ``getitem`` users take from a container; None when unknown."""
    desc = values.get(node.name)
    if desc is None:
        return None
    own = _tensor_bytes(desc)
    if own is not None:
        return own
    parts = [_tensor_bytes(values[u.name]) for u in node.users
             if u.op == "call_function" and u.target is operator.getitem and u.name in values]
    parts = [b for b in parts if b is not None]
    return sum(parts) if parts else None


def node_fixed_fractions(gm: torch.fx.GraphModule, inputs: list, batch: int) -> dict:
    """fx node name -> the fraction of its value's bytes that does not
    scale with the batch's rows (only nodes where it is above 1%):
    ``bytes(rows) = fixed + per_row * rows`` fitted on the value's bytes at
    ``batch`` rows and at about half of them."""
    from .split import probe
    if batch < 2:
        return {}
    small = batch // 2 if batch >= 4 else batch - 1
    full, part = probe(gm, inputs, batch, small)
    out = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        big, little = _node_bytes(node, full), _node_bytes(node, part)
        if not big or little is None:
            continue
        per_row = (big - little) / (batch - small)
        fixed = min(max(big - per_row * batch, 0.0), big)
        if fixed > 0.01 * big:
            out[node.name] = fixed / big
    return out


def apply_fixed_bytes(graph, fractions: dict) -> int:
    """Write ``fixed_bytes`` (the edge's bytes times its source node's
    fraction in ``fractions``, from :func:`node_fixed_fractions`) on
    ``graph``'s edges, in place, and drop it where the fraction is 0;
    returns how many edges have it."""
    node_of = {op.id: op.extra.get("fx") for op in graph}
    marked = 0
    for edge in graph.edges:
        frac = fractions.get(node_of.get(edge.src))
        if frac and edge.bytes > 0:
            edge.extra["fixed_bytes"] = float(round(edge.bytes * frac))
            marked += 1
        else:
            edge.extra.pop("fixed_bytes", None)
    return marked


#: id(graph) -> (a weak reference to it, batch, the graph with_fixed_bytes gave)
_DONE: dict = {}


def with_fixed_bytes(graph, gm: torch.fx.GraphModule, inputs: list, batch: int):
    """``graph`` itself when its edges' ``fixed_bytes`` already say what
    ``gm`` (its fx capture) does at other batch sizes, else a copy that
    does (the caller's graph is not changed). A model that cannot run
    other batch sizes leaves the graph as it is. Remembered per graph
    object and batch: the probe runs the model twice (seconds for a few
    hundred ops), and a rank runs many plans on one graph."""
    from ..errors import PlacerError
    hit = _DONE.get(id(graph))
    if hit is not None and hit[0]() is graph and hit[1] == batch:
        return hit[2]
    try:
        fractions = node_fixed_fractions(gm, inputs, batch)
    except PlacerError:
        return graph
    copy = type(graph).from_dict(graph.to_dict())
    apply_fixed_bytes(copy, fractions)
    same = all(a.extra.get("fixed_bytes") == b.extra.get("fixed_bytes")
               for a, b in zip(graph.edges, copy.edges))
    out = graph if same else copy
    for key in [k for k, v in _DONE.items() if v[0]() is None]:
        del _DONE[key]
    _DONE[id(graph)] = (weakref.ref(graph), batch, out)
    return out


def mark_fixed_bytes(graph, model: torch.nn.Module, example_inputs) -> int:
    """Write ``fixed_bytes`` on ``graph``'s edges whose tensors keep (part
    of) their size in a microbatch (see the module doc), in place, and drop
    it from the others; returns how many edges have it. A graph not
    captured with torch.fx, or a model that cannot run other batch sizes,
    is left as it is (0)."""
    from ..errors import PlacerError
    from .split import capture, first_batch
    if graph.meta.get("tracer", "fx") != "fx":
        return 0
    names = {op.extra.get("fx") for op in graph if op.extra.get("fx")}
    try:
        gm, inputs = capture(model, example_inputs, graph.meta.get("granularity", "op"),
                             None, names)
        fractions = node_fixed_fractions(gm, inputs, first_batch(inputs))
    except PlacerError:
        return 0
    return apply_fixed_bytes(graph, fractions)

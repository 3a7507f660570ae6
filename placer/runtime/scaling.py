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

The same probe says which ops *mix the batch*
(:func:`placer.runtime.split.mixing_nodes`: batch statistics, a reduction
over the rows, a dispatch into per-expert capacity): the runtime runs a
data-parallel piece holding one unsharded on its group's first device, so
such ops get ``mixes_batch: true`` and the cost models run their pieces so
(:func:`placer.pieces.unshard_mixing`).
"""

from __future__ import annotations

import math
import operator
import weakref

import torch

__all__ = ["node_fixed_fractions", "mixing_ops", "apply_fixed_bytes", "with_fixed_bytes",
           "mark_fixed_bytes"]


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


def node_fixed_fractions(gm: torch.fx.GraphModule, inputs: list, batch: int,
                         probed: tuple | None = None) -> dict:
    """fx node name -> the fraction of its value's bytes that does not
    scale with the batch's rows (only nodes where it is above 1%):
    ``bytes(rows) = fixed + per_row * rows`` fitted on the value's bytes at
    ``batch`` rows and at about half of them. ``probed``: the probe's
    ``(full, part)`` at those sizes when already run."""
    from .split import probe, probe_rows
    if batch < 2:
        return {}
    small = probe_rows(batch)
    full, part = probed or probe(gm, inputs, batch, small)
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


def mixing_ops(graph, gm: torch.fx.GraphModule, inputs: list, batch: int,
               probed: tuple | None = None) -> set[str]:
    """Ids of ``graph``'s ops that mix the batch
    (:func:`placer.runtime.split.mixing_nodes` of its capture ``gm``); a
    node that is no op counts for the op whose device it follows in the
    runtime's split (its first input's)."""
    from .split import mixing_nodes, probe, probe_rows
    if batch < 2:
        return set()
    small = probe_rows(batch)
    full, part = probed or probe(gm, inputs, batch, small)
    names = mixing_nodes(gm, inputs, full, part, batch, small)
    if not names:
        return set()
    owner = {op.extra.get("fx"): op.id for op in graph if op.extra.get("fx")}
    for node in gm.graph.nodes:
        if node.name not in owner:
            src = next((i.name for i in node.all_input_nodes if i.name in owner), None)
            if src is not None:
                owner[node.name] = owner[src]
    return {owner[n] for n in names if n in owner}


def apply_fixed_bytes(graph, fractions: dict, mixing: set | None = None) -> int:
    """Write ``fixed_bytes`` (the edge's bytes times its source node's
    fraction in ``fractions``, from :func:`node_fixed_fractions`) on
    ``graph``'s edges, in place, and drop it where the fraction is 0, and
    ``mixes_batch: true`` on the ops in ``mixing`` (from :func:`mixing_ops`;
    None leaves the ops as they are), dropping it from the others; returns
    how many edges have ``fixed_bytes``."""
    node_of = {op.id: op.extra.get("fx") for op in graph}
    marked = 0
    for edge in graph.edges:
        frac = fractions.get(node_of.get(edge.src))
        if frac and edge.bytes > 0:
            edge.extra["fixed_bytes"] = float(round(edge.bytes * frac))
            marked += 1
        else:
            edge.extra.pop("fixed_bytes", None)
    if mixing is not None:
        for op in graph:
            if op.id in mixing:
                op.extra["mixes_batch"] = True
            else:
                op.extra.pop("mixes_batch", None)
    return marked


def _marks(graph) -> tuple:
    return ([e.extra.get("fixed_bytes") for e in graph.edges],
            [op.extra.get("mixes_batch") for op in graph])


def _probe_marks(graph, gm, inputs, batch: int) -> tuple:
    """``(fractions, mixing)`` of ``graph``'s capture ``gm`` from one probe."""
    from .split import probe, probe_rows
    if batch < 2:
        return {}, set()
    probed = probe(gm, inputs, batch, probe_rows(batch))
    return (node_fixed_fractions(gm, inputs, batch, probed),
            mixing_ops(graph, gm, inputs, batch, probed))


#: id(graph) -> (a weak reference to it, batch, the graph with_fixed_bytes gave)
_DONE: dict = {}


def with_fixed_bytes(graph, gm: torch.fx.GraphModule, inputs: list, batch: int):
    """``graph`` itself when its edges' ``fixed_bytes`` and its ops'
    ``mixes_batch`` already say what ``gm`` (its fx capture) does at other
    batch sizes, else a copy that does (the caller's graph is not changed). A model that cannot run
    other batch sizes leaves the graph as it is. Remembered per graph
    object and batch: the probe runs the model twice (seconds for a few
    hundred ops), and a rank runs many plans on one graph."""
    from ..errors import PlacerError
    hit = _DONE.get(id(graph))
    if hit is not None and hit[0]() is graph and hit[1] == batch:
        return hit[2]
    try:
        fractions, mixing = _probe_marks(graph, gm, inputs, batch)
    except PlacerError:
        return graph
    copy = type(graph).from_dict(graph.to_dict())
    apply_fixed_bytes(copy, fractions, mixing)
    out = graph if _marks(graph) == _marks(copy) else copy
    for key in [k for k, v in _DONE.items() if v[0]() is None]:
        del _DONE[key]
    _DONE[id(graph)] = (weakref.ref(graph), batch, out)
    return out


def mark_fixed_bytes(graph, model: torch.nn.Module, example_inputs) -> int:
    """Write ``fixed_bytes`` on ``graph``'s edges whose tensors keep (part
    of) their size in a microbatch and ``mixes_batch`` on its ops that mix
    the batch (see the module doc), in place, and drop them from the
    others; returns how many edges have ``fixed_bytes``. A graph not
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
        fractions, mixing = _probe_marks(graph, gm, inputs, first_batch(inputs))
    except PlacerError:
        return 0
    return apply_fixed_bytes(graph, fractions, mixing)

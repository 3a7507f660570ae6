"""Op graphs of very deep models without tracing every layer.

Tracing a foundation model with thousands of blocks at op granularity takes
minutes and gigabytes; its op graph is the same block over and over.
:func:`deepen` traces a zoo model with three blocks (on the meta device: no
weights are allocated) and builds the graph of ``layers`` blocks from it:
the first and last traced blocks stay, the middle one is repeated with
its own edges, each copy fed by the one before it exactly as the middle
block was fed by the first (the residual stream and any other edge between
neighbouring blocks), and edges from the ops before the blocks (the
embedding, a mask) into the middle block repeated for every copy. Costs
(FLOPs, bytes) are the traced block's, so a copy costs what a traced layer
of the deep model would.

>>> g = deepen("gpt-125m", 6, batch=2, seq=16, tiny=True)
>>> len(g) == len(deepen("gpt-125m", 5, batch=2, seq=16, tiny=True)) + 17
True
"""

from __future__ import annotations

import re

from .errors import GraphError
from .graph import Edge, Graph, Op

#: the id of a block's first op in zoo transformers' op graphs
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def deepen(model: str, layers: int, *, batch: int | None = None, seq: int | None = None,
           tiny: bool = False, **overrides) -> Graph:
    """The op graph of zoo transformer ``model`` with ``layers`` blocks (at
    least 3), traced with three blocks and replicated (see the module doc).
    ``overrides`` change other config fields (``d_model=...``)."""
    from . import datasets
    from .trace import trace
    if int(layers) != layers or layers < 3:
        raise GraphError(f"layers must be a whole number >= 3, got {layers!r}", field="layers")
    module, inputs = datasets.model(model, batch, seq, device=None if tiny else "meta",
                                    tiny=tiny, n_layer=3, **overrides)
    traced = trace(module, inputs, granularity="op", name=model)
    return replicate_middle_block(traced, int(layers), name=f"{model}-l{int(layers)}.op")


def replicate_middle_block(traced: Graph, layers: int, name: str | None = None) -> Graph:
    """``traced`` (an op graph with blocks 0, 1, 2 in topological order,
    each starting at an op ``blocks.K.*``) with block 1 repeated so there
    are ``layers`` blocks."""
    order = traced.topological_order()
    starts = {}
    for i, op_id in enumerate(order):
        m = _BLOCK.match(op_id)
        if m and int(m.group(1)) not in starts:
            starts[int(m.group(1))] = i
    if sorted(starts) != [0, 1, 2]:
        raise GraphError(f"expected blocks 0, 1 and 2 in {traced.name!r}, found "
                         f"{sorted(starts)}", field="nodes")
    s0, s1, s2 = starts[0], starts[1], starts[2]
    width = s1 - s0
    last = next((i for i in range(s2, len(order)) if i - s2 >= width), len(order))
    if s2 - s1 != width or last - s2 != width:
        raise GraphError(f"blocks of {traced.name!r} differ in size", field="nodes")
    pos = {op_id: i for i, op_id in enumerate(order)}

    def part(i: int) -> str:
        return "pre" if i < s0 else "b0" if i < s1 else "b1" if i < s2 else \
            "b2" if i < last else "post"

    copies = layers - 2

    def renamed(op_id: str, k: int) -> str:
        """Op ``op_id`` of block 1 (or 2) as block ``k``'s."""
        m = _BLOCK.match(op_id)
        return f"blocks.{k}.{op_id[m.end():]}" if m else f"{op_id}@{k}"

    ops: list[Op] = []
    for i, op_id in enumerate(order):
        op = traced.op(op_id)
        where = part(i)
        if where == "b1":
            continue
        if where == "b2":
            new = renamed(op_id, layers - 1)
            ops.append(_copy(op, new, layers - 1))
        else:
            ops.append(op)
    # insert the copies after block 0 (keeping a topological file order)
    middle = [order[i] for i in range(s1, s2)]
    copied = [_copy(traced.op(op_id), renamed(op_id, 1 + j), 1 + j)
              for j in range(copies) for op_id in middle]
    cut = next(k for k, op in enumerate(ops) if pos.get(op.id, -1) == s1 - 1) + 1
    ops = ops[:cut] + copied + ops[cut:]

    def block_name(op_id: str, k: int) -> str:
        """An op of a traced block as the op of block ``k`` of the result."""
        i = pos[op_id]
        where = part(i)
        if where == "b0":
            return op_id if k == 0 else renamed(order[s1 + i - s0], k)
        if where == "b1":
            return renamed(op_id, k)
        return renamed(op_id, layers - 1)     # b2

    edges: list[Edge] = []
    for e in traced.edges:
        a, b = part(pos[e.src]), part(pos[e.dst])
        if "b1" not in (a, b) and not (a == "b0" and b == "b2"):
            src = e.src if a != "b2" else renamed(e.src, layers - 1)
            dst = e.dst if b != "b2" else renamed(e.dst, layers - 1)
            edges.append(Edge(src, dst, e.bytes, dict(e.extra)))
        elif a == "b1" and b == "b1":
            edges.extend(Edge(renamed(e.src, k), renamed(e.dst, k), e.bytes, dict(e.extra))
                         for k in range(1, layers - 1))
        elif a == "b0" and b == "b1":       # from the block before
            edges.extend(Edge(block_name(e.src, k - 1), renamed(e.dst, k), e.bytes,
                              dict(e.extra)) for k in range(1, layers - 1))
        elif a == "b1" and b == "b2":       # into the last block
            edges.append(Edge(renamed(e.src, layers - 2), renamed(e.dst, layers - 1),
                              e.bytes, dict(e.extra)))
        elif a == "pre" and b == "b1":      # e.g. a mask every block reads
            edges.extend(Edge(e.src, renamed(e.dst, k), e.bytes, dict(e.extra))
                         for k in range(1, layers - 1))
        elif a == "b1" and b == "post":
            edges.append(Edge(renamed(e.src, layers - 2), e.dst, e.bytes, dict(e.extra)))
        else:
            raise GraphError(f"edge {e.src} -> {e.dst} skips a block; cannot replicate",
                             field="edges")
    meta = dict(traced.meta)
    meta["generator"] = "deepen"
    meta["description"] = (f"{traced.name} traced with 3 blocks of {width} ops, the middle "
                           f"one repeated to {layers} blocks")
    return Graph(name or f"{traced.name}-l{layers}", ops, edges, training=traced.training,
                 meta=meta)


def _copy(op: Op, new_id: str, k: int) -> Op:
    return Op(new_id, op.op, op.flops, op.bwd_flops, op.param_bytes, op.output_bytes,
              None if op.colocate is None else f"{op.colocate}@{k}", dict(op.extra))

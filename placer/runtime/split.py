"""Cut a traced model into per-device pieces the way a plan says.

The model is captured with the same ``torch.fx`` tracer :func:`placer.trace`
uses, so its node names are the graph's ``op.extra["fx"]``. Every node that
computes a tensor goes to the device group of its op (tensor nodes without an
op, such as ``getitem`` on a tuple, follow their source). Nodes that compute
no tensor (``x.size(0)``, ``x.device``) are copied into every piece that uses
them, so each replica computes its own sizes. Runs of nodes on one group
become pieces, pieces of one group merge while that keeps them acyclic, and
``torch.fx.passes.split_module`` turns them into one ``GraphModule`` each.

A *probe* runs the split module on meta tensors at two batch sizes. A value
is *batched* when its dim 0 is proportional to the batch; a piece may be
sharded across its data-parallel group only when every tensor it computes
from batched data is batched too and it holds no batch-statistics layer.
"""

from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module
from torch.utils import _pytree as pytree

from ..errors import PlanError, TraceError

_SHAPE_METHODS = {"size", "dim", "numel", "ndimension"}
_SHAPE_ATTRS = {"shape", "ndim", "dtype"}
_BATCH_STAT_MODULES = (torch.nn.modules.batchnorm._BatchNorm,)


@dataclass
class ValueInfo:
    """What the probe learnt about one value crossing pieces."""

    is_tensor: bool
    batched: bool = False
    factor: int = 1                    # dim 0 = factor * rows
    rest: tuple = ()                   # shape after dim 0 (or whole shape if unbatched)
    dtype: Any = None
    requires_grad: bool = False
    #: a value that is not batched along dim 0 but has another dim
    #: proportional to the rows (``(top_k, tokens, experts)`` of a MoE
    #: router): that dim and its size per row
    scale_dim: int | None = None
    scale: int = 1

    def shape(self, rows: int) -> tuple:
        """The value's shape for ``rows`` rows of the batch (a microbatch or
        a replica's share of one)."""
        if self.batched:
            return (rows * self.factor, *self.rest)
        if self.scale_dim is not None:
            out = list(self.rest)
            out[self.scale_dim] = rows * self.scale
            return tuple(out)
        return self.rest


@dataclass
class Source:
    """Where a piece input comes from: a model input or a piece output."""

    kind: str                          # "input", "piece" or "const"
    index: int = 0                     # placeholder index or piece index
    out: int = 0                       # output index of that piece
    value: Any = None                  # for "const"

    @property
    def key(self) -> tuple:
        return (self.kind, self.index, self.out)


@dataclass
class Piece:
    """One submodule of the split model and the device group it runs on."""

    index: int
    group: tuple
    module: torch.fx.GraphModule
    inputs: list                       # Source per placeholder
    shape_only: list                   # per placeholder: only its shape is read
    n_outputs: int
    sharded: bool = True
    params: list = field(default_factory=list)   # qualified names in the model
    #: the traced model's node names it computes (split_module renames them
    #: inside ``module``)
    nodes: list = field(default_factory=list)


@dataclass
class Split:
    """The model cut into pieces, with what is known of every crossing value."""

    pieces: list
    n_inputs: int
    input_names: list
    output_spec: Any                   # pytree spec of the model output
    output_sources: list               # Source per output leaf
    values: dict                       # Source.key -> ValueInfo
    batch: int
    param_names: dict                  # id(param or buffer) -> qualified name
    notes: list = field(default_factory=list)


# --------------------------------------------------------------------------
# capture
# --------------------------------------------------------------------------
def capture(model: torch.nn.Module, example_inputs: Any, granularity: str = "op",
            leaf_modules=None, names: set | None = None):
    """Capture ``model`` with fx exactly as :func:`placer.trace` does.

    Returns ``(gm, inputs)``: the GraphModule and one value per placeholder.
    ``names`` (fx node names the graph refers to) picks the capture whose
    nodes carry them when granularity ``"module"`` offers several."""
    import importlib
    import sys
    importlib.import_module("placer.trace")
    T = sys.modules["placer.trace"]

    args, kwargs = T._normalize_inputs(model, example_inputs)
    failures = []
    for is_leaf in T._leaf_predicate(model, granularity, leaf_modules):
        try:
            captured = T._capture_fx(model, args, kwargs, is_leaf)
        except T._CaptureFailed as exc:
            failures.append(exc.reason)
            continue
        have = {n.name for n in captured.gm.graph.nodes}
        if names is not None and not names <= have:
            failures.append("fx capture does not have the graph's nodes")
            continue
        return captured.gm, list(captured.inputs)
    raise TraceError(f"cannot capture {type(model).__name__} with torch.fx for the runtime: "
                     + "; ".join(failures),
                     fix="the runtime needs an fx-traceable model (pass the graph's "
                     "granularity and leaf_modules)")


# --------------------------------------------------------------------------
# probing shapes on meta tensors
# --------------------------------------------------------------------------
class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, node):
        value = super().run_node(node)
        self.values[node.name] = _describe(value)
        return value


def _describe(value):
    """(kind, shape, dtype, requires_grad); a container's "shape" is
    (its type, its length) when it is a plain tuple or list of tensors,
    else None."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, bool(value.requires_grad))
    leaves = [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
    flat = type(value) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in value)
    return ("container" if leaves else "other",
            (type(value), len(value)) if flat and leaves else None, None, False)


class _Holder(torch.nn.Module):
    def __init__(self, gm):
        super().__init__()
        self.gm = gm

    def forward(self, *inputs):
        rec = _Recorder(self.gm)
        rec.run(*inputs)
        return rec.values


def first_batch(inputs: list) -> int:
    """The batch: dim 0 of the first input that has dims."""
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    raise PlanError("no input has a batch dimension", fix="pass batched example inputs")


def _batched_mask(inputs: list, batch: int) -> list[bool]:
    return [isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == batch
            for t in inputs]


def _rows(value, rows: int, batched: bool):
    return value[:rows] if batched else value


def probe(gm: torch.fx.GraphModule, inputs: list, batch: int, small: int) -> tuple[dict, dict]:
    """Describe every node of ``gm`` at batch ``batch`` and ``small``.

    Runs on meta tensors; falls back to the real weights on their device when
    a node needs data. Returns two dicts node name -> (kind, shape, dtype,
    requires_grad).

    What meta tensors found is kept (:data:`PROBE_CACHE_SIZE` modules) and
    given again for a module of the same code, submodules, weight and
    input shapes: a meta run depends on nothing else. Why: every launch
    splits the model (three probes), and on meta tensors an LSTM cell runs
    as PyTorch's reference decompositions, so gnmt's probes took 1.2 of the
    1.3 s a plan's start took on the runtime, every time a plan, or the
    same plan again, was started in one process (the fidelity bench starts
    each plan three times per start of the ranks)."""
    key = _probe_key(gm, inputs, batch, small)
    kept = _PROBES.get(key)
    if kept is not None:
        return dict(kept[0]), dict(kept[1])
    with _kept_state(gm):
        full, part, on_meta = _probe(gm, inputs, batch, small)
    if on_meta:
        if len(_PROBES) >= PROBE_CACHE_SIZE:
            _PROBES.pop(next(iter(_PROBES)))
        _PROBES[key] = (dict(full), dict(part))
    return full, part


#: how many meta probes :func:`probe` keeps (oldest dropped first)
PROBE_CACHE_SIZE = 256

_PROBES: dict[tuple, tuple[dict, dict]] = {}


def _tensor_sig(t) -> tuple:
    return (tuple(t.shape), t.dtype, bool(t.requires_grad)) if isinstance(t, torch.Tensor) \
        else ("value", repr(t))


def _probe_key(gm: torch.fx.GraphModule, inputs: list, batch: int, small: int) -> tuple:
    """What a meta probe of ``gm`` depends on: its code, its submodules'
    kinds, settings and code (a split module's pieces), its weights' and the inputs' shapes, dtypes and
    gradient flags, and the two batch sizes."""
    # a split module's own code may be alike for two cuts: its pieces' is not
    modules = tuple((name, type(m).__qualname__, m.extra_repr(), getattr(m, "code", None))
                    for name, m in gm.named_modules())
    weights = tuple((name, _tensor_sig(t)) for name, t in
                    [*gm.named_parameters(remove_duplicate=False),
                     *gm.named_buffers(remove_duplicate=False)])
    return (gm.code, modules, weights, tuple(_tensor_sig(t) for t in inputs), batch, small)


@contextlib.contextmanager
def _kept_state(module: torch.nn.Module):
    """Put every parameter and buffer of ``module`` back afterwards.

    ``functional_call`` swaps tensors in by name and back in the same order;
    a submodule reached under two names (an LSTM cell called at every time
    step lands in several pieces of the split module) is swapped twice, so
    its second "original" is the first replacement and the weight stays a
    meta tensor."""
    kept = [(mod, table, dict(getattr(mod, table)))
            for mod in module.modules() for table in ("_parameters", "_buffers")]
    try:
        yield
    finally:
        for mod, table, values in kept:
            getattr(mod, table).update(values)


def _probe(gm, inputs, batch, small):
    mask = _batched_mask(inputs, batch)
    holder = _Holder(gm)
    out = []
    for meta in (True, False):
        try:
            results = []
            for rows in (batch, small):
                if meta:
                    # one meta tensor per weight, so tied names stay tied
                    twins: dict[int, torch.Tensor] = {}
                    state = {f"gm.{k}": twins.setdefault(id(v), torch.empty_like(
                        v, device="meta").requires_grad_(v.requires_grad))
                        for k, v in gm.named_parameters(remove_duplicate=False)}
                    state.update({f"gm.{k}": twins.setdefault(id(v), torch.empty_like(
                        v, device="meta")) for k, v in gm.named_buffers(remove_duplicate=False)})
                    args = [torch.empty_like(_rows(t, rows, m), device="meta")
                            if isinstance(t, torch.Tensor) else t
                            for t, m in zip(inputs, mask)]
                    results.append(torch.func.functional_call(holder, state, tuple(args),
                                                              strict=False, tie_weights=True))
                else:
                    # Copies of the buffers, so BatchNorm statistics stay untouched.
                    state = {f"gm.{k}": v.clone()
                             for k, v in gm.named_buffers(remove_duplicate=False)}
                    args = [_rows(t, rows, m) for t, m in zip(inputs, mask)]
                    results.append(torch.func.functional_call(holder, state, tuple(args),
                                                              strict=False, tie_weights=True))
            return results[0], results[1], meta
        except Exception as exc:  # meta cannot run data-dependent nodes
            out.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    raise TraceError("cannot run the model on split batches: " + "; ".join(out),
                     fix="the runtime splits the batch along dim 0; check the model "
                     "accepts other batch sizes")


def _info(full, small, batch: int, rows: int) -> ValueInfo:
    kind, shape, dtype, grad = full
    if kind != "tensor":
        return ValueInfo(is_tensor=False)
    s_kind, s_shape, _, _ = small
    batched = False
    factor = 1
    if (batch != rows and s_kind == "tensor" and len(shape) > 0 and len(s_shape) == len(shape)
            and shape[0] != s_shape[0] and shape[0] % batch == 0
            and s_shape[0] * batch == shape[0] * rows and tuple(shape[1:]) == tuple(s_shape[1:])):
        batched = True
        factor = shape[0] // batch
    rest = tuple(shape[1:]) if batched else tuple(shape)
    info = ValueInfo(True, batched, factor, rest, dtype, grad)
    if not batched and batch != rows and s_kind == "tensor" and len(s_shape) == len(shape):
        # another dim proportional to the rows, the others alike
        diff = [d for d in range(len(shape)) if shape[d] != s_shape[d]]
        if len(diff) == 1 and shape[diff[0]] % batch == 0 \
                and s_shape[diff[0]] * batch == shape[diff[0]] * rows:
            info.scale_dim, info.scale = diff[0], shape[diff[0]] // batch
    return info


# --------------------------------------------------------------------------
# partition
# --------------------------------------------------------------------------
def _is_floating(name: str, full: dict) -> bool:
    desc = full.get(name)
    return desc is not None and desc[0] == "other"


def split(model: torch.nn.Module, gm: torch.fx.GraphModule, inputs: list,
          node_groups: dict[str, tuple], *, batch: int, small: int,
          shard: bool = True) -> Split:
    """Split ``gm`` into pieces by ``node_groups`` (fx node name -> device
    group for the nodes that are graph ops). ``shard=False`` keeps every piece
    on the first device of its group."""
    _attrs_as_modules(gm)
    graph = gm.graph
    full, part = probe(gm, inputs, batch, small)
    _unpack_containers(gm, full)
    nodes = list(graph.nodes)
    default = next(iter(node_groups.values()))

    # 1. a group for every node that computes a tensor
    group: dict[torch.fx.Node, tuple] = {}
    floating: list[torch.fx.Node] = []
    for node in nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        if node.name in node_groups:
            group[node] = node_groups[node.name]
        elif _is_floating(node.name, full):
            floating.append(node)
        else:
            src = next((i for i in node.all_input_nodes if i in group), None)
            group[node] = group[src] if src is not None else default

    # 2. runs of one group in node order, then merge while acyclic
    run_of: dict[torch.fx.Node, int] = {}
    runs: list[tuple] = []
    for node in nodes:
        if node in group:
            if not runs or runs[-1] != group[node]:
                runs.append(group[node])
            run_of[node] = len(runs) - 1

    fset = set(floating)

    def sources(node) -> set:
        """Runs a node's tensor inputs come from, through floating nodes."""
        out = set()
        for i in node.all_input_nodes:
            if i in run_of:
                out.add(run_of[i])
            elif i in fset:
                out |= sources(i)
        return out

    # runs of one group merged into one piece while the pieces stay acyclic
    # (the simulator's granularity="piece" merges them with the same function)
    from ..pieces import merge_runs
    merged = dict(enumerate(merge_runs(runs, [(s, run_of[node]) for node in run_of
                                              for s in sources(node) if s != run_of[node]])))
    piece_of = {node: merged[r] for node, r in run_of.items()}

    # 3. floating nodes: one copy per piece that uses them
    users_pieces: dict[torch.fx.Node, set] = {}
    last_piece = max(piece_of.values()) if piece_of else 0
    for node in reversed(floating):
        wanted = set()
        for u in node.users:
            if u in fset:
                wanted |= users_pieces[u]
            elif u.op == "output":
                wanted.add(last_piece)
            elif u in piece_of:
                wanted.add(piece_of[u])
        users_pieces[node] = wanted or {last_piece}
    copies: dict[torch.fx.Node, dict[int, torch.fx.Node]] = {}
    for node in floating:
        copies[node] = {}
        anchor = node
        for p in sorted(users_pieces[node]):
            with graph.inserting_after(anchor):
                clone = graph.node_copy(
                    node, lambda a, p=p: copies[a][p] if a in copies and p in copies[a] else a)
            copies[node][p] = clone
            piece_of[clone] = p
            anchor = clone
    for node in list(graph.nodes):
        if node in fset:
            continue
        p = piece_of.get(node, last_piece if node.op == "output" else None)
        if p is None:
            continue
        for a in list(node.all_input_nodes):
            if a in copies:
                node.replace_input_with(a, copies[a].get(p) or next(iter(copies[a].values())))
    for node in reversed(floating):
        graph.erase_node(node)
    graph.lint()
    gm.recompile()

    # 4. nodes grouped by piece, pieces in topological order: split_module
    # (keep_original_order) builds the pieces in the order their first nodes
    # come, and a merged piece's first node may precede a piece it needs
    body = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    ordered = sorted(body, key=lambda n: piece_of.get(n, -1))
    if ordered != body:
        out = next(n for n in graph.nodes if n.op == "output")
        for node in ordered:
            out.prepend(node)
        graph.lint()
        gm.recompile()
    # 5. split
    name_piece = {n.name: p for n, p in piece_of.items()}
    top = split_module(gm, model, lambda n: name_piece[n.name], keep_original_order=True)
    return _assemble(model, gm, top, inputs, node_groups, name_piece, piece_of, merged,
                     runs, batch, small, shard)


class _Attr(torch.nn.Module):
    """A parameter or buffer read directly (an fx ``get_attr``) as a module
    call, so it is built in the pieces that read it."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        if isinstance(value, torch.nn.Parameter):
            self.value = value
        else:
            self.register_buffer("value", value)

    def forward(self) -> torch.Tensor:
        return self.value


def _attrs_as_modules(gm: torch.fx.GraphModule) -> None:
    """Turn ``get_attr`` nodes of tensors into calls of :class:`_Attr`
    modules holding the same tensor objects: ``split_module`` would pass
    such tensors into the pieces as inputs, cut off from their gradients."""
    changed = False
    for i, node in enumerate(list(gm.graph.nodes)):
        if node.op != "get_attr":
            continue
        value = gm
        for part in node.target.split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            continue
        name = f"_placer_attr_{i}"
        gm.add_submodule(name, _Attr(value))
        with gm.graph.inserting_after(node):
            call = gm.graph.call_module(name, ())
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _unpack_containers(gm: torch.fx.GraphModule, full: dict) -> None:
    """A node that takes a whole tuple or list of tensors computed by
    another (``cell(x, state)`` with ``state`` an LSTM cell's ``(h, c)``)
    gets it rebuilt from ``getitem`` nodes instead: those follow their
    source's piece, so when the two nodes run on different devices the
    tensors cross one by one (a message carries one tensor)."""
    changed = False
    for node in list(gm.graph.nodes):
        desc = full.get(node.name)
        if node.op == "placeholder" or desc is None or desc[0] != "container" \
                or desc[1] is None:
            continue
        users = [u for u in node.users if u.op in ("call_module", "call_function", "call_method")
                 and not (u.target is operator.getitem and u.args[0] is node)]
        if not users:
            continue
        kind, length = desc[1]
        items = []
        anchor = node
        for i in range(length):
            with gm.graph.inserting_after(anchor):
                anchor = gm.graph.call_function(operator.getitem, (node, i))
            items.append(anchor)
        rebuilt = kind(items)
        for u in users:
            u.replace_input_with(node, rebuilt)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _assemble(model, gm, top, inputs, node_groups, name_piece, piece_of, merged, runs,
              batch, small, shard) -> Split:
    placeholders = [n for n in top.graph.nodes if n.op == "placeholder"]
    source_of: dict[torch.fx.Node, Source] = {p: Source("input", i)
                                              for i, p in enumerate(placeholders)}
    pieces: list[Piece] = []
    piece_group = {}
    for r, p in merged.items():
        piece_group[p] = runs[r]
    param_names: dict[int, str] = {}
    for pname, t in model.named_parameters(remove_duplicate=False):
        param_names.setdefault(id(t), pname)
    for bname, t in model.named_buffers(remove_duplicate=False):
        param_names.setdefault(id(t), bname)
    for pname, t in gm.named_parameters(remove_duplicate=False):
        param_names.setdefault(id(t), pname)
    for bname, t in gm.named_buffers(remove_duplicate=False):
        param_names.setdefault(id(t), bname)

    for node in top.graph.nodes:
        if node.op == "call_module":
            sub = getattr(top, node.target)
            pid = int(node.target.rsplit("_", 1)[1])
            out_node = next(n for n in sub.graph.nodes if n.op == "output")
            multi = isinstance(out_node.args[0], (tuple, list))
            n_out = len(out_node.args[0]) if multi else 1
            srcs = []
            for a in node.args:
                if isinstance(a, torch.fx.Node):
                    srcs.append(source_of[a])
                else:
                    srcs.append(Source("const", value=a))
            sub_ph = [n for n in sub.graph.nodes if n.op == "placeholder"]
            shape_only = [bool(ph.users) and all(_reads_shape(u) for u in ph.users)
                          for ph in sub_ph]
            names = []
            seen = set()
            for t in list(sub.parameters()) + list(sub.buffers()):
                if id(t) not in seen:
                    seen.add(id(t))
                    names.append(param_names.get(id(t), ""))
            piece = Piece(len(pieces), piece_group[pid], sub, srcs, shape_only, n_out,
                          params=names,
                          nodes=[n for n, q in name_piece.items() if q == pid])
            piece.pid = pid
            piece.multi = multi
            pieces.append(piece)
            if multi:
                for u in node.users:
                    source_of[u] = Source("piece", piece.index, u.args[1])
            else:
                source_of[node] = Source("piece", piece.index, 0)
    out_node = next(n for n in top.graph.nodes if n.op == "output")
    leaves, spec = pytree.tree_flatten(out_node.args[0])
    out_sources = [source_of[x] if isinstance(x, torch.fx.Node) else Source("const", value=x)
                   for x in leaves]

    # probe the split module for the crossing values
    full, part = probe(top, inputs, batch, small)
    values: dict[tuple, ValueInfo] = {}
    for node, src in source_of.items():
        if node.name in full:
            values[src.key] = _info(full[node.name], part[node.name], batch, small)
    mask = _batched_mask(inputs, batch)
    for i, m in enumerate(mask):
        t = inputs[i]
        if isinstance(t, torch.Tensor):
            values[("input", i, 0)] = ValueInfo(True, m, 1,
                                                tuple(t.shape[1:]) if m else tuple(t.shape),
                                                t.dtype, False)
        else:
            values[("input", i, 0)] = ValueInfo(False)

    # which pieces may shard: probe the inner nodes
    gfull, gpart = probe(gm, inputs, batch, small)
    notes = []
    mixing_pieces = {piece_of_name(name_piece, name)
                     for name in mixing_nodes(gm, inputs, gfull, gpart, batch, small)}
    if batch == small:
        shard = False
    for piece in pieces:
        single = len(piece.group) == 1
        if not shard:
            piece.sharded = False
        elif not single and piece.pid in mixing_pieces:
            piece.sharded = False
            notes.append(f"piece {piece.index} on {list(piece.group)} mixes the batch "
                         f"(batch statistics or a reduction over it); it runs unsharded on "
                         f"{piece.group[0]}")
        else:
            piece.sharded = not single
    placeholder_names = [n.name for n in placeholders]
    return Split(pieces, len(placeholders), placeholder_names, spec, out_sources, values,
                 batch, param_names, notes)


def probe_rows(batch: int) -> int:
    """The second batch size :func:`probe` runs beside ``batch`` rows: any
    other size tells batched values apart; 2+ rows keep BatchNorm happy."""
    return batch // 2 if batch >= 4 else batch - 1


def mixing_nodes(gm: torch.fx.GraphModule, inputs: list, full: dict, part: dict,
                 batch: int, small: int) -> set[str]:
    """fx node names of ``gm`` that mix the batch: a batch-statistics layer
    in training, or a tensor computed from batched data that is not itself
    batched along dim 0 (a reduction over the rows, a MoE's dispatch into
    per-expert capacity). ``full``/``part``: :func:`probe` of ``gm`` at
    ``batch`` and ``small`` rows. A piece holding one runs unsharded; the
    cost models read the same marks (``mixes_batch``, see
    :mod:`placer.runtime.scaling`)."""
    tainted: set[str] = {n.name for n, m in zip(
        [n for n in gm.graph.nodes if n.op == "placeholder"], _batched_mask(inputs, batch))
        if m}
    out: set[str] = set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        info = _info(full[node.name], part[node.name], batch, small) \
            if node.name in full else ValueInfo(False)
        fed = any(i.name in tainted for i in node.all_input_nodes)
        stat = node.op == "call_module" and isinstance(gm.get_submodule(node.target),
                                                       _BATCH_STAT_MODULES) \
            and gm.get_submodule(node.target).training
        stat = stat or (node.op == "call_function"
                        and getattr(node.target, "__name__", "") == "batch_norm")
        desc = full.get(node.name, ("other",))
        if stat:
            out.add(node.name)
        if fed and (info.batched or desc[0] == "container"):
            tainted.add(node.name)
        elif fed and desc[0] == "tensor":
            out.add(node.name)
    return out


def piece_of_name(name_piece: dict, name: str) -> int:
    return name_piece.get(name, -1)


def _reads_shape(user: torch.fx.Node) -> bool:
    if user.op == "call_method" and user.target in _SHAPE_METHODS:
        return True
    if user.op == "call_function" and user.target is getattr and len(user.args) > 1 \
            and user.args[1] in _SHAPE_ATTRS:
        return True
    return user.op == "call_function" and user.target is len


def node_groups(graph, plan, gm: torch.fx.GraphModule) -> dict[str, tuple]:
    """fx node name -> device group, from the graph's ``fx`` keys and the plan."""
    fx_names = {n.name for n in gm.graph.nodes}
    groups = {}
    for op in graph:
        name = op.extra.get("fx")
        if name is None or name not in fx_names:
            continue
        if op.id not in plan.placement:
            raise PlanError(f"op {op.id!r} not placed", field="placement",
                            fix="plan for this graph")
        groups[name] = tuple(plan.placement[op.id])
    if not groups:
        raise PlanError("no op of the plan maps to the captured model", field="placement",
                        fix="plan on a graph traced from this model")
    return groups

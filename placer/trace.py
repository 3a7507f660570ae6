"""Turn a PyTorch model and example inputs into a :class:`placer.Graph`.

The model is captured with ``torch.fx`` symbolic tracing, or with
``torch.export`` when fx cannot follow it (e.g. a branch on ``x.shape``). The
captured graph is then executed node by node inside one ``FlopCounterMode``:
each node's forward FLOPs are the counter's growth while it runs, and its
backward FLOPs are measured by back-propagating through that node alone, from
detached inputs that require gradients exactly where the whole model's would.
The per-op sums therefore equal the counter on the whole model, forward and
backward. Execution uses meta tensors when it can (no weight is allocated, so
a model built under ``torch.device("meta")`` traces), and real tensors when a
node needs data (``if x.sum() > 0``).

>>> import torch, placer
>>> model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
>>> graph = placer.trace(model, torch.randn(2, 8))
>>> graph.ids
['input', '0', '1', '2']
>>> graph.op("0").flops, graph.op("0").bwd_flops, graph.op("0").param_bytes
(512.0, 512.0, 576.0)
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import operator
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ._flops import FusedAttentionOnMeta, flop_counter
from .errors import TraceError
from .graph import Edge, Graph, Op

__all__ = ["trace"]

_GRANULARITIES = ("op", "module")
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)
_PROGRESS_NODES = 500


# --------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------
def trace(model: torch.nn.Module, example_inputs: Any, *, granularity: str = "op",
          name: str | None = None, training: bool = True,
          leaf_modules: Iterable[type | str] | None = None,
          device: str | torch.device = "auto") -> Graph:
    """Trace ``model`` on ``example_inputs`` into a :class:`placer.Graph`.

    Parameters
    ----------
    model:
        a ``torch.nn.Module``; it is not modified (its weights may be on the
        meta device).
    example_inputs:
        one tensor, a tuple/list of positional inputs, or a dict of keyword
        inputs. Their shapes fix the batch the costs are for.
    granularity:
        ``"op"``: one op per fx node, ``torch.nn`` layers (Linear, Conv2d,
        LayerNorm...) kept whole; ``"module"``: one op per block, i.e. each
        child of the model, looking through ``Sequential``/``ModuleList``/
        ``ModuleDict`` and through modules that hold such a stack, so a
        transformer gives one op per layer. Blocks are run, not traced, so
        data-dependent control flow inside them is fine.
    name:
        graph name (default: the model's class name).
    training:
        measure the backward pass too; ``False`` gives an inference graph
        (``bwd_flops`` 0, ``training: false``).
    leaf_modules:
        module classes, class names or qualified names to keep whole. With
        ``granularity="module"`` they replace the automatic choice of blocks.
    device:
        ``"auto"`` (meta tensors first, real ones if a node needs data),
        ``"meta"``, or a device to really run on, such as ``"cpu"``.

    Each op carries ``flops`` and ``bwd_flops`` (measured, FLOP),
    ``param_bytes`` (each parameter counted once, on its first user; users of
    one shared weight get one ``colocate`` group) and ``output_bytes``. Extra
    keys: ``fx`` (the node name in the captured graph), ``module`` (qualified
    path of the module it belongs to), ``shape``, ``dtype``, and when they
    apply ``buffer_bytes`` (buffers read; replicable, so counted on every
    user), ``view`` (output aliases an input), ``bwd_estimated`` (autograd
    could not run; 2x forward assumed) and ``scalar_deps`` (ops whose sizes or
    Python scalars this op reads; no edge, as they are fixed for the traced
    shapes). Edges carry the bytes of the tensors that flow.

    Raises :class:`placer.errors.TraceError` when the inputs are unusable or
    neither tracer captures the model.

    >>> import torch, placer
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
    ...                           torch.nn.Linear(32, 4))
    >>> g = placer.trace(mlp, torch.randn(8, 16))
    >>> g.topological_order(), g.total_param_bytes() == 4 * (16 * 32 + 32 + 32 * 4 + 4)
    (['input', '0', '1', '2'], True)
    >>> g.op("0").flops == 2 * 8 * 16 * 32     # 2 x batch x in x out
    True
    >>> g.op("2").bwd_flops == 2 * g.op("2").flops   # input and weight gradients
    True
    """
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"expected a torch.nn.Module, got {type(model).__name__}",
                         fix="pass the model object itself")
    if granularity not in _GRANULARITIES:
        raise TraceError(f"unknown granularity {granularity!r}",
                         fix='use granularity="op" or granularity="module"')
    args, kwargs = _normalize_inputs(model, example_inputs)
    model_name = type(model).__name__
    leaves = _leaf_predicate(model, granularity, leaf_modules)
    mode = _execution_mode(model, args, kwargs, device)

    failures: list[str] = []
    captured_once = False
    for capture in _captures(model, args, kwargs, leaves, granularity):
        try:
            captured = capture()
        except _CaptureFailed as exc:
            failures.append(exc.reason)
            continue
        try:
            run = _execute(model, captured, args, kwargs, mode, training)
        except _ExecutionFailed as exc:
            failures.append(exc.reason)
            captured_once = True
            continue
        return _build_graph(model, captured, run, name or model_name, training, granularity)
    if captured_once and not failures[0].startswith("torch.fx"):
        hint = "check that example_inputs have the shapes and dtypes forward expects"
    elif granularity == "op":
        hint = 'pass granularity="module" to run whole blocks without tracing inside them'
    else:
        hint = "pass leaf_modules=[...] naming the module with data-dependent control flow"
    raise TraceError(f"cannot trace {model_name}: " + "; ".join(failures), fix=hint)


# --------------------------------------------------------------------------
# inputs and options
# --------------------------------------------------------------------------
def _normalize_inputs(model: torch.nn.Module, example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    elif isinstance(example_inputs, dict):
        args, kwargs = (), dict(example_inputs)
    else:
        raise TraceError(
            f"example_inputs for {type(model).__name__} must be a tensor, a tuple of "
            f"inputs or a dict of keyword inputs, got {type(example_inputs).__name__}",
            fix="e.g. placer.trace(model, torch.randn(8, 3, 224, 224))")
    if not any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs))):
        raise TraceError(f"example_inputs for {type(model).__name__} hold no tensor",
                         fix="pass at least one example tensor")
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as exc:
        raise TraceError(f"example_inputs do not fit {type(model).__name__}.forward: {exc}",
                         fix="pass one value per forward argument") from None
    return args, kwargs


def _is_builtin_leaf(module: torch.nn.Module) -> bool:
    """fx's own rule: torch.nn layers are leaves, containers are not."""
    cls = type(module)
    return ((cls.__module__.startswith("torch.nn") or cls.__module__.startswith("torch.ao.nn"))
            and not isinstance(module, torch.nn.Sequential))


def _matches(module: torch.nn.Module, qualname: str, wanted: Sequence[type | str]) -> bool:
    for item in wanted:
        if isinstance(item, type):
            if isinstance(module, item):
                return True
        elif item == qualname or item == type(module).__name__:
            return True
    return False


def _is_custom(module: torch.nn.Module) -> bool:
    return not type(module).__module__.startswith(("torch.nn", "torch.ao.nn"))


def _is_stack(module: torch.nn.Module) -> bool:
    """A container of repeated blocks of the user's own classes (GPT's ``h``)."""
    if not isinstance(module, _CONTAINERS):
        return False
    kinds = [type(m) for m in module.children() if _is_custom(m)]
    return len(kinds) >= 2 and len(set(kinds)) < len(kinds)


def _descend(module: torch.nn.Module, deep: bool) -> bool:
    if isinstance(module, _CONTAINERS) and not _is_custom(module):
        # A Sequential of torch.nn layers (an MLP, conv-bn-relu) stays one block.
        return any(_is_custom(m) or isinstance(m, _CONTAINERS) for m in module.children())
    # The user's own module: a block, unless it holds the stack of blocks.
    return deep and (_is_stack(module) or any(_is_stack(m) for m in module.children()))


def _auto_blocks(model: torch.nn.Module, deep: bool) -> set[str]:
    """Qualified names of the blocks of ``model`` (see ``granularity``)."""
    blocks: set[str] = set()

    def visit(module: torch.nn.Module, prefix: str) -> None:
        for child_name, child in module.named_children():
            qualname = prefix + child_name
            if _descend(child, deep):
                visit(child, qualname + ".")
            else:
                blocks.add(qualname)

    visit(model, "")
    return blocks


def _leaf_predicate(model, granularity, leaf_modules):
    """A list of (label, is_leaf(module, qualname)) to try in order."""
    wanted = list(leaf_modules or [])
    for item in wanted:
        if not isinstance(item, (str, type)):
            raise TraceError(f"leaf_modules holds {item!r}",
                             fix="give module classes, class names or qualified names")
    if granularity == "op" or wanted:
        def is_leaf(module, qualname):
            return _is_builtin_leaf(module) or _matches(module, qualname, wanted)
        return [is_leaf]
    predicates = []
    seen = []
    for deep in (True, False):
        blocks = _auto_blocks(model, deep)
        if blocks in seen:
            continue
        seen.append(blocks)
        predicates.append(lambda module, qualname, blocks=blocks:
                          qualname in blocks or _is_builtin_leaf(module))
    return predicates


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


@dataclass
class _Mode:
    kind: str                      # "meta" or "real"
    device: torch.device | None    # where "real" runs
    fallback: torch.device | None  # "auto": real device to retry on


def _execution_mode(model, args, kwargs, device) -> _Mode:
    state = list(model.parameters()) + list(model.buffers())
    on_meta = any(t.is_meta for t in state + _tensors((args, kwargs)))
    if isinstance(device, str) and device == "auto":
        if on_meta:
            return _Mode("meta", None, None)
        real = state[0].device if state else None
        if real is None:
            inputs = _tensors((args, kwargs))
            real = inputs[0].device if inputs else torch.device("cpu")
        return _Mode("meta", None, real)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise TraceError(f"unknown device {device!r}",
                         fix='use "auto", "meta" or a torch device such as "cpu"') from None
    if device.type == "meta":
        return _Mode("meta", None, None)
    if on_meta:
        raise TraceError(f"{type(model).__name__} has weights on the meta device and cannot "
                         f"run on {device}", fix='use device="auto" or "meta"')
    return _Mode("real", device, None)


# --------------------------------------------------------------------------
# capture: torch.fx, then torch.export
# --------------------------------------------------------------------------
class _CaptureFailed(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _ExecutionFailed(_CaptureFailed):
    pass


@dataclass
class _Captured:
    gm: torch.fx.GraphModule
    tracer: str                         # "fx" or "export"
    inputs: list                        # one value per placeholder
    input_names: dict = field(default_factory=dict)  # placeholder -> user's name


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


class _LeafTracer(torch.fx.Tracer):
    """An fx tracer with a leaf rule that remembers where tracing failed."""

    def __init__(self, is_leaf):
        super().__init__()
        self._is_leaf = is_leaf
        self.stack: list[tuple[str, str]] = []
        self.failed_in: tuple[str, str] | None = None

    def is_leaf_module(self, module, qualname):
        return self._is_leaf(module, qualname)

    def call_module(self, module, forward, args, kwargs):
        qualname = self.path_of_module(module)
        self.stack.append((qualname, type(module).__name__))
        try:
            return super().call_module(module, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                self.failed_in = self.stack[-1]
            raise
        finally:
            self.stack.pop()


def _bind(model, args, kwargs):
    signature = inspect.signature(model.forward)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return signature, bound


def _captures(model, args, kwargs, leaf_predicates, granularity):
    for is_leaf in leaf_predicates:
        yield lambda is_leaf=is_leaf: _capture_fx(model, args, kwargs, is_leaf)
    if granularity == "op":
        yield lambda: _capture_export(model, args, kwargs)


def _capture_fx(model, args, kwargs, is_leaf) -> _Captured:
    signature, bound = _bind(model, args, kwargs)
    concrete = {}
    values = []
    for pname, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise _CaptureFailed(f"torch.fx: {type(model).__name__}.forward takes "
                                 f"*{pname}, which fx cannot trace")
        value = bound.arguments[pname]
        if not _tensors(value):
            # Fixed for this trace: lets `if mask is not None` and `range(n)` trace.
            concrete[pname] = value
        values.append(value)
    tracer = _LeafTracer(is_leaf)
    try:
        graph = tracer.trace(model, concrete_args=concrete or None)
    except Exception as exc:  # fx raises many kinds; all mean "cannot capture"
        where = tracer.failed_in
        place = (f" in {where[1]} ({where[0] or 'the model'})" if where
                 else f" in {type(model).__name__}")
        raise _CaptureFailed(f"torch.fx failed{place}: {_first_line(exc)}") from None
    gm = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(values):
        raise _CaptureFailed("torch.fx: placeholders do not match forward's arguments")
    names = {node.name: pname for node, pname in zip(placeholders, signature.parameters)}
    return _Captured(gm, "fx", values, names)


@contextlib.contextmanager
def _quiet_torch_logs():
    """Silence torch's loggers and stderr: a failed export prints whole graphs."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name == "torch" or name.startswith("torch.")]
    saved = [(log, log.level, log.disabled) for log in loggers]
    for log in loggers:
        log.disabled = True
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for log, level, disabled in saved:
            log.setLevel(level)
            log.disabled = disabled


def _capture_export(model, args, kwargs) -> _Captured:
    state = list(model.parameters()) + list(model.buffers())
    if any(t.is_meta for t in state):
        args, kwargs = pytree.tree_map_only(
            torch.Tensor, lambda t: torch.empty_like(t, device="meta"), (args, kwargs))
    try:
        with _quiet_torch_logs():
            exported = torch.export.export(model, tuple(args), dict(kwargs))
            gm = exported.module()
    except Exception as exc:
        raise _CaptureFailed(f"torch.export failed: {_first_line(exc)}") from None
    flat = torch.fx._pytree.tree_flatten_spec((tuple(args), dict(kwargs)),
                                              exported.call_spec.in_spec)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(flat):
        raise _CaptureFailed("torch.export: placeholders do not match the inputs")
    return _Captured(gm, "export", list(flat), {})


# --------------------------------------------------------------------------
# execution: per-node forward and backward FLOPs
# --------------------------------------------------------------------------
@dataclass
class _NodeRun:
    flops: int = 0
    bwd_flops: int = 0
    shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    bytes: int = 0
    has_tensor: bool = False
    is_container: bool = False
    view: bool = False
    bwd_estimated: bool = False


@dataclass
class _Run:
    nodes: dict
    execution: str


def _summary(value: Any) -> _NodeRun:
    tensors = _tensors(value)
    return _NodeRun(
        shapes=[list(t.shape) for t in tensors],
        dtypes=[str(t.dtype).replace("torch.", "") for t in tensors],
        bytes=sum(t.numel() * t.element_size() for t in tensors),
        has_tensor=bool(tensors),
        is_container=not isinstance(value, torch.Tensor))


def _live_nodes(graph: torch.fx.Graph) -> set:
    """Nodes whose values reach the output (only they get a backward)."""
    live = set()
    stack = [n for n in graph.nodes if n.op == "output"]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        stack.extend(node.all_input_nodes)
    return live


def _wanted_outputs(node: torch.fx.Node, live: set, count: int) -> set[int] | None:
    """Indices of a tuple output the rest of the model uses (None: all)."""
    users = list(node.users)
    if not users or not all(u.op == "call_function" and u.target is operator.getitem
                            and isinstance(u.args[1], int) for u in users):
        return None
    return {u.args[1] % max(count, 1) for u in users if u in live}


class _Measurer(torch.fx.Interpreter):
    """Runs a graph node by node and measures each node's FLOPs."""

    def __init__(self, gm, counter, training, state_ids, progress):
        super().__init__(gm, garbage_collect_values=True)
        self.counter = counter
        self.training = training
        self.state_ids = state_ids          # ids of the parameters and buffers in use
        self.live = _live_nodes(gm.graph)
        self.records: dict[str, _NodeRun] = {}
        self.progress = progress
        self.failed_node: torch.fx.Node | None = None

    def run_node(self, node):
        if self.progress is not None:
            self.progress.update(1)
        if node.op in ("placeholder", "get_attr", "output"):
            value = super().run_node(node)
            if node.op == "placeholder":
                self.records[node.name] = _summary(value)
            return value
        try:
            return self._measure(node)
        except Exception:
            if self.failed_node is None:
                self.failed_node = node
            raise

    def _measure(self, node):
        with self._set_current_node(node):
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            grad_leaves: list[torch.Tensor] = []

            def prepare(value):
                if (self.training and isinstance(value, torch.Tensor) and value.requires_grad
                        and id(value) not in self.state_ids):
                    leaf = value.detach().requires_grad_(True)
                    grad_leaves.append(leaf)
                    # A clone, so in-place ops (ReLU(inplace=True)) may modify it.
                    return leaf.clone()
                if isinstance(value, torch.Tensor) and id(value) in self.state_ids \
                        and value.requires_grad and self.training:
                    grad_leaves.append(value)
                return value

            args = pytree.tree_map(prepare, args)
            kwargs = pytree.tree_map(prepare, kwargs)
            if node.op == "call_module" and self.training:
                module = self.fetch_attr(node.target)
                grad_leaves.extend(p for p in module.parameters() if p.requires_grad)
            before = self.counter.get_total_flops()
            with torch.set_grad_enabled(self.training):
                value = getattr(self, node.op)(node.target, args, kwargs)
            middle = self.counter.get_total_flops()
            record = _summary(value)
            record.flops = middle - before
            if self.training and node in self.live:
                record.bwd_flops, record.bwd_estimated = self._backward(
                    node, value, grad_leaves, record.flops)
            inputs = _tensors((args, kwargs))
            record.view = any(isinstance(value, torch.Tensor) and value._is_view()
                              and value._base is t for t in inputs) if inputs else False
            self.records[node.name] = record
            return pytree.tree_map_only(torch.Tensor, _detach_keep_flag, value)

    def _backward(self, node, value, grad_leaves, forward):
        leaves = _tensors(value)
        wanted = _wanted_outputs(node, self.live, len(leaves)) \
            if not isinstance(value, torch.Tensor) else None
        outputs = [t for i, t in enumerate(leaves)
                   if t.requires_grad and (wanted is None or i in wanted)]
        unique, seen = [], set()
        for leaf in grad_leaves:
            if id(leaf) not in seen:
                seen.add(id(leaf))
                unique.append(leaf)
        if not outputs or not unique:
            return 0, False
        before = self.counter.get_total_flops()
        try:
            torch.autograd.grad(outputs, unique,
                                grad_outputs=[torch.ones_like(t) for t in outputs],
                                allow_unused=True)
        except RuntimeError:
            return 2 * forward, True
        return self.counter.get_total_flops() - before, False


def _detach_keep_flag(t: torch.Tensor) -> torch.Tensor:
    flag = t.requires_grad
    out = t.detach()
    if flag:
        out.requires_grad_(True)
    return out


class _Runner(torch.nn.Module):
    """Holds the graph module so ``functional_call`` can swap its state."""

    def __init__(self, gm):
        super().__init__()
        self.gm = gm
        self.measurer: _Measurer | None = None

    def forward(self, *inputs):
        return self.measurer.run(*inputs, enable_io_processing=False)


def _execute(model, captured: _Captured, args, kwargs, mode: _Mode, training: bool) -> _Run:
    attempts = [("meta", None)] if mode.kind == "meta" else [("real", mode.device)]
    if mode.kind == "meta" and mode.fallback is not None:
        attempts.append(("real", mode.fallback))
    reason = ""
    for kind, device in attempts:
        try:
            return _execute_once(captured, kind, device, training)
        except _ExecutionFailed as exc:
            reason = exc.reason
    if mode.kind == "meta" and mode.fallback is None:
        state = list(model.parameters()) + list(model.buffers())
        if any(t.is_meta for t in state):
            reason += (" (the weights are on the meta device, so nothing can run on real "
                       "data; build the model with real weights to trace this)")
    raise _ExecutionFailed(reason)


def _execute_once(captured: _Captured, kind: str, device, training: bool) -> _Run:
    gm = captured.gm
    params = dict(gm.named_parameters())
    buffers = dict(gm.named_buffers())

    if kind == "meta":
        def move(t):
            return torch.empty_like(t, device="meta")
    else:
        def move(t):
            return t if t.device == device else t.to(device)

    state = {}
    for key, p in params.items():
        if kind == "real" and p.device == device:
            state[key] = p
        else:
            state[key] = move(p.detach()).requires_grad_(p.requires_grad)
    for key, b in buffers.items():
        # Copies even for real runs: BatchNorm must not update the user's statistics.
        state[key] = move(b).clone() if kind == "real" else move(b)
    inputs = pytree.tree_map_only(torch.Tensor, lambda t: move(t.detach()).requires_grad_(
        t.requires_grad) if t.requires_grad else move(t.detach()), list(captured.inputs))
    runner = _Runner(gm)
    state_ids = {id(t) for t in state.values()}
    total = len(gm.graph.nodes)
    progress = None
    if total > _PROGRESS_NODES and sys.stderr.isatty():
        from tqdm.auto import tqdm
        progress = tqdm(total=total, desc=f"tracing ({kind})", unit="node", leave=False)
    counter = flop_counter()
    try:
        attention = FusedAttentionOnMeta() if kind == "meta" else contextlib.nullcontext()
        with attention, counter:
            runner.measurer = _Measurer(gm, counter, training, state_ids, progress)
            torch.func.functional_call(runner, {f"gm.{k}": v for k, v in state.items()},
                                       tuple(inputs), strict=False, tie_weights=True)
    except Exception as exc:
        node = runner.measurer.failed_node if runner.measurer is not None else None
        where = ""
        if node is not None:
            module = _module_of(node)
            where = f" at {node.name}" + (f" in {module}" if module else "")
        raise _ExecutionFailed(f"running the {captured.tracer} graph on {kind} tensors "
                               f"failed{where}: {_first_line(_root_cause(exc))}") from None
    finally:
        if progress is not None:
            progress.close()
    return _Run(runner.measurer.records, "meta" if kind == "meta" else str(device))


def _root_cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


# --------------------------------------------------------------------------
# graph building
# --------------------------------------------------------------------------
def _op_kind(node: torch.fx.Node, gm: torch.fx.GraphModule) -> str:
    if node.op == "placeholder":
        return "input"
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__.lower()
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target)).strip("_") or "call"


def _module_of(node: torch.fx.Node) -> str | None:
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return path or None
    return None


class _UnionFind:
    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def _build_graph(model, captured: _Captured, run: _Run, name: str, training: bool,
                 granularity: str) -> Graph:
    gm = captured.gm
    records = run.nodes
    # Names come from the user's model so tied weights get their first name.
    param_names: dict[int, str] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        param_names.setdefault(id(p), pname)
    for pname, p in gm.named_parameters(remove_duplicate=False):
        param_names.setdefault(id(p), pname)
    param_ids = set(param_names)

    ids: dict[torch.fx.Node, str] = {}
    position: dict[str, int] = {}
    used_ids: set[str] = set()
    carries: dict[torch.fx.Node, dict[str, int]] = {}   # op id -> bytes a value brings
    scalars: dict[torch.fx.Node, set[str]] = {}         # ops a non-tensor value came from
    attrs: dict[torch.fx.Node, Any] = {}                 # get_attr node -> tensor
    ops: list[Op] = []
    edges: list[Edge] = []
    param_users: dict[int, list[str]] = {}
    param_objects: dict[int, torch.Tensor] = {}

    def unique_id(base: str) -> str:
        candidate, k = base, 0
        while candidate in used_ids:
            k += 1
            candidate = f"{base}:{k}"
        used_ids.add(candidate)
        return candidate

    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        if node.op == "get_attr":
            try:
                attrs[node] = _fetch(gm, node.target)
            except AttributeError:
                attrs[node] = None
            carries[node], scalars[node] = {}, set()
            continue
        record = records.get(node.name)
        inputs = node.all_input_nodes
        if record is None or not record.has_tensor:
            # Sizes, flags, guards: folded into their consumers.
            carries[node] = {}
            scalars[node] = set().union(*(set(carries.get(i, {})) | scalars.get(i, set())
                                          for i in inputs)) if inputs else set()
            continue
        source = inputs[0] if inputs else None
        if (node.op == "call_function" and node.target is operator.getitem and source is not None
                and source.name in records and records[source.name].is_container
                and source in ids):
            # Picking one tensor out of an op's tuple: the tensor comes from that op.
            carries[node] = {ids[source]: record.bytes}
            scalars[node] = set(scalars.get(source, set()))
            continue
        if (node.op == "call_function" and node.target is operator.getitem and source is not None
                and records.get(source.name) is not None and records[source.name].is_container
                and source not in ids):
            carries[node] = dict(carries.get(source, {}))
            scalars[node] = set(scalars.get(source, set()))
            continue

        op_id = unique_id(node.name if node.op == "placeholder" and captured.tracer == "export"
                          else captured.input_names.get(node.name, node.name)
                          if node.op == "placeholder"
                          else str(node.target) if node.op == "call_module" else node.name)
        ids[node] = op_id
        position[op_id] = len(position)
        incoming: dict[str, int] = {}
        scalar_deps: set[str] = set()
        used_state: list[torch.Tensor] = []
        for inp in inputs:
            if inp in attrs:
                if isinstance(attrs[inp], torch.Tensor):
                    used_state.append(attrs[inp])
                continue
            for src, nbytes in carries.get(inp, {}).items():
                incoming[src] = incoming.get(src, 0) + nbytes
            scalar_deps |= scalars.get(inp, set())
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            used_state.extend(module.parameters())
            used_state.extend(module.buffers())
        param_bytes, buffer_bytes = _state_bytes(used_state, op_id, param_ids, param_users,
                                                 param_objects)
        scalar_deps -= set(incoming) | {op_id}
        extra = _op_extra(node, record, buffer_bytes,
                          sorted(scalar_deps, key=position.__getitem__))
        ops.append(Op(op_id, _op_kind(node, gm), flops=float(record.flops),
                      bwd_flops=float(record.bwd_flops) if training else 0.0,
                      param_bytes=float(param_bytes), output_bytes=float(record.bytes),
                      extra=extra))
        for src, nbytes in incoming.items():
            if src != op_id:
                edges.append(Edge(src, op_id, float(nbytes)))
        carries[node] = {op_id: record.bytes}
        scalars[node] = set()

    _colocate(ops, param_users, param_names)
    meta = _graph_meta(model, captured, run, granularity, ids, carries)
    return Graph(name, ops, edges, training=training, meta=meta)


def _state_bytes(used_state: list, op_id: str, param_ids: set, param_users: dict,
                 param_objects: dict) -> tuple[int, int]:
    """Bytes of the parameters ``op_id`` is the first to use (a shared one
    counts once) and of the buffers it uses; records ``op_id`` as a user of
    each parameter."""
    param_bytes = buffer_bytes = 0
    seen_state: set[int] = set()
    for t in used_state:
        if id(t) in seen_state:
            continue
        seen_state.add(id(t))
        if id(t) in param_ids:
            users = param_users.setdefault(id(t), [])
            param_objects[id(t)] = t
            if not users:
                param_bytes += t.numel() * t.element_size()
            users.append(op_id)
        else:
            buffer_bytes += t.numel() * t.element_size()
    return param_bytes, buffer_bytes


def _op_extra(node, record, buffer_bytes: int, scalar_deps: list) -> dict[str, Any]:
    """An op's ``extra``: its fx node and module, output shape and dtype, and
    what only some ops have (buffers, a view, an estimated backward, the
    ops its non-tensor inputs came from)."""
    extra: dict[str, Any] = {"fx": node.name, "module": _module_of(node),
                             "shape": record.shapes[0] if len(record.shapes) == 1
                             else record.shapes,
                             "dtype": record.dtypes[0] if len(set(record.dtypes)) == 1
                             else record.dtypes}
    if buffer_bytes:
        extra["buffer_bytes"] = float(buffer_bytes)
    if record.view:
        extra["view"] = True
    if record.bwd_estimated:
        extra["bwd_estimated"] = True
    if scalar_deps:
        extra["scalar_deps"] = scalar_deps
    return extra


def _graph_meta(model, captured: _Captured, run: _Run, granularity: str, ids: dict,
                carries: dict) -> dict:
    """The graph's ``meta``: how it was traced, its batched inputs' shapes and
    the ops whose values the model returns."""
    gm, records = captured.gm, run.nodes
    outputs = []
    for node in gm.graph.nodes:
        if node.op == "output":
            for inp in node.all_input_nodes:
                for src in carries.get(inp, {}):
                    if src not in outputs:
                        outputs.append(src)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {"tracer": captured.tracer, "granularity": granularity,
            "execution": run.execution, "model": type(model).__name__,
            "batch_inputs": {ids[n]: records[n.name].shapes[0]
                             if len(records[n.name].shapes) == 1 else records[n.name].shapes
                             for n in placeholders if n in ids},
            "outputs": outputs}


def _fetch(gm: torch.nn.Module, target: str):
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _colocate(ops: list[Op], param_users: dict[int, list[str]], names: dict[int, str]) -> None:
    """One colocate group per set of ops that share a weight."""
    groups = _UnionFind()
    shared_names: dict[str, list[str]] = {}
    for pid, users in param_users.items():
        distinct = list(dict.fromkeys(users))
        if len(distinct) < 2:
            continue
        for other in distinct[1:]:
            groups.union(distinct[0], other)
        shared_names.setdefault(distinct[0], []).append(names[pid])
    if not shared_names:
        return
    labels: dict[str, list[str]] = {}
    for first, pnames in shared_names.items():
        labels.setdefault(groups.find(first), []).extend(pnames)
    order = {op.id: i for i, op in enumerate(ops)}
    label_of = {root: "shared:" + sorted(pnames)[0] for root, pnames in labels.items()}
    for op in sorted(ops, key=lambda o: order[o.id]):
        if op.id in groups.parent:
            root = groups.find(op.id)
            if root in label_of:
                op.colocate = label_of[root]


class _CallableModule(types.ModuleType):
    """``import placer.trace`` binds the module to ``placer.trace``; calling it
    must still trace."""

    def __call__(self, *args, **kwargs) -> Graph:
        return trace(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

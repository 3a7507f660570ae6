"""What every runtime shares (one process or ranks, either engine): a plan's
model traced, captured and split (:func:`prepare`), the default loss and
device map, the optimizer's copy, joined outputs, the prediction a run is
compared with, and the result types (:class:`MeasuredReport`,
:class:`RunResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..cost.report import Report
from ..errors import PlanError
from .engine import microbatch_rows
from .scaling import with_fixed_bytes
from .split import capture, first_batch, node_groups, probe_rows, split

LOSS_REDUCTIONS = ("mean", "sum")


@dataclass
class MeasuredReport(Report):
    """A :class:`placer.cost.Report` of what a run measured: ``step_time``
    (median over the steps after warm-up), ``busy``/``compute``/``comm`` per
    device and ``peak_memory`` (CUDA: the allocator's peak; CPU: parameters,
    gradients, optimizer state and the activations autograd saved, at their
    peak). ``predicted`` is the cost model's step time for the same plan
    (None without a cluster) and ``prediction`` its whole report."""

    predicted: float | None = None
    prediction: Report | None = field(default=None, repr=False)
    step_times: list = field(default_factory=list)

    def error(self) -> float | None:
        """Relative error of the prediction, ``(predicted - measured) / measured``."""
        if self.predicted is None or not self.step_time:
            return None
        return (self.predicted - self.step_time) / self.step_time


@dataclass
class RunResult:
    """What :func:`run` returns.

    ``outputs``: the model's outputs of the last step (microbatches joined),
    on CPU; ``loss``: the last step's loss (float, None for inference);
    ``losses``: every step's loss; ``gradients``: parameter name -> gradient
    of the last step after the all-reduce (before the optimizer stepped);
    ``parameters``: name -> value after the last step; ``report``: the
    :class:`MeasuredReport`; ``schedule``: the schedule actually run;
    ``notes``: what the runtime changed to stay correct (e.g. a piece that
    mixes the batch runs unsharded)."""

    outputs: Any
    loss: float | None
    losses: list
    gradients: dict
    parameters: dict
    report: MeasuredReport
    schedule: str
    notes: list = field(default_factory=list)


def default_device_map(names, cluster=None) -> dict[str, torch.device]:
    """Plan device name -> torch device: names that are usable torch devices
    map to themselves (``"cpu"``, ``"cuda:1"``), devices named as GPUs
    (:func:`placer.runtime.devices.gpu_named`) to this host's CUDA devices
    in turn when it has any, everything else to the CPU."""
    from .devices import gpu_named, torch_device
    out, k = {}, 0
    for name in names:
        out[name] = torch_device(name, k, cluster)
        k += gpu_named(name, cluster)
    return out


def cpu_fallback(dmap: dict, cluster=None) -> list[str]:
    """The plan devices named as GPUs that ``dmap`` runs on the CPU."""
    from .devices import gpu_named
    return [d for d, t in dmap.items() if t.type == "cpu" and gpu_named(d, cluster)]




def default_loss(outputs) -> torch.Tensor:
    """The loss used when none is given: the sum of the means of the
    model's floating-point outputs (so every output gets a gradient)."""
    leaves = [t for t in pytree.tree_leaves(outputs)
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise PlanError("the model has no floating-point output to train on",
                        fix="pass loss_fn=... or training=False")
    return sum(t.float().mean() for t in leaves)


def resolve_graph(model, example_inputs, plan, graph=None, granularity=None,
                  leaf_modules=None):
    """The op-level graph the plan's ops map to, and the plan over its ops.

    A plan over a coarsened graph (ops with ``members``) is expanded over the
    graph traced again at the coarsened graph's granularity."""
    from ..trace import trace
    if graph is not None and any("members" in op.extra for op in graph):
        plan = plan.expand(graph)
        granularity = granularity or graph.meta.get("granularity", "op")
        graph = None
    if graph is not None:
        return graph, plan
    tried = [granularity] if granularity else ["op", "module"]
    for g in tried:
        candidate = trace(model, example_inputs, granularity=g, leaf_modules=leaf_modules)
        if set(plan.placement) >= set(candidate.ids):
            return candidate, plan
    raise PlanError("the plan does not place the ops of this model's graph",
                    field="placement", fix="pass graph= (the graph the plan was made for)")


def build_optimizer(optimizer, params: list):
    """``optimizer``: None, a callable ``params -> Optimizer`` (e.g.
    ``functools.partial(torch.optim.SGD, lr=0.1)``) or an optimizer built on
    the original model, whose class and settings are reused."""
    if optimizer is None or not params:
        return None
    if isinstance(optimizer, torch.optim.Optimizer):
        return type(optimizer)(params, **optimizer.defaults)
    if callable(optimizer):
        return optimizer(params)
    raise PlanError(f"optimizer must be a callable or a torch optimizer, got "
                    f"{type(optimizer).__name__}",
                    fix="e.g. optimizer=functools.partial(torch.optim.SGD, lr=0.1)")


def prepare(model, plan, example_inputs, *, graph=None, granularity=None, leaf_modules=None,
            training=True):
    """Trace/capture/split: everything :func:`run` and the ranks share.
    Returns ``(graph, plan, split, inputs, mb_rows)``."""
    graph, plan = resolve_graph(model, example_inputs, plan, graph, granularity, leaf_modules)
    names = {op.extra.get("fx") for op in graph if op.extra.get("fx")}
    gran = graph.meta.get("granularity", granularity or "op")
    if graph.meta.get("tracer", "fx") != "fx":
        raise PlanError("the runtime needs a torch.fx capture; this graph came from "
                        f"{graph.meta.get('tracer')}", fix="make the model fx-traceable")
    gm, inputs = capture(model, example_inputs, gran, leaf_modules, names)
    groups = node_groups(graph, plan, gm)
    batch = first_batch(inputs)
    # tensors that keep their size in a microbatch, for the prediction
    graph = with_fixed_bytes(graph, gm, inputs, batch)
    mb_rows = microbatch_rows(batch, max(1, int(plan.microbatches)))
    widest = max(len(g) for g in groups.values())
    if (len(mb_rows) > 1 or widest > 1) and batch > 1:
        small = probe_rows(batch)
    else:
        small = batch
    sp = split(model, gm, inputs, groups, batch=batch, small=small)
    return graph, plan, sp, inputs, mb_rows


def sink_device(sp) -> str:
    pieces = [s.index for s in sp.output_sources if s.kind == "piece"]
    if pieces:
        return sp.pieces[max(pieces)].group[0]
    return sp.pieces[0].group[0]


def join_outputs(sp, per_mb: dict):
    """Join per-microbatch outputs: batched leaves along dim 0, others from
    the first microbatch."""
    ms = sorted(per_mb)
    flats = [pytree.tree_flatten(per_mb[m])[0] for m in ms]
    spec = pytree.tree_flatten(per_mb[ms[0]])[1]
    joined = []
    for i, src in enumerate(sp.output_sources):
        info = sp.values.get(src.key)
        first = flats[0][i]
        if isinstance(first, torch.Tensor) and info is not None and info.batched:
            joined.append(torch.cat([f[i].to("cpu") for f in flats], 0))
        elif isinstance(first, torch.Tensor) and src.kind == "input" and info is not None \
                and info.batched:
            joined.append(torch.cat([f[i].to("cpu") for f in flats], 0))
        else:
            joined.append(first.to("cpu") if isinstance(first, torch.Tensor) else first)
    return pytree.tree_unflatten(joined, spec)


def prediction_cluster(cluster, plan):
    """``cluster``, else this host's (:meth:`Cluster.local`) when it has the
    plan's devices, else None."""
    from ..cluster import Cluster
    if cluster is None:
        try:
            cluster = Cluster.local()
        except Exception:  # noqa: BLE001 - a prediction is optional
            return None
        if not plan.devices_used() <= set(cluster.names):
            return None
    return cluster


def predict(graph, cluster, plan, problem_options=None):
    """The simulator's report for ``plan`` as the runtime runs it
    (:func:`as_run`), or None when no cluster fits."""
    from ..cost import simulate
    cluster = prediction_cluster(cluster, plan)
    if cluster is None:
        return None
    return simulate(graph, cluster, as_run(graph, plan),
                    **{**RUNTIME_OPTIONS, **(problem_options or {})})


def as_run(graph, plan):
    """``plan`` as the runtime runs it: an op on more devices than the
    smallest microbatch of ``graph``'s batch has rows runs unsharded on the
    first of them (:class:`placer.runtime.engine.Routes` says so in its
    notes), so the prediction charges that device all of it and no
    all-reduce. ``plan`` itself when nothing changes or the batch is
    unknown. (Eight random data-parallel plans of the fidelity bench at a
    row a microbatch were predicted at up to 1.8x their measured step.)"""
    from ..search.base import traced_batch
    batch = traced_batch(graph)
    if batch is None:
        return plan
    rows = batch // max(1, plan.microbatches)
    if all(len(devs) <= rows for devs in plan.placement.values()):
        return plan
    placement = {op: (list(devs[:1]) if len(devs) > rows else devs)
                 for op, devs in plan.placement.items()}
    return type(plan).from_dict({**plan.to_dict(), "placement": placement})


#: cost-model options that describe how this runtime runs a plan (see
#: :class:`placer.cost.Problem`): the engine all-reduces after the step's
#: last backward, so nothing overlaps it, and runs each piece whole once
#: all its inputs are there
RUNTIME_OPTIONS = {"allreduce_overlap": False, "granularity": "piece"}


def optimizer_state_bytes(engine, device: str, opt) -> float:
    """Bytes of ``opt``'s state (momenta and the like) for the weight copies
    ``engine`` holds on ``device``: part of its peak memory on a CPU."""
    if opt is None:
        return 0.0
    return float(sum(v.numel() * v.element_size()
                     for p in engine.copies.get(device, {}).values()
                     for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)))

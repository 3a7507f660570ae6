"""``placer.run``: execute a plan in this process and measure it."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..cost.report import Report, _Frozen
from ..errors import PlanError
from ..schedule import for_plan
from .engine import Engine, LocalTransport, Routes, microbatch_rows
from .split import capture, node_groups, split

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


def _as_device(name: str) -> torch.device | None:
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        return None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda" and torch.cuda.is_available():
        index = dev.index or 0
        if index < torch.cuda.device_count():
            return torch.device("cuda", index)
    return None


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


def first_batch(inputs: list) -> int:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    raise PlanError("no input has a batch dimension", fix="pass batched example inputs")


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
    mb_rows = microbatch_rows(batch, max(1, int(plan.microbatches)))
    widest = max(len(g) for g in groups.values())
    if (len(mb_rows) > 1 or widest > 1) and batch > 1:
        # any other size tells batched values apart; 2+ rows keep BatchNorm happy
        small = batch // 2 if batch >= 4 else batch - 1
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
    """The simulator's report for ``plan``, or None when no cluster fits."""
    from ..cost import simulate
    cluster = prediction_cluster(cluster, plan)
    if cluster is None:
        return None
    return simulate(graph, cluster, plan, **{**RUNTIME_OPTIONS, **(problem_options or {})})


#: cost-model options that describe how this runtime runs a plan (see
#: :class:`placer.cost.Problem`): the engine all-reduces after the step's
#: last backward, so nothing overlaps it, and runs each piece whole once
#: all its inputs are there
RUNTIME_OPTIONS = {"allreduce_overlap": False, "granularity": "piece"}


def _sync(devices) -> None:
    for d in set(devices):
        if d.type == "cuda":
            torch.cuda.synchronize(d)


class Runner:
    """A plan split, placed and ready to step in this process: what
    :func:`run` drives, exposed so a caller can interleave its steps with
    other work (the overhead benchmark alternates it with plain PyTorch).
    Arguments as for :func:`run`."""

    def __init__(self, model, plan, example_inputs, *, optimizer=None, loss_fn=None,
                 targets=None, graph=None, cluster=None, device_map=None, training=True,
                 loss_reduction="mean", granularity=None, leaf_modules=None, seed=0,
                 problem_options=None):
        if loss_reduction not in LOSS_REDUCTIONS:
            raise PlanError(f"unknown loss_reduction {loss_reduction!r}",
                            fix="use 'mean' or 'sum'")
        graph, plan, sp, inputs, mb_rows = prepare(
            model, plan, example_inputs, graph=graph, granularity=granularity,
            leaf_modules=leaf_modules, training=training)
        if cluster is not None:
            plan.validate(graph, cluster, check_fingerprints=False)
        routes = Routes(sp, mb_rows, sink_device(sp))
        # the order the prediction assumes (placer.schedule.for_plan)
        sched = for_plan(routes, plan, training, graph, prediction_cluster(cluster, plan),
                         {**RUNTIME_OPTIONS, **(problem_options or {})})
        order, used = sched.order, sched.name
        devices = routes.devices()
        dmap = default_device_map(devices, cluster)
        if device_map:
            dmap.update({k: torch.device(v) for k, v in device_map.items()})
        #: plan devices named as GPUs that run on the CPU here (said in one line)
        self.cpu_fallback = cpu_fallback(dmap, cluster)
        from .devices import warn_cpu_fallback
        warn_cpu_fallback(self.cpu_fallback)
        batch = sum(mb_rows)
        weights = [(n / batch if loss_reduction == "mean" else 1.0) for n in mb_rows]
        self.graph, self.plan, self.split, self.inputs = graph, plan, sp, inputs
        self.targets, self.training, self.mb_rows, self.schedule = targets, training, mb_rows, used
        self.plan_schedule = sched
        self.devices, self.dmap = devices, dmap
        self.offsets = [sum(mb_rows[:m]) for m in range(len(mb_rows))]
        self.transport = LocalTransport(dmap)
        self.engine = Engine(sp, routes, dmap, devices, self.transport, training=training,
                             loss_fn=loss_fn or default_loss, loss_weights=weights, order=order,
                             model=model, seed=seed, schedule=sched)
        self.engine.bucket_bytes = (plan.allreduce or {}).get("bucket_bytes")
        self.opt = build_optimizer(optimizer, self.engine.parameters()) if training else None
        self.params = self.engine.parameters()

    def step(self, keep_gradients: bool = False) -> tuple:
        """One timed step: ``(seconds, the engine's step result, gradients
        before the optimizer step or None)``."""
        for p in self.params:
            p.grad = None
        for d in set(self.dmap.values()):
            if d.type == "cuda":
                torch.cuda.reset_peak_memory_stats(d)
        self.transport.comm_time.clear()
        _sync(self.dmap.values())
        start = time.perf_counter()
        last, kept = self.engine.train_step(self.inputs, self.targets, self.offsets,
                                            training=self.training, optimizer=self.opt,
                                            keep_gradients=keep_gradients)
        _sync(self.dmap.values())
        return time.perf_counter() - start, last, kept


def run(model: torch.nn.Module, plan, example_inputs: Any, *, steps: int = 3,
        optimizer=None, loss_fn: Callable | None = None, targets: Any = None,
        graph=None, cluster=None, device_map: dict | None = None, warmup: int = 1,
        training: bool = True, loss_reduction: str = "mean", granularity: str | None = None,
        leaf_modules=None, problem_options: dict | None = None, seed: int = 0,
        engine: str = "builtin") -> RunResult:
    """Run ``steps`` training steps (or inference passes) of ``model`` the way
    ``plan`` says, in this process, and measure them.

    The model is split into per-device pieces (see :mod:`placer.runtime.split`),
    each piece's weights are copied to the device that runs it (the model
    itself is not modified; weights on the meta device are built there, as
    :func:`placer.zoo.materialize` with ``seed`` builds them), microbatches run under the plan's schedule,
    data-parallel replicas take equal shares of each microbatch's rows and
    their gradients are summed (see :mod:`placer.runtime.engine`).

    ``loss_fn(outputs)`` or ``loss_fn(outputs, targets)`` (``targets`` split
    along dim 0 like the inputs) gives each microbatch's loss; default
    :func:`default_loss`. ``loss_reduction="mean"`` weights a microbatch's
    loss by its share of the batch (right for losses that average over
    rows), ``"sum"`` adds them (losses that sum over rows). ``optimizer``:
    see :func:`build_optimizer`; without one the weights do not change.
    ``device_map`` maps plan device names to torch devices (default
    :func:`default_device_map`: devices named as GPUs on this host's GPUs,
    the rest, and every device of a host without one, on the CPU; a device
    named as a GPU that runs on the CPU is said in one line, listed in the
    report's ``cpu_fallback``, and its prediction is not compared). ``cluster``
    gives the prediction (default: :meth:`Cluster.local` when the plan's
    devices are in it). ``engine="pipelining"`` runs a stage-contiguous plan
    on torch.distributed.pipelining instead (:mod:`placer.runtime.pipelining`).

    A tiny GPT split over two CPU-backed devices in two microbatches gives
    the unplaced model's loss:

    >>> import torch, placer
    >>> model, inputs = placer.datasets.model("gpt-125m", batch=2, seq=8, tiny=True)
    >>> graph = placer.trace(model, inputs, granularity="module")
    >>> half = len(graph.ids) // 2
    >>> plan = placer.Plan({op: ["a" if i < half else "b"]
    ...                     for i, op in enumerate(graph.topological_order())}, microbatches=2)
    >>> result = placer.run(model, plan, inputs, steps=1, graph=graph)
    >>> reference = default_loss(model(*inputs))
    >>> torch.allclose(torch.as_tensor(result.loss), reference, atol=1e-5)
    True
    >>> sorted(result.report.busy), result.report.step_time > 0
    (['a', 'b'], True)
    """
    if steps < 1:
        raise PlanError(f"steps must be >= 1, got {steps}")
    if loss_reduction not in LOSS_REDUCTIONS:
        raise PlanError(f"unknown loss_reduction {loss_reduction!r}",
                        fix="use 'mean' or 'sum'")
    if engine != "builtin":
        from . import pipelining
        pipelining.check_engine(engine)
        return pipelining.run(model, plan, example_inputs, steps=steps, optimizer=optimizer,
                              loss_fn=loss_fn, targets=targets, graph=graph, cluster=cluster,
                              device_map=device_map, warmup=warmup, training=training,
                              loss_reduction=loss_reduction, granularity=granularity,
                              leaf_modules=leaf_modules, problem_options=problem_options,
                              seed=seed)
    torch.manual_seed(seed)
    runner = Runner(model, plan, example_inputs, optimizer=optimizer, loss_fn=loss_fn,
                    targets=targets, graph=graph, cluster=cluster, device_map=device_map,
                    training=training, loss_reduction=loss_reduction, granularity=granularity,
                    leaf_modules=leaf_modules, seed=seed, problem_options=problem_options)
    graph, plan, sp, engine = runner.graph, runner.plan, runner.split, runner.engine
    transport, dmap, devices, opt = runner.transport, runner.dmap, runner.devices, runner.opt
    mb_rows, used = runner.mb_rows, runner.schedule
    times, losses, last, grads, timeline = [], [], None, {}, []
    act_peak: dict[str, float] = {}
    compute: dict[str, float] = {}
    comm: dict[str, float] = {}
    for step in range(steps + warmup):
        elapsed, last, kept = runner.step(keep_gradients=step == steps + warmup - 1)
        grads = kept if kept is not None else grads
        if step >= warmup:
            if not times or elapsed <= statistics.median(times):
                timeline = list(engine.events)    # a typical step, not the slowest
            times.append(elapsed)
            losses.append(last["loss"])
            for d, v in last["stats"].peak_act.items():
                act_peak[d] = max(act_peak.get(d, 0.0), v)
            for d, v in last["stats"].compute.items():
                compute[d] = compute.get(d, 0.0) + v / steps
            for d, v in transport.comm_time.items():
                comm[d] = comm.get(d, 0.0) + v / steps
    if not training:
        grads = {}

    peak = {}
    pbytes = engine.param_bytes()
    for d in devices:
        tdev = dmap[d]
        if tdev.type == "cuda":
            peak[d] = float(torch.cuda.max_memory_allocated(tdev))
            continue
        state = optimizer_state_bytes(engine, d, opt)
        grad_bytes = sum(p.numel() * p.element_size() for p in engine.copies.get(d, {}).values()
                         if isinstance(p, torch.nn.Parameter) and p.requires_grad) \
            if training else 0.0
        peak[d] = pbytes.get(d, 0.0) + grad_bytes + state + act_peak.get(d, 0.0)
    step_time = statistics.median(times)
    busy = {d: compute.get(d, 0.0) + comm.get(d, 0.0) for d in devices}
    prediction = predict(graph, cluster, plan, problem_options)
    extra = {}
    if runner.cpu_fallback:
        # a GPU's prediction says nothing about a CPU's step
        extra = {"cpu_fallback": list(runner.cpu_fallback),
                 "prediction_compared": False}
    report = MeasuredReport(step_time=step_time, peak_memory=peak, busy=busy, compute=compute,
                            comm=comm, idle={d: max(0.0, step_time - b) for d, b in busy.items()},
                            model="measured", microbatches=len(mb_rows), schedule=used,
                            predicted=(prediction.step_time if prediction
                                       and not runner.cpu_fallback else None),
                            prediction=prediction, step_times=times,
                            timeline=_Frozen(timeline), extra=extra)
    outputs = join_outputs(sp, last["outputs"]) if last["outputs"] else None
    return RunResult(outputs=outputs, loss=last["loss"], losses=losses, gradients=grads,
                     parameters=engine.state(), report=report, schedule=used,
                     notes=list(sp.notes))


def optimizer_state_bytes(engine, device: str, opt) -> float:
    """Bytes of ``opt``'s state (momenta and the like) for the weight copies
    ``engine`` holds on ``device``: part of its peak memory on a CPU."""
    if opt is None:
        return 0.0
    return float(sum(v.numel() * v.element_size()
                     for p in engine.copies.get(device, {}).values()
                     for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)))

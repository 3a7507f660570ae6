"""``placer.run``: execute a plan in this process and measure it."""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch

from ..cost.report import FrozenTimeline
from ..errors import PlanError
# the shared pieces are this module's API too (placer.runtime.run.prepare...)
from .common import (LOSS_REDUCTIONS, RUNTIME_OPTIONS, MeasuredReport, RunResult,  # noqa: F401
                     build_optimizer, cpu_fallback, default_device_map, default_loss,
                     first_batch, join_outputs, optimizer_state_bytes, predict,
                     prediction_cluster, prepare, resolve_graph, sink_device)
from .engine import Engine, LocalTransport, Routes
from .order import for_plan
from .steps import Step, StepFigures, run_steps, timed_step


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
        # the order the prediction assumes (placer.runtime.order.for_plan)
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
        done = self.timed(keep_gradients)
        return done.seconds, done.last, done.kept

    def timed(self, keep_gradients: bool = False) -> Step:
        """One step, timed (:func:`placer.runtime.steps.timed_step`)."""
        return timed_step(self.engine, self.params, set(self.dmap.values()), self.transport,
                          self.inputs, self.targets, self.offsets, training=self.training,
                          optimizer=self.opt, keep_gradients=keep_gradients)


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
    measured = run_steps(steps, warmup, runner.timed, runner.engine, runner.transport)
    report = _measured_report(runner, measured.figures, cluster, problem_options)
    last, sp = measured.last, runner.split
    outputs = join_outputs(sp, last["outputs"]) if last["outputs"] else None
    return RunResult(outputs=outputs, loss=last["loss"], losses=measured.figures.losses,
                     gradients=measured.gradients if training else {},
                     parameters=runner.engine.state(), report=report, schedule=runner.schedule,
                     notes=list(sp.notes))


def _peak_memory(runner: Runner, figures: StepFigures) -> dict:
    """Per device: CUDA's allocator peak, else weights, gradients, optimizer
    state and the activations' peak."""
    engine, peak = runner.engine, {}
    pbytes = engine.param_bytes()
    for d in runner.devices:
        tdev = runner.dmap[d]
        if tdev.type == "cuda":
            peak[d] = float(torch.cuda.max_memory_allocated(tdev))
            continue
        state = optimizer_state_bytes(engine, d, runner.opt)
        grad_bytes = sum(p.numel() * p.element_size() for p in engine.copies.get(d, {}).values()
                         if isinstance(p, torch.nn.Parameter) and p.requires_grad) \
            if runner.training else 0.0
        peak[d] = pbytes.get(d, 0.0) + grad_bytes + state + figures.peak_act.get(d, 0.0)
    return peak


def _measured_report(runner: Runner, figures: StepFigures, cluster,
                     problem_options) -> MeasuredReport:
    """The run's :class:`MeasuredReport`, its prediction beside it."""
    compute, comm, times = figures.compute, figures.comm, figures.times
    step_time = statistics.median(times)
    busy = {d: compute.get(d, 0.0) + comm.get(d, 0.0) for d in runner.devices}
    prediction = predict(runner.graph, cluster, runner.plan, problem_options)
    extra = {}
    if runner.cpu_fallback:
        # a GPU's prediction says nothing about a CPU's step
        extra = {"cpu_fallback": list(runner.cpu_fallback),
                 "prediction_compared": False}
    return MeasuredReport(step_time=step_time, peak_memory=_peak_memory(runner, figures),
                          busy=busy, compute=compute, comm=comm,
                          idle={d: max(0.0, step_time - b) for d, b in busy.items()},
                          model="measured", microbatches=len(runner.mb_rows),
                          schedule=runner.schedule,
                          predicted=(prediction.step_time if prediction
                                     and not runner.cpu_fallback else None),
                          prediction=prediction, step_times=times,
                          timeline=FrozenTimeline(figures.timeline), extra=extra)

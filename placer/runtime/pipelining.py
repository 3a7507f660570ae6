"""``engine="pipelining"``: stage-contiguous plans on torch.distributed.pipelining.

The model is split by placer's own split (:mod:`placer.runtime.split`); each
piece becomes one ``PipelineStage`` whose module takes the values still
needed after the previous stage (activations, and model inputs or earlier
outputs that later stages read) and returns those needed after it, so skip
connections travel stage to stage. The stages must form the layout torch
pipelining runs (:func:`placer.export.stage_layout`): every stage on the
same data-parallel degree, and per replica either one stage per device or
stages looped round-robin over the devices. The schedule class follows the
plan's schedule: ``ScheduleGPipe`` or ``Schedule1F1B``; when a device holds
several stages, ``ScheduleLoopedBFS`` or ``ScheduleInterleaved1F1B``.

Data-parallel replicas are whole pipelines, each on its share of the batch
rows; every microbatch's loss is weighted by its share of the batch (or 1
for ``loss_reduction="sum"``) and gradients of weights held on several
devices (replicas, tied weights) are summed with ``all_reduce``, as the
built-in engine does, so both engines give the unplaced model's loss and
gradients.

Ranks: a process group's ranks are sorted, and torch places stage ``s`` on
group rank ``s mod size``, so rank ``r`` hosts the ``r``-th device of
:meth:`placer.export.Layout.rank_order` (replica by replica, each in its
pipeline's order), not the built-in engine's order. :func:`run` (one
process) runs every stage here in a one-rank gloo group of its own,
replicas one after another.

The measured report has the built-in engine's shape; torch runs the
schedule, so per-device ``busy``/``compute``/``comm`` are not measured
(empty), and ``peak_memory`` counts weights, gradients and optimizer state
(CUDA: the allocator's peak). ``extra`` (``report.to_dict()``) names the
engine and the schedule class.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from ..errors import PlanError
from ..export import SCHEDULE_CLASSES, Layout, stage_layout
from .engine import Engine, Inst, Routes, row_bounds
from .ranks import this_rank
from .common import (LOSS_REDUCTIONS, MeasuredReport, RunResult, build_optimizer,
                     default_device_map, optimizer_state_bytes, default_loss, join_outputs,
                     predict, prepare, sink_device)
from .status import STATUS, inject_fault
from .transport import gather_to_first

#: names usable as ``engine=`` in :func:`placer.run` and :func:`placer.launch`
ENGINES = ("builtin", "pipelining")


def check_engine(engine: str) -> str:
    """``engine`` if it is one of :data:`ENGINES`, else one clear error."""
    if engine not in ENGINES:
        raise PlanError(f"unknown engine {engine!r}", field="--engine",
                        fix="use " + " or ".join(ENGINES))
    return engine


class StageModule(torch.nn.Module):
    """One piece as a pipeline stage: takes the values alive before it (in
    ``carry_in`` order), returns those alive after it (``carry_out``).
    Inputs are moved to the stage's device (stages of one process may sit
    on different devices)."""

    def __init__(self, module: torch.nn.Module, piece, carry_in: list, carry_out: list,
                 device: torch.device):
        super().__init__()
        self.piece = module
        self.sources = list(piece.inputs)
        self.index = piece.index
        self.multi = bool(getattr(piece, "multi", False))
        self.carry_in, self.carry_out = list(carry_in), list(carry_out)
        self.device = device

    def forward(self, *args):
        env = {k: (a.to(self.device) if isinstance(a, torch.Tensor) else a)
               for k, a in zip(self.carry_in, args)}
        ins = [s.value if s.kind == "const" else env[s.key] for s in self.sources]
        out = self.piece(*ins)
        for k, v in enumerate(out if self.multi else (out,)):
            env[("piece", self.index, k)] = v
        # gloo sends only contiguous tensors (a slice of the ids is not)
        return tuple(env[k].contiguous() if isinstance(env[k], torch.Tensor) else env[k]
                     for k in self.carry_out)


def carries(sp) -> list[list[tuple]]:
    """Per stage (piece), the value keys it returns: those made by it or
    before it that a later piece or the model's output reads."""
    n = len(sp.pieces)
    made = {("input", i, 0): -1 for i in range(sp.n_inputs)}
    for p in sp.pieces:
        for k in range(p.n_outputs):
            made[("piece", p.index, k)] = p.index
    last_use: dict[tuple, int] = {}
    for p in sp.pieces:
        for s in p.inputs:
            if s.kind != "const":
                last_use[s.key] = max(last_use.get(s.key, -1), p.index)
    outputs = [s.key for s in sp.output_sources if s.kind != "const"]
    for key in outputs:
        last_use[key] = n
    out = []
    for s in range(n - 1):
        alive = sorted(k for k, used in last_use.items() if made.get(k, n) <= s < used)
        out.append(alive)
    out.append(outputs)
    for s, keys in enumerate(out[:-1]):
        for k in keys:
            info = sp.values.get(k)
            if info is not None and not info.is_tensor:
                raise PlanError(f"a non-tensor value ({k[0]} {k[1]} output {k[2]}) crosses "
                                f"stage {s}; "
                                "torch pipelining sends only tensors between stages",
                                field="placement", fix="run the plan with the built-in engine")
    return out


def layout_of(sp, plan) -> Layout:
    """The stage layout of the split (one stage per piece) or one line
    saying why torch pipelining cannot run it."""
    for p in sp.pieces:
        if len(p.group) > 1 and not p.sharded:
            raise PlanError(f"piece {p.index} on {list(p.group)} mixes the batch (batch "
                            "statistics or a reduction over it) and cannot be a data-parallel "
                            "stage", field="placement",
                            fix="run the plan with the built-in engine, or without data "
                                "parallelism there")
    return stage_layout([tuple(p.group) for p in sp.pieces], plan.microbatches, plan.schedule,
                        what="the pipelining engine")


class _Loss:
    """The schedule's loss: the model's output rebuilt from the last stage's
    values, the user's loss weighted by the microbatch's share of the batch
    (rows read from the target, which torch splits like the inputs)."""

    def __init__(self, sp, loss_fn: Callable, has_targets: bool, batch: int, reduction: str):
        self.sp, self.fn, self.has_targets = sp, loss_fn, has_targets
        self.batch, self.reduction = batch, reduction
        self.outputs: list = []
        self.losses: list = []

    def __call__(self, output, target):
        leaves = iter(output if isinstance(output, tuple) else (output,))
        full = [s.value if s.kind == "const" else next(leaves) for s in self.sp.output_sources]
        out = pytree.tree_unflatten(full, self.sp.output_spec)
        self.outputs.append(pytree.tree_map_only(torch.Tensor, lambda t: t.detach(), out))
        loss = self.fn(out, target) if self.has_targets else self.fn(out)
        rows = target.shape[0]
        weighted = loss * (rows / self.batch if self.reduction == "mean" else 1.0)
        self.losses.append(float(weighted.detach()))
        return weighted

    def start(self) -> None:
        """Forget the last step (call before each)."""
        self.outputs.clear()
        self.losses.clear()

    def step(self, microbatches: int) -> tuple[list, float]:
        """This step's outputs per microbatch and summed loss (torch's first
        step also calls the loss while it infers the stages' shapes: only the
        last ``microbatches`` calls are the step's)."""
        if not self.losses:
            return [], 0.0
        return self.outputs[-microbatches:], sum(self.losses[-microbatches:])


def _schedule(stages: list, microbatches: int, loss: _Loss, schedule: str):
    from torch.distributed import pipelining
    name = SCHEDULE_CLASSES[(schedule, len(stages) > 1)]
    cls = getattr(pipelining, name)
    target = stages if len(stages) > 1 else stages[0]
    return cls(target, microbatches, loss_fn=loss, scale_grads=False), name


def _replica_rows(inputs: list, sp, replicas: int, microbatches: int) -> list[tuple]:
    batch = sp.batch
    for i, t in enumerate(inputs):
        info = sp.values.get(("input", i, 0))
        if not isinstance(t, torch.Tensor) or info is None or not info.batched:
            raise PlanError(f"model input {i} ({sp.input_names[i]}) has no batch dimension; "
                            "the pipelining engine splits every input along dim 0",
                            fix="run the plan with the built-in engine")
    bounds = row_bounds(batch, replicas)
    if min(b - a for a, b in bounds) < microbatches:
        raise PlanError(f"a batch of {batch} rows cannot feed {replicas} replica(s) with "
                        f"{microbatches} microbatches each", field="microbatches",
                        fix="use fewer microbatches or a larger batch")
    return bounds


def _build(sp, plan, mb_rows, model, tdev: dict, local: list, training: bool, seed: int,
           loss_fn) -> Engine:
    """The local weight copies (materialised, tied weights shared per device),
    through the built-in engine's builder."""
    routes = Routes(sp, mb_rows, sink_device(sp))
    return Engine(sp, routes, tdev, local, None, training=training, loss_fn=loss_fn,
                  loss_weights=[1.0] * len(mb_rows), order=[], model=model, seed=seed)


def _stage_modules(engine: Engine, sp, keys: list, replica: int, stages: list, tdev) -> list:
    return [StageModule(engine.modules[Inst(s, replica)], sp.pieces[s],
                        [("input", i, 0) for i in range(sp.n_inputs)] if s == 0
                        else keys[s - 1], keys[s], tdev(s)) for s in stages]


def stage_shapes(sp, keys: list, stage: int, rows: int) -> tuple[tuple, tuple]:
    """Example (input, output) tensors of ``stage`` for a microbatch of
    ``rows`` rows, on the meta device: given to ``PipelineStage``, they spare
    torch's shape inference, which runs a stage on uninitialised buffers
    (an integer index among them can fault)."""
    def example(key):
        info = sp.values[key]
        shape = ((rows * info.factor,) if info.batched else ()) + tuple(info.rest)
        grad = bool(info.requires_grad and info.dtype.is_floating_point)
        return torch.empty(shape, dtype=info.dtype, device="meta").requires_grad_(grad)
    ins = [("input", i, 0) for i in range(sp.n_inputs)] if stage == 0 else keys[stage - 1]
    return tuple(example(k) for k in ins), tuple(example(k) for k in keys[stage])


def _equal_rows(sp, keys: list, rows: int, microbatches: int) -> int | None:
    """The rows of every microbatch of a replica of ``rows`` rows, or None
    when they differ (then torch infers the shapes itself, which a value
    of integers crossing stages cannot survive: refused)."""
    if rows % microbatches == 0:
        return rows // microbatches
    for stage in keys[:-1]:
        for k in stage:
            if not sp.values[k].dtype.is_floating_point:
                raise PlanError(f"{rows} rows do not split into {microbatches} equal "
                                "microbatches, and integers cross a stage; the pipelining "
                                "engine needs equal microbatches then", field="microbatches",
                                fix="make the batch a multiple of the microbatches (times "
                                    "the data-parallel degree)")
    return None


def _stages(mods: list, stages: list, n: int, sp, keys, rows, group=None) -> list:
    from torch.distributed.pipelining import PipelineStage
    out = []
    for s, m in zip(stages, mods):
        ins, outs = stage_shapes(sp, keys, s, rows) if rows else (None, None)
        out.append(PipelineStage(m, s, n, m.device, input_args=ins, output_args=outs,
                                 group=group))
    return out


def _targets(targets, batch: int):
    if targets is None:
        return torch.arange(batch)
    if not isinstance(targets, torch.Tensor):
        raise PlanError("the pipelining engine takes targets as one tensor",
                        field="targets", fix="pass a tensor, or use the built-in engine")
    return targets


def _peak(engine: Engine, dev: str, tdev: torch.device, opt, training: bool) -> float:
    if tdev.type == "cuda":
        return float(torch.cuda.max_memory_allocated(tdev))
    return (engine.param_bytes().get(dev, 0.0) * (2 if training else 1)
            + optimizer_state_bytes(engine, dev, opt))


def _flat_sum(grads: list[torch.Tensor], reduce) -> None:
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
    flat = _flatten_dense_tensors(grads)
    reduce(flat)
    for g, v in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(v)


def _grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


# --------------------------------------------------------------------------
# one process
# --------------------------------------------------------------------------
def run(model: torch.nn.Module, plan, example_inputs: Any, *, steps: int = 3, optimizer=None,
        loss_fn: Callable | None = None, targets: Any = None, graph=None, cluster=None,
        device_map: dict | None = None, warmup: int = 1, training: bool = True,
        loss_reduction: str = "mean", granularity: str | None = None, leaf_modules=None,
        problem_options: dict | None = None, seed: int = 0) -> RunResult:
    """:func:`placer.run` on torch pipelining, every stage in this process
    (a one-rank gloo group of its own; replicas one after another). Same
    arguments and result as :func:`placer.runtime.run.run`; the report's
    ``extra`` names the engine and schedule class."""
    if not training:
        raise PlanError("the pipelining engine runs training steps",
                        fix="use the built-in engine for inference")
    if loss_reduction not in LOSS_REDUCTIONS:
        raise PlanError(f"unknown loss_reduction {loss_reduction!r}", fix="use 'mean' or 'sum'")
    own = not dist.is_initialized()
    if not own and dist.get_world_size() > 1:
        raise PlanError("placer.run(engine='pipelining') runs in one process, but a "
                        f"{dist.get_world_size()}-rank process group is up",
                        fix="use placer.launch(engine='pipelining') for several ranks")
    torch.manual_seed(seed)
    graph, plan, sp, inputs, mb_rows = prepare(model, plan, example_inputs, graph=graph,
                                               granularity=granularity,
                                               leaf_modules=leaf_modules)
    layout = layout_of(sp, plan)
    keys = carries(sp)
    bounds = _replica_rows(inputs, sp, layout.replicas, len(mb_rows))
    devices = layout.rank_order()
    dmap = default_device_map(devices)
    if device_map:
        dmap.update({k: torch.device(v) for k, v in device_map.items()})
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return _run_here(model, plan, graph, cluster, sp, inputs, mb_rows, layout, keys, bounds,
                         devices, dmap, steps=steps, warmup=warmup, optimizer=optimizer,
                         loss_fn=loss_fn, targets=targets, loss_reduction=loss_reduction,
                         problem_options=problem_options, seed=seed)
    finally:
        if own:
            dist.destroy_process_group()


def _run_here(model, plan, graph, cluster, sp, inputs, mb_rows, layout, keys, bounds, devices,
              dmap, *, steps, warmup, optimizer, loss_fn, targets, loss_reduction,
              problem_options, seed) -> RunResult:
    engine = _build(sp, plan, mb_rows, model, dmap, devices, True, seed, loss_fn)
    n = layout.num_stages
    target_all = _targets(targets, sp.batch)
    replicas = []
    for r in range(layout.replicas):
        mods = _stage_modules(engine, sp, keys, r, list(range(n)),
                              lambda s, r=r: dmap[layout.device(s, r)])
        lo, hi = bounds[r]
        rows = _equal_rows(sp, keys, hi - lo, len(mb_rows))
        stages = _stages(mods, list(range(n)), n, sp, keys, rows)
        loss = _Loss(sp, loss_fn or default_loss, targets is not None, sp.batch, loss_reduction)
        sched, cls = _schedule(stages, len(mb_rows), loss, plan.schedule)
        # the loss runs on the last stage's device
        replicas.append((sched, loss, [t[lo:hi] for t in inputs],
                         target_all[lo:hi].to(mods[-1].device)))
    opt = build_optimizer(optimizer, engine.parameters())
    params = engine.parameters()
    shared = {}
    for name, holders in engine.holders.items():
        if len(holders) > 1:
            shared[name] = [engine.copies[d][name] for d in holders]
    times, losses, grads, outputs, total = [], [], {}, {}, 0.0
    for step in range(steps + warmup):
        for p in params:
            p.grad = None
        _sync(dmap.values())
        start = time.perf_counter()
        total = 0.0
        for sched, loss, args, target in replicas:
            loss.start()
            sched.step(*args, target=target)
            total += loss.step(len(mb_rows))[1]
        for copies in shared.values():
            gs = [_grad(p) for p in copies]
            s = gs[0].clone()
            for g in gs[1:]:
                s += g.to(s.device)
            for g in gs:
                g.copy_(s.to(g.device))
        if step == steps + warmup - 1:
            grads = engine.gradients()
        if opt is not None:
            opt.step()
        _sync(dmap.values())
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed)
            losses.append(total)
    for r, (_, loss, _, _) in enumerate(replicas):
        for m, out in enumerate(loss.step(len(mb_rows))[0]):
            outputs[(r, m)] = out
    step_time = statistics.median(times)
    prediction = predict(graph, cluster, plan, problem_options)
    peak = {d: _peak(engine, d, dmap[d], opt, True) for d in devices}
    report = MeasuredReport(step_time=step_time, peak_memory=peak, model="measured",
                            microbatches=len(mb_rows), schedule=plan.schedule,
                            predicted=prediction.step_time if prediction else None,
                            prediction=prediction, step_times=times,
                            extra={"engine": "pipelining", "schedule_class": cls})
    return RunResult(outputs=join_outputs(sp, outputs), loss=total, losses=losses,
                     gradients=grads, parameters=engine.state(), report=report,
                     schedule=plan.schedule, notes=list(sp.notes))


def _sync(devices) -> None:
    for d in set(devices):
        if d.type == "cuda":
            torch.cuda.synchronize(d)


# --------------------------------------------------------------------------
# one rank of several
# --------------------------------------------------------------------------
def rank_order(plan) -> list[str] | None:
    """The plan's devices in this engine's rank order (see the module doc),
    read from the placement's order without the model (a launcher's labels
    for its ranks), or None when the placement's runs do not form a layout
    (the ranks then refuse the plan themselves)."""
    runs: list[tuple] = []
    for group in plan.placement.values():
        if not runs or runs[-1] != tuple(group):
            runs.append(tuple(group))
    try:
        return stage_layout(runs, plan.microbatches, plan.schedule).rank_order()
    except PlanError:
        return None



def _holder_groups(engine, me: str, rank_of: dict) -> tuple:
    """Collective: a process group per set of ranks holding a weight (every
    rank creates every group, in the same order), and this rank's weights
    held on several ranks, by their set of ranks."""
    sets: dict[tuple, Any] = {}
    for name in sorted(engine.holders):
        holders = engine.holders[name]
        if len(holders) > 1:
            ranks = tuple(sorted(rank_of[d] for d in holders))
            if ranks not in sets:
                sets[ranks] = dist.new_group(list(ranks))
    shared: dict[tuple, list] = {}
    for name, p in engine.copies.get(me, {}).items():
        holders = engine.holders.get(name, (me,))
        if isinstance(p, torch.nn.Parameter) and len(holders) > 1:
            shared.setdefault(tuple(sorted(rank_of[d] for d in holders)), []).append(p)
    return sets, shared

def run_rank(model: torch.nn.Module, plan, example_inputs, *, steps: int = 3, warmup: int = 1,
             optimizer=None, loss_fn: Callable | None = None, targets=None, graph=None,
             cluster=None, device: str | torch.device | None = None, training: bool = True,
             loss_reduction: str = "mean", problem_options: dict | None = None,
             seed: int = 0, **ignored) -> dict | None:
    """This rank's stages of the plan on torch pipelining; the process group
    must be up. Returns, on rank 0, the same dict as
    :func:`placer.runtime.rank_loop.run_rank` (``loss``, ``losses``, ``outputs``,
    ``gradients``, ``parameters``, ``report``...); None elsewhere.
    ``ignored``: built-in engine options without a meaning here
    (``calibrate``, ``busy_poll``)."""
    if not training:
        raise PlanError("the pipelining engine runs training steps",
                        fix="use the built-in engine for inference")
    if ignored.get("calibrate"):
        raise PlanError("--calibrate is not supported by the pipelining engine",
                        fix="calibrate with the built-in engine")
    torch.manual_seed(seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    graph, plan, sp, inputs, mb_rows = prepare(model, plan, example_inputs, graph=graph)
    layout = layout_of(sp, plan)
    keys = carries(sp)
    bounds = _replica_rows(inputs, sp, layout.replicas, len(mb_rows))
    devs = layout.rank_order()
    me, backend, tdev = this_rank(devs, cluster, device)
    if tdev.type == "cuda" and backend != "nccl" and world > 1:
        raise PlanError(f"rank {rank} runs on {tdev}, but torch pipelining sends CUDA "
                        f"tensors between ranks only over NCCL, not {backend}",
                        field="--backend", fix="use --backend nccl (one GPU per rank)")
    if tdev.type == "cuda":
        torch.cuda.set_device(tdev)
    rank_of = {d: i for i, d in enumerate(devs)}
    # every rank creates every group, in the same order
    pipes = [dist.new_group([rank_of[d] for d in p]) for p in layout.pipelines]
    replica = next(r for r, p in enumerate(layout.pipelines) if me in p)
    mine = [s for s in range(layout.num_stages) if layout.device(s, replica) == me]
    engine = _build(sp, plan, mb_rows, model, {d: tdev for d in devs}, [me], True, seed,
                    loss_fn)
    sets, shared = _holder_groups(engine, me, rank_of)
    mods = _stage_modules(engine, sp, keys, replica, mine, lambda s: tdev)
    n = layout.num_stages
    lo, hi = bounds[replica]
    rows = _equal_rows(sp, keys, hi - lo, len(mb_rows))
    stages = _stages(mods, mine, n, sp, keys, rows, group=pipes[replica])
    loss = _Loss(sp, loss_fn or default_loss, targets is not None, sp.batch, loss_reduction)
    sched, cls = _schedule(stages, len(mb_rows), loss, plan.schedule)
    args = [t[lo:hi].to(tdev) for t in inputs] if 0 in mine else []
    target = _targets(targets, sp.batch)[lo:hi].to(tdev)
    opt = build_optimizer(optimizer, engine.parameters())
    params = engine.parameters()
    times, losses, grads = [], [], {}
    for step in range(steps + warmup):
        STATUS.set(f"step {step}")
        inject_fault(rank, step)
        for p in params:
            p.grad = None
        if tdev.type == "cuda":
            torch.cuda.synchronize(tdev)
            torch.cuda.reset_peak_memory_stats(tdev)
        loss.start()
        with STATUS.wait(None, "the step barrier"):
            dist.barrier()
        start = time.perf_counter()
        sched.step(*args, target=target)
        for ranks, ps in shared.items():
            _flat_sum([_grad(p) for p in ps], lambda t, g=sets[ranks]: dist.all_reduce(t, group=g))
        if step == steps + warmup - 1:
            grads = engine.gradients()
        if opt is not None:
            opt.step()
        if tdev.type == "cuda":
            torch.cuda.synchronize(tdev)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        total = torch.tensor([loss.step(len(mb_rows))[1]], dtype=torch.float64)
        with STATUS.wait(None, "the step's end"):
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            dist.all_reduce(total)
        if step >= warmup:
            times.append(float(elapsed))
            losses.append(float(total))
    mine_out = {"device": me, "replica": replica, "outputs": loss.step(len(mb_rows))[0],
                "gradients": grads, "parameters": engine.state(),
                "peak": _peak(engine, me, tdev, opt, True)}
    gathered = gather_to_first(mine_out)
    if gathered is None:
        return None
    outputs, merged_grads, params_all = {}, {}, {}
    for part in gathered:
        for m, out in enumerate(part["outputs"]):
            outputs[(part["replica"], m)] = out
        for k, v in part["gradients"].items():
            merged_grads.setdefault(k, v)
        for k, v in part["parameters"].items():
            params_all.setdefault(k, v)
    step_time = statistics.median(times)
    prediction = predict(graph, cluster, plan, problem_options) if cluster is not None else None
    report = MeasuredReport(step_time=step_time, peak_memory={p["device"]: p["peak"]
                                                              for p in gathered},
                            model="measured", microbatches=len(mb_rows), schedule=plan.schedule,
                            predicted=prediction.step_time if prediction else None,
                            step_times=times,
                            extra={"engine": "pipelining", "schedule_class": cls})
    return {"loss": losses[-1], "losses": losses,
            "outputs": join_outputs(sp, outputs) if outputs else None,
            "gradients": merged_grads, "parameters": params_all,
            "report": report.to_dict() | {"predicted": report.predicted, "step_times": times},
            "schedule": plan.schedule, "notes": list(sp.notes), "events": [],
            "engine": "pipelining"}

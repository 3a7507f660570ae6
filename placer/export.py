"""``placer export``: a plan in the forms other tools consume.

- ``pipelining``: torch.distributed.pipelining's split points
  (``SplitPoint.BEGINNING`` before a submodule, for ``pipeline()``), the
  stage -> device map, the microbatches and the schedule class
  (``ScheduleGPipe``, ``Schedule1F1B``; ``ScheduleInterleaved1F1B`` or
  ``ScheduleLoopedBFS`` when a device holds several stages);
- ``device-map``: a Hugging Face accelerate ``device_map`` (module name ->
  device);
- ``deepspeed``: a DeepSpeed ``PipelineModule`` layer partition (``parts``
  boundaries over the graph's top-level layers) and the pipeline and
  data-parallel degrees.

A plan whose shape a tool cannot express raises one
:class:`placer.errors.PlanError` line saying why (a module split across
devices, unequal data-parallel degrees, stages that are not round-robin, ...).

The stage layout (:func:`stage_layout`) is shared with the pipelining
engine (:mod:`placer.runtime.pipelining`), which checks plans the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import PlanError

TARGETS = ("pipelining", "device-map", "deepspeed")

#: torch.distributed.pipelining schedule class per plan schedule, for one
#: stage per device and for several (looped round-robin) stages per device
SCHEDULE_CLASSES = {("gpipe", False): "ScheduleGPipe", ("1f1b", False): "Schedule1F1B",
                    ("gpipe", True): "ScheduleLoopedBFS",
                    ("1f1b", True): "ScheduleInterleaved1F1B"}


@dataclass
class Layout:
    """Stages of a stage-contiguous plan, as torch pipelining runs them.

    ``groups[s]``: the device group of stage ``s``; ``replicas``: the
    data-parallel degree (every stage has it); ``pipelines[r]``: the devices
    of replica ``r`` in pipeline-rank order (stage ``s`` of replica ``r``
    runs on ``pipelines[r][s % len(pipelines[r])]``); ``per_device``: stages
    each device holds; ``schedule_class``: the torch schedule to run."""

    groups: list
    replicas: int
    pipelines: list
    per_device: int
    schedule_class: str
    notes: list = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        return len(self.groups)

    def device(self, stage: int, replica: int = 0) -> str:
        """The device running ``stage`` in ``replica``."""
        return self.groups[stage][replica]

    def rank_order(self) -> list[str]:
        """Every device, replica by replica, each in its pipeline's order: the
        rank order the engine uses (a process group's ranks are sorted, and
        torch places stage ``s`` on group rank ``s mod size``)."""
        return [d for devices in self.pipelines for d in devices]


def stage_layout(groups: list, microbatches: int, schedule: str, *, what: str = "pipelining",
                 file: str | None = None) -> Layout:
    """Check that stages with these device groups (in order) can run on
    torch pipelining and say how; else raise one :class:`PlanError` line.

    >>> stage_layout([("a",), ("b",), ("a",), ("b",)], 4, "1f1b").schedule_class
    'ScheduleInterleaved1F1B'
    >>> stage_layout([("a", "b"), ("c", "d")], 2, "gpipe").pipelines
    [['a', 'c'], ['b', 'd']]
    """
    if not groups:
        raise PlanError("the plan has no stage", field="placement", file=file)
    degree = len(groups[0])
    for s, g in enumerate(groups):
        if len(g) != degree:
            raise PlanError(f"unequal data-parallel degrees: stage 0 runs on {degree} "
                            f"device(s), stage {s} on {len(g)} ({list(g)}); {what} runs "
                            "every stage on the same number of replicas",
                            field="placement", file=file,
                            fix="give every stage the same data-parallel degree, or run "
                                "with the built-in engine")
    owner: dict[str, int] = {}
    pipelines = []
    for r in range(degree):
        seq = [g[r] for g in groups]
        devices: list[str] = []
        for d in seq:
            if owner.setdefault(d, r) != r:
                raise PlanError(f"device {d!r} is replica {owner[d]} of one stage and "
                                f"replica {r} of another; {what} runs each device in one "
                                "pipeline", field="placement", file=file,
                                fix="list every data-parallel group in the same replica order")
            if d not in devices:
                devices.append(d)
        k = len(devices)
        for s, d in enumerate(seq):
            if d != devices[s % k] or len(seq) % k:
                raise PlanError(f"stage {s} runs on {d!r} but {what} loops stages round-robin "
                                f"over the pipeline's devices ({', '.join(devices)}): stage "
                                f"{s} would be on {devices[s % k]!r}",
                                field="placement", file=file,
                                fix="make stages contiguous (one per device), or loop them "
                                    "a, b, a, b so each device holds as many")
        pipelines.append(devices)
    sizes = {len(p) for p in pipelines}
    k = pipelines[0].__len__()
    if len(sizes) > 1:
        raise PlanError("the replicas' pipelines have different lengths", field="placement",
                        file=file, fix="give every replica as many devices")
    per_device = len(groups) // k
    looped = per_device > 1
    if schedule not in ("gpipe", "1f1b"):
        raise PlanError(f"schedule {schedule!r} has no torch pipelining schedule",
                        field="schedule", file=file, fix="use gpipe or 1f1b")
    cls = SCHEDULE_CLASSES[(schedule, looped)]
    m = max(1, int(microbatches))
    if cls == "ScheduleInterleaved1F1B":
        rounds = max(1, m // k)
        if m % rounds:
            raise PlanError(f"{m} microbatches: {cls} on {k} devices needs a multiple of "
                            f"{rounds}", field="microbatches", file=file,
                            fix=f"use {rounds * (m // rounds)} or {k * rounds} microbatches")
    return Layout([tuple(g) for g in groups], degree, pipelines, per_device, cls)


# --------------------------------------------------------------------------
# stages of a plan over a graph
# --------------------------------------------------------------------------
def plan_stages(graph, plan) -> list[tuple[tuple, list[str]]]:
    """The plan's stages over the graph's topological order: runs of ops on
    one device group, ``[(group, [op ids])]``. Graph inputs (ops without
    FLOPs or weights that only feed data in) join the stage of their first
    consumer."""
    order = graph.topological_order()
    runs: list[tuple[tuple, list[str]]] = []
    for op_id in order:
        if op_id not in plan.placement:
            raise PlanError(f"op {op_id!r} is not placed", field="placement",
                            fix="export a plan made for this graph (--graph)")
        group = tuple(plan.placement[op_id])
        if _is_input(graph, op_id):
            continue
        if runs and runs[-1][0] == group:
            runs[-1][1].append(op_id)
        else:
            runs.append((group, [op_id]))
    return runs


def _is_input(graph, op_id: str) -> bool:
    return graph.op(op_id).op in ("input", "placeholder")


def _module(graph, op_id: str) -> str | None:
    return graph.op(op_id).extra.get("module")


def _within(name: str | None, prefix: str) -> bool:
    return name is not None and (name == prefix or name.startswith(prefix + "."))


def split_points(graph, stages) -> list[str]:
    """The submodule before which each stage after the first begins: the
    outermost called module whose first op (in topological order) opens
    the stage and all of whose ops are in it."""
    points = []
    for s, (group, ops) in enumerate(stages):
        if s > 0:
            first = ops[0]
            name = _module(graph, first)
            if name is None:
                raise PlanError(f"stage {s} begins with op {first!r}, which is not in a "
                                "submodule; pipeline() splits only before a submodule call",
                                field="placement",
                                fix="move the op into the previous stage, or run the plan "
                                    "with the built-in engine")
            parts = name.split(".")
            chosen = None
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if i < len(parts) and parts[i].isdigit():
                    continue      # a container (ModuleList): never called itself
                inside = [o for o in graph.ids if _within(_module(graph, o), prefix)]
                if set(inside) <= set(ops):
                    chosen = prefix
                    break
            if chosen is None or not _starts(graph, first, chosen):
                raise PlanError(f"stage {s} begins inside module {name!r} (at op {first!r}): "
                                "an op-level placement splits it, and pipeline() splits "
                                "only before a whole submodule", field="placement",
                                fix="place the module's ops on one device (plan at module "
                                    "granularity)")
            points.append(chosen)
    return points


def _starts(graph, op_id: str, prefix: str) -> bool:
    """Whether ``op_id`` is the first op under module ``prefix``."""
    for o in graph.topological_order():
        if _within(_module(graph, o), prefix):
            return o == op_id
    return False


def _split_modules(graph, plan) -> None:
    """Refuse a plan that places the ops of one module on several groups."""
    where: dict[str, tuple] = {}
    for op in graph:
        name = op.extra.get("module")
        if name is None:
            continue
        group = tuple(plan.placement[op.id])
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            other = where.setdefault(prefix, group)
            if other != group and i == len(parts):
                raise PlanError(f"module {name!r} is split across {list(other)} and "
                                f"{list(group)} (op-level placement); a device_map places "
                                "whole modules", field="placement",
                                fix="plan at module granularity")


# --------------------------------------------------------------------------
# the three forms
# --------------------------------------------------------------------------
def to_pipelining(graph, plan, *, file: str | None = None) -> dict:
    """The split spec, stage map and schedule for torch pipelining."""
    stages = plan_stages(graph, plan)
    layout = stage_layout([g for g, _ in stages], plan.microbatches, plan.schedule, file=file)
    points = split_points(graph, stages)
    return {
        "format": "placer.export.pipelining/v1",
        "split_spec": {p: "BEGINNING" for p in points},
        "num_stages": layout.num_stages,
        "stages": [{"stage": s, "devices": list(g), "first_op": ops[0], "ops": len(ops),
                    "rank": layout.pipelines[0].index(g[0])}
                   for s, (g, ops) in enumerate(stages)],
        "pipelines": layout.pipelines,
        "data_parallel": layout.replicas,
        "stages_per_device": layout.per_device,
        "microbatches": int(plan.microbatches),
        "schedule": plan.schedule,
        "schedule_class": layout.schedule_class,
    }


def pipelining_snippet(spec: dict, model: str | None = None, **model_options) -> str:
    """A short script (under ``torchrun --nproc-per-node N``) that builds
    the pipeline of ``spec`` with ``pipeline()`` and steps it once: it runs
    as written when ``model`` names how to build the model (a zoo name or
    ``MODULE:FACTORY``, with :func:`placer.cli.load_model`'s options), else
    its ``build()`` is for the user to fill in. One pipeline: data-parallel
    replicas are left out."""
    n = len(spec["pipelines"][0])
    points = ", ".join(f"{k!r}: SplitPoint.BEGINNING" for k in spec["split_spec"])
    if model is None:
        body = 'raise NotImplementedError("build your model here")'
    else:
        args = ", ".join(f"{k}={v!r}" for k, v in model_options.items())
        body = ("from placer.cli import load_model\n"
                f"    return load_model({model!r}{', ' + args if args else ''})")
    return f'''"""torch pipelining for a placer plan: torchrun --nproc-per-node {n} THIS.py"""
import torch
import torch.distributed as dist
from torch.distributed.pipelining import SplitPoint, pipeline, {spec["schedule_class"]}


def build():
    """Return (model, example_inputs); every rank builds the same."""
    {body}


def main():
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()  # {n} ranks
    torch.manual_seed(0)
    model, inputs = build()
    microbatches = {spec["microbatches"]}
    chunk = tuple(t.tensor_split(microbatches)[0] for t in inputs)
    pipe = pipeline(model, mb_args=chunk, split_spec={{{points}}})
    # stage s runs on rank s % size ({spec["stages_per_device"]} stage(s) per rank)
    stages = [pipe.build_stage(s, torch.device("cpu"))
              for s in range(rank, pipe.num_stages, size)]
    loss_fn = lambda out, target: out.float().mean()
    stage = stages if len(stages) > 1 else stages[0]
    schedule = {spec["schedule_class"]}(stage, microbatches, loss_fn=loss_fn)
    target = torch.zeros(inputs[0].shape[0])
    losses = []
    if rank == 0:
        schedule.step(*inputs, target=target, losses=losses)
    else:
        schedule.step(target=target, losses=losses)
    if losses:   # the rank of the last stage
        print(f"rank {{rank}}: loss {{sum(x.detach().item() for x in losses) / microbatches:.6g}}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def _device_names(devices: list[str]) -> dict[str, object]:
    """Plan device -> accelerate device: torch device names stay, others
    become GPU indices in order."""
    import torch
    out: dict[str, object] = {}
    index = 0
    for d in devices:
        try:
            torch.device(d)
            out[d] = d
        except (RuntimeError, TypeError):
            out[d] = index
            index += 1
    return out


def to_device_map(graph, plan, *, file: str | None = None) -> dict:
    """An accelerate ``device_map`` (module name -> device) for a plan that
    places whole modules, one device each, in contiguous stages."""
    for op in graph:
        group = plan.placement.get(op.id)
        if group is not None and len(group) > 1 and op.extra.get("module"):
            raise PlanError(f"module {op.extra['module']!r} is data-parallel over "
                            f"{list(group)}; a device_map puts each module on one device",
                            field="placement", file=file, fix="export to pipelining or "
                            "deepspeed, or plan without data parallelism")
    stages = plan_stages(graph, plan)
    devices: list[str] = []
    for s, (group, ops) in enumerate(stages):
        if group[0] in devices and devices[-1] != group[0]:
            raise PlanError(f"device {group[0]!r} holds non-contiguous stages (again at "
                            f"stage {s}, op {ops[0]!r}); a device_map runs the model "
                            "through each device once", field="placement", file=file,
                            fix="give each device one contiguous run of modules")
        devices.append(group[0])
    _split_modules(graph, plan)
    names = _device_names(list(dict.fromkeys(devices)))
    mapping: dict[str, object] = {}
    for op_id in graph.topological_order():
        name = _module(graph, op_id)
        if name is None:
            continue
        dev = names[plan.placement[op_id][0]]
        # the outermost module whose ops all sit on this device
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            ops = [o.id for o in graph if _within(o.extra.get("module"), prefix)]
            if all(names[plan.placement[o][0]] == dev for o in ops):
                name = prefix
                break
        if not any(_within(name, k) for k in mapping):
            mapping[name] = dev
    if not mapping:
        raise PlanError("the graph names no modules (op extra 'module'), so there is no "
                        "device_map to write", field="--graph",
                        fix="export with the graph traced from the model (placer trace)")
    return {"format": "placer.export.device-map/v1", "device_map": mapping,
            "devices": {str(v): k for k, v in names.items()}}


def to_deepspeed(graph, plan, *, file: str | None = None) -> dict:
    """A DeepSpeed ``PipelineModule`` partition: the graph's top-level layers
    in order and the ``parts`` boundaries (stage ``s`` holds layers
    ``parts[s]:parts[s+1]``), with the pipeline and data-parallel degrees."""
    stages = plan_stages(graph, plan)
    layout = stage_layout([g for g, _ in stages], plan.microbatches, plan.schedule,
                          what="DeepSpeed's pipeline", file=file)
    if layout.per_device > 1:
        raise PlanError(f"each device holds {layout.per_device} stages; DeepSpeed's pipeline "
                        "puts one stage on each device", field="placement", file=file,
                        fix="make stages contiguous (one per device)")
    layers: list[str] = []
    stage_of: dict[str, int] = {}
    parts = [0]
    for s, (group, ops) in enumerate(stages):
        for op_id in ops:
            layer = _layer(graph, op_id)
            if stage_of.get(layer, s) == s and layers and layers[-1] == layer:
                continue
            if layer in stage_of:
                raise PlanError(f"layer {layer!r} has ops in two stages (op {op_id!r} in "
                                f"stage {s}); a DeepSpeed partition cuts between whole "
                                "layers", field="placement", file=file,
                                fix="place each layer's ops on one device")
            layers.append(layer)
            stage_of[layer] = s
        parts.append(len(layers))
    return {"format": "placer.export.deepspeed/v1", "layers": layers, "parts": parts,
            "num_stages": layout.num_stages, "pipe_parallel_size": layout.num_stages,
            "data_parallel_size": layout.replicas,
            "stage_devices": [list(g) for g in layout.groups],
            "micro_batches": int(plan.microbatches),
            "schedule": "1f1b (DeepSpeed's TrainSchedule)"}


def _layer(graph, op_id: str) -> str:
    """The top-level layer an op belongs to: its top-level module, or the
    entry of a top-level container (``blocks.3``); a top-level function op
    is a layer of its own."""
    name = _module(graph, op_id)
    if name is None:
        return op_id
    parts = name.split(".")
    if len(parts) > 1 and parts[1].isdigit():
        return ".".join(parts[:2])
    return parts[0]


def export(graph, plan, to: str, *, file: str | None = None) -> dict:
    """The plan in the form ``to`` (one of :data:`TARGETS`) consumes."""
    if to == "pipelining":
        return to_pipelining(graph, plan, file=file)
    if to == "device-map":
        return to_device_map(graph, plan, file=file)
    if to == "deepspeed":
        return to_deepspeed(graph, plan, file=file)
    raise PlanError(f"unknown export target {to!r}", field="--to",
                    fix="use one of: " + ", ".join(TARGETS))


def cmd_export(args) -> int:
    """``placer export PLAN --to TARGET --graph GRAPH``: write the plan in
    the form TARGET consumes (JSON to ``-o`` or stdout)."""
    from ._io import atomic_write_text, dump_json
    from .loaders import load_graph
    from .plan import Plan
    if not args.graph:
        from .errors import PlacerError
        raise PlacerError("export needs the graph the plan was made for", field="--graph",
                          fix="pass --graph GRAPH (a graph file, zoo model or MODULE:FACTORY)")
    plan = Plan.load(args.plan)
    graph = load_graph(args.graph, args)
    data = export(graph, plan, args.to, file=args.plan)
    text = dump_json(data)
    written = []
    if args.output:
        atomic_write_text(args.output, text)
        written.append(args.output)
    if args.snippet:
        if args.to != "pipelining":
            raise PlanError("--snippet writes a torch pipelining script", field="--snippet",
                            fix="use it with --to pipelining")
        from .loaders import is_graph_file
        model = None if is_graph_file(args.graph) else args.graph
        options = dict(input_shapes=args.input_shape, input_dtype=args.input_dtype,
                       batch=args.batch, seq=args.seq, tiny=args.tiny)
        atomic_write_text(args.snippet, pipelining_snippet(data, model, **options))
        written.append(args.snippet)
    if args.json or not written:
        print(text.rstrip())
    else:
        print(f"{args.to}: {_summary(data)}; wrote {', '.join(written)}")
    return 0


def _summary(data: dict) -> str:
    if "split_spec" in data:
        return (f"{data['num_stages']} stages at {list(data['split_spec']) or 'none'}, "
                f"{data['schedule_class']}, {data['microbatches']} microbatches, "
                f"{data['data_parallel']} replica(s)")
    if "device_map" in data:
        return f"{len(data['device_map'])} modules on {len(data['devices'])} devices"
    return (f"{len(data['layers'])} layers, parts {data['parts']}, pipeline "
            f"{data['pipe_parallel_size']} x data {data['data_parallel_size']}")

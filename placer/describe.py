"""A plan in a person's terms: its stages (the ops each group of devices
runs, as module names or op ranges), what each device holds and a one-line
shape ("4 pipeline stages, stage 2 data-parallel over 3 devices").

A stage is every op placed on the same device set (several devices: the
stage is data-parallel over them); stages are numbered in the order the
model reaches their last op, so a pipeline's stages come out in pipeline
order even when a small op (a tied embedding) sits with a later stage.

>>> from placer import Plan
>>> plan = Plan({"embed": ["a0"], "h0": ["a0"], "h1": ["b0", "b1", "b2"],
...              "h2": ["b0", "b1", "b2"], "head": ["c0"]}, microbatches=4)
>>> shape(plan)
'3 pipeline stages, stage 2 data-parallel over 3 devices; 4 microbatches, 1f1b'
>>> [(s.index, s.devices, ranges(s.runs)) for s in stages(plan)][:2]
[(1, ('a0',), 'embed, h0'), (2, ('b0', 'b1', 'b2'), 'h1, h2')]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from .plan import Plan


@dataclass
class Stage:
    """The ops one device set runs: ``runs`` are maximal stretches of
    consecutive ops (in the model's order) placed on ``devices``."""

    index: int
    devices: tuple[str, ...]
    runs: list[list[str]] = field(default_factory=list)

    @property
    def ops(self) -> list[str]:
        """Every op of the stage, in the model's order."""
        return [op for run in self.runs for op in run]


def stages(plan: "Plan", order: Sequence[str] | None = None) -> list[Stage]:
    """The plan's stages in pipeline order. ``order``: the ops in the
    model's order (a graph's topological order); default the placement's
    own order, which is the graph's for plans the strategies write."""
    order = list(order) if order is not None else list(plan.placement)
    runs: list[tuple[tuple[str, ...], list[str]]] = []
    for op in order:
        devices = tuple(plan.placement[op])
        if runs and runs[-1][0] == devices:
            runs[-1][1].append(op)
        else:
            runs.append((devices, [op]))
    by_devices: dict[tuple[str, ...], list[list[str]]] = {}
    last: dict[tuple[str, ...], int] = {}
    position = 0
    for devices, run in runs:
        by_devices.setdefault(devices, []).append(run)
        position += len(run)
        last[devices] = position
    ordered = sorted(by_devices, key=lambda d: last[d])
    return [Stage(i + 1, devices, by_devices[devices]) for i, devices in enumerate(ordered)]


def is_pipeline(found: list[Stage]) -> bool:
    """Whether the stages are (mostly) contiguous stretches of the model, as
    a pipeline's are, rather than ops scattered over the devices."""
    return sum(len(s.runs) for s in found) <= 2 * len(found)


def ranges(runs: Iterable[list[str]], limit: int = 72) -> str:
    """Runs of ops as text: short runs listed, long ones as ``first .. last
    (n ops)``; cut at about ``limit`` characters."""
    parts = [", ".join(run) if len(run) <= 3 else f"{run[0]} .. {run[-1]} ({len(run)} ops)"
             for run in runs]
    text = ""
    for k, part in enumerate(parts):
        candidate = part if not text else f"{text}; {part}"
        if text and len(candidate) > limit:
            return f"{text}; +{len(parts) - k} more"
        text = candidate
    return text


def _words(numbers: list[int]) -> str:
    if len(numbers) == 1:
        return str(numbers[0])
    return ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"


def shape(plan: "Plan", order: Sequence[str] | None = None) -> str:
    """One line on the plan's shape, e.g. ``"4 pipeline stages, stage 2
    data-parallel over 3 devices; 8 microbatches, 1f1b"``."""
    found = stages(plan, order)
    devices = plan.devices_used()
    pipeline = f"; {plan.microbatches} microbatch{'es' if plan.microbatches != 1 else ''}, " \
               f"{plan.schedule}"
    parallel = [s for s in found if len(s.devices) > 1]
    if not is_pipeline(found):
        runs = sum(len(s.runs) for s in found)
        replicated = sum(len(s.ops) for s in parallel)
        return (f"op-level placement over {len(devices)} devices: the model's "
                f"{len(plan.placement)} ops change device {runs - 1} times"
                + (f", {replicated} of them data-parallel" if replicated else "") + pipeline)
    if len(found) == 1:
        only = found[0]
        return ("1 stage, " + (f"data-parallel over {len(only.devices)} devices"
                               if len(only.devices) > 1 else f"everything on {only.devices[0]}")
                + pipeline)
    text = f"{len(found)} pipeline stages"
    if parallel and len(parallel) == len(found) and len({len(s.devices) for s in parallel}) == 1:
        text += f", each data-parallel over {len(parallel[0].devices)} devices"
    elif parallel:
        sizes = [len(s.devices) for s in parallel]
        text += (f", stage{'s' if len(parallel) > 1 else ''} {_words([s.index for s in parallel])}"
                 f" data-parallel over {_words(sizes)} devices")
    if len(devices) != sum(len(s.devices) for s in found):
        text += f" ({len(devices)} devices, some in several stages)"
    return text + pipeline


def device_rows(plan: "Plan", order: Sequence[str] | None = None) -> list[dict]:
    """Per device: its stages, the ops it runs (as ranges), its predicted
    peak memory and busy share of the step (None when the plan's
    ``predicted`` block does not say)."""
    found = stages(plan, order)
    predicted = plan.predicted or {}
    memory = predicted.get("peak_memory") or {}
    busy = predicted.get("busy") or {}
    step = predicted.get("step_time")
    rows = []
    order_of = {op: k for k, op in enumerate(order or plan.placement)}
    first_stage = {}
    for s in found:
        for name in s.devices:
            first_stage.setdefault(name, s.index)
    for name in sorted(first_stage, key=lambda n: (first_stage[n], len(n), n)):
        mine = [s for s in found if name in s.devices]
        runs = [run for s in mine for run in s.runs]
        runs.sort(key=lambda r: order_of.get(r[0], 0))
        rows.append({"device": name, "stages": [s.index for s in mine],
                     "ops": sum(len(r) for r in runs), "ranges": ranges(runs),
                     "peak_memory": memory.get(name),
                     "busy_share": (busy[name] / step if name in busy and step else None)})
    return rows

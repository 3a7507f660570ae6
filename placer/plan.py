"""The plan: which devices run each op, and how the step is pipelined.

An op placed on several devices is data-parallel across them (its gradients
are all-reduced over that group). Files use the ``placer.plan/v1`` format.

>>> p = Plan({"a": ["gpu0"], "b": ["gpu1", "gpu2"]}, microbatches=4, schedule="gpipe")
>>> sorted(p.devices_used())
['gpu0', 'gpu1', 'gpu2']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._io import (Fields, PathLike, atomic_write_text, check_format, dump_json,
                  load_document, wrap_errors)
from .errors import PlanError

if TYPE_CHECKING:
    from .cluster import Cluster
    from .graph import Graph

FORMAT = "placer.plan/v1"
SCHEDULES = ("gpipe", "1f1b")


@dataclass
class Plan:
    """Placement of every op on a list of devices, plus the pipeline settings.

    ``graph`` and ``cluster`` are the fingerprints of what the plan was made
    for (None when unknown); ``predicted`` holds the cost model's figures.
    """

    placement: dict[str, list[str]]
    microbatches: int = 1
    schedule: str = "1f1b"
    method: str = "manual"
    graph: str | None = None
    cluster: str | None = None
    predicted: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def devices_of(self, op_id: str) -> list[str]:
        return self.placement[op_id]

    def devices_used(self) -> set[str]:
        """Every device that runs at least one op."""
        return {d for devices in self.placement.values() for d in devices}

    def bind(self, graph: "Graph", cluster: "Cluster") -> "Plan":
        """Record the fingerprints of ``graph`` and ``cluster``; returns self."""
        self.graph = graph.fingerprint()
        self.cluster = cluster.fingerprint()
        return self

    def validate(self, graph: "Graph", cluster: "Cluster", *,
                 check_fingerprints: bool = True, file: str | None = None) -> "Plan":
        """Check the plan fits ``graph`` and ``cluster``: every op exactly once,
        known devices, non-empty device lists without repeats, colocation
        kept, fingerprints equal. Raises :class:`PlanError`; returns self."""
        if check_fingerprints:
            for label, mine, theirs in (("graph", self.graph, graph),
                                        ("cluster", self.cluster, cluster)):
                if mine is not None and mine != theirs.fingerprint():
                    raise PlanError(
                        f"plan was made for another {label} (fingerprint {mine[:12]}…, "
                        f"this {label} is {theirs.fingerprint()[:12]}…)", file=file,
                        field=label, fix=f"re-plan for this {label} or pass the {label} "
                        "the plan was made for")
        missing = [op.id for op in graph if op.id not in self.placement]
        if missing:
            raise PlanError(f"{len(missing)} op(s) not placed, e.g. {missing[0]!r}",
                            file=file, field="placement",
                            fix="every op of the graph must appear exactly once")
        unknown = [op_id for op_id in self.placement if op_id not in graph]
        if unknown:
            raise PlanError(f"{len(unknown)} placed op(s) not in graph "
                            f"{graph.name!r}, e.g. {unknown[0]!r}", file=file,
                            field="placement", fix="plan for this graph")
        for op_id, devices in self.placement.items():
            where = f"placement.{op_id}"
            if not devices:
                raise PlanError("no devices", file=file, field=where,
                                fix="place the op on at least one device")
            if len(set(devices)) != len(devices):
                raise PlanError(f"device listed twice in {devices}", file=file, field=where)
            for d in devices:
                if d not in cluster:
                    raise PlanError(f"unknown device {d!r}", file=file, field=where,
                                    fix=f"use devices of cluster {cluster.name!r}: "
                                    f"{', '.join(cluster.names[:8])}"
                                    f"{'…' if len(cluster) > 8 else ''}")
        for label, members in graph.colocation_groups().items():
            first = sorted(self.placement[members[0]])
            for op_id in members[1:]:
                if sorted(self.placement[op_id]) != first:
                    raise PlanError(
                        f"ops {members[0]!r} and {op_id!r} share colocate group {label!r} "
                        "but are placed apart", file=file, field=f"placement.{op_id}",
                        fix="place every op of a colocate group on the same devices")
        return self

    def expand(self, coarse: "Graph") -> "Plan":
        """Turn a plan over a coarsened graph into one over the original ops."""
        placement = {}
        for group, members in coarse.subgraph_members().items():
            for op_id in members:
                placement[op_id] = list(self.placement[group])
        return Plan(placement, self.microbatches, self.schedule, self.method,
                    None, self.cluster, dict(self.predicted), dict(self.extra))

    # --- files ------------------------------------------------------------
    def to_dict(self) -> dict:
        data = {"format": FORMAT, "graph": self.graph, "cluster": self.cluster,
                "method": self.method,
                "placement": {k: list(v) for k, v in self.placement.items()},
                "microbatches": self.microbatches, "schedule": self.schedule,
                "predicted": self.predicted}
        data.update(self.extra)
        return data

    def save(self, path: PathLike) -> None:
        """Write ``placer.plan/v1`` JSON atomically."""
        atomic_write_text(path, dump_json(self.to_dict()))

    @classmethod
    def load(cls, path: PathLike) -> "Plan":
        """Read a ``placer.plan/v1`` JSON file."""
        data = load_document(path, PlanError)
        return cls.from_dict(data, file=str(path))

    @classmethod
    def from_dict(cls, data: dict, *, file: str | None = None) -> "Plan":
        """Build a plan from a parsed ``placer.plan/v1`` document."""
        return wrap_errors(lambda: cls._from_dict(data, file), file)

    @classmethod
    def _from_dict(cls, data: dict, file: str | None) -> "Plan":
        top = Fields(data, "", file, PlanError)
        check_format(top, FORMAT)
        placement_raw = top.mapping("placement")
        placement = {}
        for op_id, devices in placement_raw.data.items():
            if isinstance(devices, str):
                devices = [devices]
            if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
                placement_raw.fail(str(op_id), f"expected a list of device names, got {devices!r}")
            placement[str(op_id)] = list(devices)
        schedule = top.string("schedule", "1f1b")
        if schedule not in SCHEDULES:
            top.fail("schedule", f"unknown schedule {schedule!r}",
                     fix=f"use one of: {', '.join(SCHEDULES)}")
        fingerprints = {}
        for key in ("graph", "cluster"):
            value = top.get(key)
            if value is not None and not isinstance(value, str):
                top.fail(key, f"expected a sha256 string, got {value!r}")
            fingerprints[key] = value
        predicted = top.get("predicted", {})
        if not isinstance(predicted, dict):
            top.fail("predicted", f"expected a mapping, got {predicted!r}")
        return cls(placement=placement,
                   microbatches=top.number("microbatches", 1, integer=True, positive=True),
                   schedule=schedule, method=top.string("method", "manual"),
                   graph=fingerprints["graph"], cluster=fingerprints["cluster"],
                   predicted=predicted,
                   extra=top.extras({"format", "graph", "cluster", "method", "placement",
                                     "microbatches", "schedule", "predicted"}))

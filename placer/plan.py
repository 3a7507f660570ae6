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

from ._io import (MAX_DEVICES, MAX_MICROBATCHES, MAX_OPS, Fields, PathLike, short_repr,
                  atomic_write_text, check_format, documented_keys, dump_json, load_document,
                  wrap_errors)
from .errors import PlanError

if TYPE_CHECKING:
    from .cluster import Cluster
    from .graph import Graph

FORMAT = "placer.plan/v1"


class Placement(dict):
    """A plan's ``op -> [devices]`` mapping: a dict that counts its own
    edits (``version``), so cost models can reuse what they derived from it
    until it changes. Replacing or removing an op's entry is an edit;
    changing a device list in place is not (give the op a new list).

    >>> p = Placement({"a": ["gpu0"]}); v = p.version
    >>> p["a"] = ["gpu1"]; p.version > v
    True
    """

    version = 0     # a class default: unpickling sets items before attributes

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.version = 0

    def _edited(self) -> None:
        self.version = self.version + 1

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._edited()

    def __delitem__(self, key):
        super().__delitem__(key)
        self._edited()

    def __ior__(self, other):
        super().__ior__(other)
        self._edited()
        return self

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self._edited()

    def pop(self, *args):
        self._edited()
        return super().pop(*args)

    def popitem(self):
        self._edited()
        return super().popitem()

    def clear(self):
        super().clear()
        self._edited()

    def setdefault(self, key, default=None):
        self._edited()
        return super().setdefault(key, default)


SCHEDULES = ("gpipe", "1f1b")


@dataclass
class Plan:
    """Placement of every op on a list of devices, plus the pipeline settings.

    ``graph`` and ``cluster`` are the fingerprints of what the plan was made
    for (None when unknown); ``predicted`` holds the cost model's figures.

    >>> p = Plan({"embed": ["a0"], "block": ["a0", "a1"], "head": ["b0"]}, microbatches=4)
    >>> p.schedule, p.method, p.devices_of("block")
    ('1f1b', 'manual', ['a0', 'a1'])
    """

    placement: dict[str, list[str]]
    microbatches: int = 1
    schedule: str = "1f1b"
    method: str = "manual"
    graph: str | None = None
    cluster: str | None = None
    predicted: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    #: data-parallel gradient all-reduce: ``{"bucket_bytes": B, "overlap":
    #: bool}`` (either optional); None: the cost model's and runtime's
    #: defaults (see :data:`ALLREDUCE_KEYS`)
    allreduce: dict | None = None

    def __setattr__(self, name, value):
        # every placement, given or assigned later, counts its edits
        if name == "placement" and not isinstance(value, Placement) \
                and isinstance(value, dict):
            value = Placement(value)
        super().__setattr__(name, value)

    def devices_of(self, op_id: str) -> list[str]:
        """The devices that run ``op_id`` (several: data-parallel); see :class:`Plan`."""
        return self.placement[op_id]

    def devices_used(self) -> set[str]:
        """Every device that runs at least one op."""
        return {d for devices in self.placement.values() for d in devices}

    def bind(self, graph: "Graph", cluster: "Cluster") -> "Plan":
        """Record the fingerprints of ``graph`` and ``cluster``; returns self.

        >>> from placer import Cluster, Graph, Op
        >>> g, c = Graph("g", [Op("mm", flops=1e9)]), Cluster.preset("two-sites")
        >>> p = Plan({"mm": ["a0"]}).bind(g, c)
        >>> p.graph == g.fingerprint() and p.cluster == c.fingerprint()
        True
        """
        self.graph = graph.fingerprint()
        self.cluster = cluster.fingerprint()
        return self

    def validate(self, graph: "Graph", cluster: "Cluster", *,
                 check_fingerprints: bool = True, file: str | None = None) -> "Plan":
        """Check the plan fits ``graph`` and ``cluster``: every op exactly once,
        known devices, non-empty device lists without repeats, colocation
        kept, fingerprints equal. Raises :class:`PlanError`; returns self.

        >>> from placer import Cluster, Graph, Op
        >>> g, c = Graph("g", [Op("x"), Op("y")]), Cluster.preset("two-sites")
        >>> Plan({"x": ["a0"], "y": ["b0", "b1"]}).validate(g, c).method
        'manual'
        >>> Plan({"x": ["a0"], "y": ["gpu9"]}).validate(g, c)
        Traceback (most recent call last):
        ...
        placer.errors.PlanError: placement.y: unknown device 'gpu9' (fix: ...)
        """
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
        """Turn a plan over a coarsened graph into one over the original ops.

        >>> from placer import Edge, Graph, Op
        >>> g = Graph("chain", [Op(f"op{i}", flops=1e6) for i in range(4)],
        ...           [Edge(f"op{i}", f"op{i + 1}", 8) for i in range(3)])
        >>> coarse = g.coarsen(2)
        >>> first, second = coarse.ids
        >>> fine = Plan({first: ["a0"], second: ["b0"]}).expand(coarse)
        >>> sorted(fine.placement) == g.ids, sorted(fine.devices_used())
        (True, ['a0', 'b0'])
        """
        placement: dict = {}
        for group, members in coarse.subgraph_members().items():
            # one list per group, shared by its ops (lists are replaced, never
            # edited in place: see Placement); 3x faster on 10,000 ops
            placement.update(dict.fromkeys(members, list(self.placement[group])))
        return Plan(placement, self.microbatches, self.schedule, self.method,
                    None, self.cluster, dict(self.predicted), dict(self.extra),
                    dict(self.allreduce) if self.allreduce else None)

    # --- files ------------------------------------------------------------
    def to_dict(self) -> dict:
        """The plan as a ``placer.plan/v1`` document (see :meth:`from_dict`).

        >>> Plan({"x": ["a0"]}, microbatches=2).to_dict()["placement"]
        {'x': ['a0']}
        """
        data = {"format": FORMAT, "graph": self.graph, "cluster": self.cluster,
                "method": self.method,
                "placement": {k: list(v) for k, v in self.placement.items()},
                "microbatches": self.microbatches, "schedule": self.schedule,
                "predicted": self.predicted}
        if self.allreduce:
            data["allreduce"] = dict(self.allreduce)
        data.update(self.extra)
        return data

    def save(self, path: PathLike) -> None:
        """Write ``placer.plan/v1`` JSON atomically.

        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "plan.json"
        >>> Plan({"x": ["a0"], "y": ["b0", "b1"]}, microbatches=8, schedule="gpipe").save(path)
        >>> back = Plan.load(path)
        >>> back.placement["y"], back.microbatches, back.schedule
        (['b0', 'b1'], 8, 'gpipe')
        """
        atomic_write_text(path, dump_json(self.to_dict()))

    @classmethod
    def load(cls, path: PathLike, *, strict: bool | None = None) -> "Plan":
        """Read a ``placer.plan/v1`` JSON file; see :meth:`save` for an example.
        Unknown keys are warned about, or refused when ``strict``."""
        data = load_document(path, PlanError)
        return cls.from_dict(data, file=str(path), strict=strict)

    @classmethod
    def from_dict(cls, data: dict, *, file: str | None = None,
                  strict: bool | None = None) -> "Plan":
        """Build a plan from a parsed ``placer.plan/v1`` document (a single
        device may be written as a string).

        >>> p = Plan.from_dict({"format": "placer.plan/v1",
        ...                     "placement": {"x": "a0", "y": ["a0", "a1"]}})
        >>> p.placement, p.microbatches, p.schedule
        ({'x': ['a0'], 'y': ['a0', 'a1']}, 1, '1f1b')
        """
        return wrap_errors(lambda: cls._from_dict(data, file), file, strict)

    @classmethod
    def _from_dict(cls, data: dict, file: str | None) -> "Plan":
        top = Fields(data, "", file, PlanError)
        check_format(top, FORMAT)
        placement_raw = top.mapping("placement")
        placement = {}
        if len(placement_raw.data) > MAX_OPS:
            top.fail("placement", f"{len(placement_raw.data):,} ops, over the limit of "
                     f"{MAX_OPS:,}", fix="check that this is the right file")
        for op_id, devices in placement_raw.data.items():
            if isinstance(devices, str):
                devices = [devices]
            if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
                placement_raw.fail(str(op_id), "expected a list of device names, got "
                                   f"{short_repr(devices)}")
            placement_raw.limit(str(op_id), devices, MAX_DEVICES, "devices")
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
                   microbatches=top.count("microbatches", MAX_MICROBATCHES, 1),
                   schedule=schedule, method=top.string("method", "manual"),
                   graph=fingerprints["graph"], cluster=fingerprints["cluster"],
                   predicted=predicted,
                   extra=top.extras({"format", "graph", "cluster", "method", "placement",
                                     "microbatches", "schedule", "predicted", "allreduce"},
                                    documented_keys("plan")),
                   allreduce=_allreduce(top))


#: keys of a plan's optional ``allreduce`` block: ``bucket_bytes`` (gradients
#: are all-reduced in buckets of about this many bytes; one bucket per group
#: when it is at least the group's gradients) and ``overlap`` (a bucket
#: starts as soon as its gradients are ready, during the backward)
ALLREDUCE_KEYS = ("bucket_bytes", "overlap")


def _allreduce(top) -> dict | None:
    if not top.has("allreduce"):
        return None
    block = top.mapping("allreduce")
    if not isinstance(block.data, dict):
        top.fail("allreduce", f"expected a mapping, got {block.data!r}",
                 fix="write e.g. {\"bucket_bytes\": 2.5e7, \"overlap\": true}")
    for key in block.data:
        if key not in ALLREDUCE_KEYS:
            block.fail(str(key), "unknown key", fix=f"use {' or '.join(ALLREDUCE_KEYS)}")
    out = {}
    if block.has("bucket_bytes"):
        out["bucket_bytes"] = block.number("bucket_bytes", positive=True, unit="bytes")
    if block.has("overlap"):
        if not isinstance(block.data["overlap"], bool):
            block.fail("overlap", f"expected true or false, got {block.data['overlap']!r}")
        out["overlap"] = block.data["overlap"]
    return out or None

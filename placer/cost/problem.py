"""The problem every cost model and search sees, compiled to numpy arrays.

A :class:`Problem` joins a graph, a cluster, the objective and the modelling
options. It precomputes, once, arrays of the graph in topological order
(``problem.ids``) and of the cluster, so that estimating many plans is fast.

Plans are turned into a :class:`Compiled` form: one *group* id per op, where
groups ``0 .. D-1`` are the single devices and higher ids are data-parallel
device sets listed in ``groups``.

>>> from placer import Graph, Op, Edge, Cluster, Device, Plan
>>> g = Graph("t", [Op("a", flops=1e9), Op("b", flops=1e9)], [Edge("a", "b", 1e6)])
>>> c = Cluster.from_rules("c", [Device("x", 1e12, 1e10), Device("y", 1e12, 1e10)],
...                        default=(1e9, 0.0))
>>> p = Problem(g, c)
>>> p.compile(Plan({"a": ["x"], "b": ["y"]})).op_group.tolist()
[0, 1]
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..cache import Cache
from ..errors import PlanError
from ..groups import GroupTable
from ..plan import SCHEDULES
from .options import CostOptions

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..cluster import Cluster
    from ..graph import Graph
    from ..plan import Plan

#: Objective value of an infeasible plan is at least this (times 1 + the
#: largest relative memory excess, see :func:`infeasible_objective`), so any
#: feasible plan ranks better and infeasible ones still rank by how far over
#: they are.
INFEASIBLE = 1e9

#: Infeasible plans are ranked by their largest relative memory excess to
#: this resolution (a thousandth of a device's memory), then by step time:
#: where nothing fits, many plans overflow the same device by the same
#: amount (it holds an op too big for any device) or by amounts the memory
#: model cannot tell apart, and without the step time the search would
#: pick among them at random (step times 50x apart on the same excess).
EXCESS_RESOLUTION = 1e-3


def infeasible_objective(excess_fraction, step_time):
    """Objective of infeasible plans (scalars or arrays): ``INFEASIBLE *
    (1 + excess)``, the largest relative memory excess rounded up to
    :data:`EXCESS_RESOLUTION`, plus the step time (capped below one step of
    excess): less excess always ranks better, equal excess ranks by speed."""
    excess = np.maximum(excess_fraction, 0.0)
    excess = np.ceil(excess / EXCESS_RESOLUTION) * EXCESS_RESOLUTION
    cap = 0.5 * INFEASIBLE * EXCESS_RESOLUTION
    step = np.clip(np.nan_to_num(step_time, nan=cap, posinf=cap), 0.0, cap)
    return INFEASIBLE * (1.0 + excess) + step

_FIRST = itemgetter(0)


@dataclass
class Times:
    """Per-op compute seconds for the whole traced batch on one device, less
    the launch overhead, by *device class* (devices that share them):
    ``forward[i, cls[d]]`` and ``backward[i, cls[d]]`` for op ``ids[i]`` on
    device ``d``. A replica running a fraction f of the batch takes
    ``op_overhead + f * forward`` (the form :func:`placer.runtime.profile.
    calibrated_graph` assumes)."""

    cls: np.ndarray
    forward: np.ndarray
    backward: np.ndarray


@dataclass
class Compiled:
    """A plan as arrays: ``op_group[i]`` is the group of ``problem.ids[i]``;
    ``groups[g]`` the device indices of group ``g`` (``g < D``: device g)."""

    op_group: np.ndarray
    groups: list
    microbatches: int
    schedule: str
    #: the plan's all-reduce bucket size and overlap (None: the problem's)
    bucket_bytes: float | None = None
    overlap: bool | None = None


class Problem:
    """A graph on a cluster and the cost-model options (a
    :class:`~placer.cost.options.CostOptions`, documented field by field
    there): ``Problem(graph, cluster, recompute=True)`` or
    ``Problem(graph, cluster, options=CostOptions(recompute=True))``;
    keywords given beside ``options`` replace its fields. ``problem.options``
    holds them and each is an attribute too (``problem.recompute``).

    A problem does not change after construction: its arrays, its options
    and what modules keep in ``problem.cache`` (:mod:`placer.cache`) stay
    valid while it lives. For other options, graph or cluster make another
    with :meth:`replace` (it starts with an empty cache).

    Recomputation trades memory for time; the models see it through the
    problem (GPT-1.3B on one A100 of 80 GB, Adam):

    >>> import placer
    >>> from placer.cost import Problem, get_cost_model
    >>> g, c = placer.datasets.graph("gpt-1.3b.module"), placer.Cluster.preset("a100x8")
    >>> plan = placer.Plan({op: ["gpu0"] for op in g.ids}, microbatches=4)
    >>> sim = get_cost_model("simulator")
    >>> keep, redo = (sim.estimate(Problem(g, c, recompute=r), plan) for r in (False, True))
    >>> redo.peak_memory["gpu0"] < keep.peak_memory["gpu0"], redo.step_time > keep.step_time
    (True, True)
    """

    def __init__(self, graph: "Graph", cluster: "Cluster", *,
                 options: "CostOptions | Mapping | None" = None, **keywords):
        if options is None:
            options = CostOptions(**keywords)
        elif isinstance(options, CostOptions):
            options = options.replace(**keywords)
        else:
            options = CostOptions(**{**options, **keywords})
        #: the cost-model options (each also an attribute of the problem)
        self.options: CostOptions = options
        #: what modules derive from this problem, by ``"<module>.<what>"``
        #: key (see :mod:`placer.cache`)
        self.cache = Cache()
        self.graph = graph
        self.cluster = cluster
        self.training = graph.training
        self._build_graph_arrays()
        self._build_cluster_arrays()
        self.times = measured_times(self)
        self._plan_arrays = _PlanArrays()

    def replace(self, graph: "Graph | None" = None, cluster: "Cluster | None" = None,
                **options) -> "Problem":
        """A problem like this one with another graph, cluster or options
        (the others kept), e.g. ``problem.replace(coarse_graph)`` or
        ``problem.replace(recompute=True)``."""
        return Problem(self.graph if graph is None else graph,
                       self.cluster if cluster is None else cluster,
                       options=self.options.replace(**options))

    def __repr__(self) -> str:
        return (f"Problem(graph={self.graph.name!r}, cluster={self.cluster.name!r}, "
                f"objective={self.objective!r})")

    # --- precomputed arrays ---------------------------------------------------
    def _build_graph_arrays(self) -> None:
        g = self.graph
        #: op ids in topological order; every per-op array is indexed like this.
        self.ids: list[str] = g.topological_order()
        self.index = {op_id: i for i, op_id in enumerate(self.ids)}
        self._getter = itemgetter(*self.ids) if len(self.ids) > 1 else None
        ops = [g.op(i) for i in self.ids]
        self.n_ops = len(ops)
        self.flops = np.array([o.flops for o in ops], dtype=float)
        self.bwd_flops = np.array([o.bwd_flops for o in ops], dtype=float)
        self.param_bytes = np.array([o.param_bytes for o in ops], dtype=float)
        self.output_bytes = np.array([o.output_bytes for o in ops], dtype=float)
        #: (n_ops, 2) forward and backward FLOPs of the training loss inside
        #: each op's figures (see the class doc); zeros for most ops
        self.loss_flops = _loss_flops(g, ops, self.flops, self.bwd_flops) if self.training \
            else np.zeros((len(ops), 2))
        self.has_loss = bool(self.loss_flops.any())
        #: (n_ops, 2) the part of ``loss_flops`` each microbatch pays whole
        self.loss_fixed = _loss_flops(g, ops, self.loss_flops[:, 0], self.loss_flops[:, 1],
                                      key="loss_fixed") if self.has_loss \
            else np.zeros((len(ops), 2))
        #: (n_ops, 2) forward and backward FLOPs of each op that every
        #: microbatch and replica pays whole (see the class doc); zeros
        #: unless the graph was calibrated
        self.fixed_flops = _loss_flops(g, ops, self.flops, self.bwd_flops, key="fixed_flops")
        if not self.training:
            self.fixed_flops[:, 1] = 0.0
        self.has_fixed = bool(self.fixed_flops.any())
        edges = g.edges
        self.edge_src = np.array([self.index[e.src] for e in edges], dtype=np.int64)
        self.edge_dst = np.array([self.index[e.dst] for e in edges], dtype=np.int64)
        self.edge_bytes = np.array([e.bytes for e in edges], dtype=float)
        #: per edge: the part of its bytes every microbatch sends whole (an
        #: edge's ``fixed_bytes``, see :mod:`placer.runtime.scaling`); the
        #: rest is split over the microbatches. Zeros for most graphs.
        self.edge_fixed = _edge_fixed(g, edges, self.edge_bytes)
        self.has_edge_fixed = bool(self.edge_fixed.any())
        self.n_edges = len(edges)
        #: per op: whether its output requires a gradient, which a backward
        #: sends back to it from other devices (see output_gradients)
        self.output_grad = output_gradients(ops, self.edge_src, self.edge_dst) \
            if self.training else np.zeros(self.n_ops, dtype=bool)
        #: per op: whether it mixes the batch (an op's ``mixes_batch``, see
        #: :mod:`placer.runtime.scaling`): a data-parallel piece holding one
        #: runs unsharded (:meth:`as_run`). False for most graphs.
        self.mixing = np.array([bool(o.extra.get("mixes_batch")) for o in ops], dtype=bool)
        self.has_mixing = bool(self.mixing.any())
        in_bytes = np.bincount(self.edge_dst, self.edge_bytes, minlength=self.n_ops) \
            if self.n_edges else np.zeros(self.n_ops)
        # Transient memory while an op runs: its inputs and its output (and, in
        # backward, their gradients, which replace them).
        self.workspace_bytes = in_bytes + self.output_bytes
        # Edges sorted by (src, dst), so edges leaving one op sit together.
        order = np.lexsort((self.edge_dst, self.edge_src)) if self.n_edges else \
            np.zeros(0, dtype=np.int64)
        self.edge_order = order

    def _build_cluster_arrays(self) -> None:
        c = self.cluster
        self.devices: list[str] = c.names
        self.n_devices = len(self.devices)
        eff = np.array([d.efficiency if d.efficiency is not None else self.default_efficiency
                        for d in c.devices], dtype=float)
        #: sustained FLOP/s per device
        self.rate = np.array([d.flops for d in c.devices], dtype=float) * eff
        self.memory = np.array([d.memory for d in c.devices], dtype=float)
        sites = c.sites()
        self.site_names = list(sites)
        self.site = np.array([self.site_names.index(d.site) for d in c.devices], dtype=np.int64)
        self.bandwidth = np.asarray(c.bandwidth, dtype=float)
        self.latency = np.asarray(c.latency, dtype=float)
        off = self.bandwidth.copy()
        np.fill_diagonal(off, 0.0)
        fastest = off.max(axis=1) if self.n_devices > 1 else np.full(1, np.inf)
        nic = []
        for i, d in enumerate(c.devices):
            if d.nic_bandwidth is not None:
                nic.append(float(d.nic_bandwidth))
            elif self.nic == "max_link":
                nic.append(float(fastest[i]) if fastest[i] > 0 else np.inf)
            else:
                nic.append(np.inf)
        self.nic_bandwidth = np.array(nic, dtype=float)
        self.device_index = {name: i for i, name in enumerate(self.devices)}
        self._base_type = np.int16 if self.n_devices < 2 ** 15 else np.int32

    # --- plans ------------------------------------------------------------
    def compile(self, plan: "Plan", groups: GroupTable | None = None) -> Compiled:
        """``plan`` as a :class:`Compiled` (group per op). ``groups``, a
        :class:`~placer.groups.GroupTable` of this problem's devices, numbers
        the data-parallel sets and is extended in place, so a batch of plans
        can share one group table."""
        _check_pipeline(plan)
        if groups is None:
            groups = GroupTable(self.n_devices)
        base, multi, keys, inverse = self._devices_of(plan, cache=False)
        op_group = base.astype(np.int64)
        if len(multi):
            op_group[multi] = np.array(groups.ids(keys))[inverse]
        ar = getattr(plan, "allreduce", None) or {}
        return Compiled(op_group, groups.sets(), plan.microbatches, plan.schedule,
                        ar.get("bucket_bytes"), ar.get("overlap"))

    def compile_many(self, plans: Sequence["Plan"]):
        """Plans as one ``(B, n_ops)`` int array of group ids over one shared
        group table (a :class:`~placer.groups.GroupTable`'s sets), with their
        microbatches and schedules: ``(assignments, groups, microbatches,
        schedules)``. The ids are int16 while the table has fewer than 2**15
        groups (int32 beyond).

        A plan's device indices are kept (per problem, while the plan lives)
        and reused while ``plan.placement`` is the same, unedited
        :class:`~placer.plan.Placement` (or, for a plain dict, holds the same
        list objects): replacing an op's list is seen, editing a list in
        place after an estimate is not."""
        for plan in plans:
            _check_pipeline(plan)
        table = GroupTable(self.n_devices)
        compiled = list(map(self._devices_of, plans))
        dp = [i for i, c in enumerate(compiled) if len(c[1])]
        if dp:
            # group ids of every plan's distinct device sets
            gids = np.array(table.ids(k for i in dp for k in compiled[i][2]))
        id_type = np.int16 if len(table) < 2 ** 15 else np.int32
        A = np.stack([c[0] for c in compiled]).astype(id_type, copy=False) if compiled else \
            np.zeros((0, self.n_ops), dtype=id_type)
        at = 0
        for i in dp:                # row by row: cheaper than gathering all first
            _, multi, keys, inverse = compiled[i]
            A[i, multi] = gids[at:at + len(keys)][inverse]
            at += len(keys)
        m = np.array([plan.microbatches for plan in plans], dtype=np.int64)
        schedules = [plan.schedule for plan in plans]
        return A, table.sets(), m, schedules

    def _devices_of(self, plan: "Plan", cache: bool = True):
        """``(base, multi, keys, inverse)`` of a plan: each op's first device
        index; the positions of ops on several devices, their distinct sorted
        device-index tuples and which tuple each one has. Cached per plan
        (see :meth:`compile_many`) unless ``cache`` is false."""
        placement = plan.placement
        version = getattr(placement, "version", None)
        if cache:
            hit = self._plan_arrays.get(plan, placement, version)
            if hit is not None:
                return hit
        keys, values = list(placement), list(placement.values())
        if keys != self.ids:        # not already in topological order
            try:
                values = self._getter(placement) if self._getter is not None else \
                    tuple(placement[i] for i in self.ids)
            except KeyError as exc:
                raise PlanError(f"op {exc.args[0]!r} not placed", field="placement",
                                fix="every op of the graph must appear exactly once") from None
            arrays = self._device_arrays(values)
            values = list(placement.values())
        else:
            arrays = self._device_arrays(values)
        return self._plan_arrays.put(plan, keys, values, arrays, placement, version) \
            if cache else arrays

    def _device_arrays(self, values):
        n = self.n_ops
        dev = self.device_index
        try:
            # one dict lookup per op, at C speed, on each op's first device;
            # only ops on several devices (data-parallel) go through tuples
            base = np.fromiter(map(dev.__getitem__, map(_FIRST, values)),
                               dtype=self._base_type, count=n)
            keys: list = []
            lens = np.fromiter(map(len, values), dtype=np.int64, count=n)
            multi = np.flatnonzero(lens != 1)
            inverse = np.zeros(0, dtype=np.int64)
            if len(multi):
                lists = list(map(tuple, map(values.__getitem__, multi.tolist())))
                memo = dict.fromkeys(lists)
                for devices in memo:
                    key = tuple(sorted(dev[d] for d in devices))
                    if len(set(key)) != len(key) or not key:
                        raise PlanError(f"bad device list {list(devices)!r}",
                                        field="placement")
                    memo[devices] = len(keys)
                    keys.append(key)
                inverse = np.array(list(map(memo.__getitem__, lists)), dtype=np.int64)
        except (KeyError, IndexError):
            bad = next((d for v in values for d in (v or [None]) if d not in dev), None)
            if bad is None:
                raise PlanError(f"bad device list {[]!r}", field="placement") from None
            raise PlanError(f"unknown device {bad!r}", field="placement",
                            fix=f"use devices of cluster {self.cluster.name!r}") from None
        base.flags.writeable = False
        return base, multi, keys, inverse

    def compile_array(self, assignment, groups: Sequence[Sequence[int]] = (), *,
                      microbatches: int = 1, schedule: str = "1f1b") -> Compiled:
        """A :class:`Compiled` from an int array of group ids (indexed like
        ``ids``); ids ``>= D`` refer to ``groups[id - D]`` (device indices)."""
        table = [(i,) for i in range(self.n_devices)] + [tuple(sorted(g)) for g in groups]
        return Compiled(np.asarray(assignment, dtype=np.int64), table, int(microbatches),
                        schedule)

    def to_plan(self, compiled: Compiled, method: str = "manual") -> "Plan":
        """The :class:`placer.Plan` of a compiled one."""
        from ..plan import Plan
        names = self.devices
        placement = {op_id: [names[d] for d in compiled.groups[g]]
                     for op_id, g in zip(self.ids, compiled.op_group.tolist())}
        ar = {k: v for k, v in (("bucket_bytes", compiled.bucket_bytes),
                                ("overlap", compiled.overlap)) if v is not None}
        return Plan(placement, compiled.microbatches, compiled.schedule, method,
                    allreduce=ar or None)

    def as_run(self, assignments: np.ndarray, groups: list) -> tuple:
        """Plans as group-id arrays ((B, n_ops) or (n_ops,) over the group
        table ``groups``) as the runtime runs them: a data-parallel piece
        holding an op that mixes the batch runs whole on the group's first
        device (:func:`placer.pieces.unshard_mixing`). Both cost models
        estimate plans so. Returns ``(assignments, groups)``, the same
        objects when nothing changes."""
        if not self.has_mixing:
            return assignments, groups
        from ..pieces import unshard_mixing
        return unshard_mixing(assignments, groups, self.mixing, self.edge_src, self.edge_dst)

    def as_run_compiled(self, c: Compiled) -> Compiled:
        """:meth:`as_run` of a compiled plan (``c`` itself when nothing changes)."""
        g, table = self.as_run(c.op_group, c.groups)
        return c if g is c.op_group else replace(c, op_group=g, groups=table)

    # --- shared pieces of both models ---------------------------------------
    def member_matrix(self, groups: list) -> np.ndarray:
        """(G, D) matrix: 1/|g| where device d is in group g, else 0."""
        m = np.zeros((len(groups), self.n_devices))
        for gid, members in enumerate(groups):
            m[gid, list(members)] = 1.0 / len(members)
        return m

    def pair_traffic(self, src: tuple, dst: tuple) -> np.ndarray:
        """(D, D) fractions of a tensor sent between devices when it goes from
        data-parallel group ``src`` to group ``dst``: replica a of src holds
        the a-th slice of the batch, replica b of dst needs the b-th slice."""
        key = (src, dst)
        cache = self.cache.get_or_build("problem.pair_traffic", dict)
        hit = cache.get(key)
        if hit is not None:
            return hit
        if len(cache) > 4096:
            cache.clear()
        out = np.zeros((self.n_devices, self.n_devices))
        p, q = len(src), len(dst)
        for a, da in enumerate(src):
            for b, db in enumerate(dst):
                if da != db:
                    overlap = min((a + 1) / p, (b + 1) / q) - max(a / p, b / q)
                    if overlap > 1e-12:
                        out[da, db] += overlap
        cache[key] = out
        return out

    def objective_value(self, step_time: float, peak_fraction: float,
                        excess_fraction: float) -> float:
        """The objective of one estimate (lower is better)."""
        if excess_fraction > 0:
            return float(infeasible_objective(excess_fraction, step_time))
        if self.objective == "step_time":
            return step_time
        if self.objective == "throughput":
            return -1.0 / step_time if step_time > 0 else -np.inf
        return peak_fraction


# each option reads as an attribute of the problem too (problem.recompute)
for _name in CostOptions.__dataclass_fields__:
    setattr(Problem, _name, property(attrgetter(f"options.{_name}"),
                                     doc=f"``options.{_name}`` (see :class:`CostOptions`)"))
del _name


def _check_pipeline(plan: "Plan") -> None:
    if plan.schedule not in SCHEDULES:
        raise PlanError(f"unknown schedule {plan.schedule!r}", field="schedule",
                        fix=f"use one of: {', '.join(SCHEDULES)}")
    if not isinstance(plan.microbatches, int) or plan.microbatches < 1:
        raise PlanError(f"microbatches must be a whole number >= 1, got "
                        f"{plan.microbatches!r}", field="microbatches")


class _PlanArrays:
    """Compiled device arrays of live plans, keyed by the plan object and
    valid while its placement holds the same keys and the same device-list
    objects in the same order (two sequential scans at C speed, cheaper than
    looking every op up). An entry goes when its plan is garbage collected;
    at most ``limit`` ops' worth are kept."""

    def __init__(self, limit: int = 2_000_000):
        self.entries: dict[int, tuple] = {}
        self.ops = 0
        self.limit = limit

    def get(self, plan, placement, version):
        """The cached arrays of ``plan`` if its placement is unchanged: the
        same :class:`~placer.plan.Placement` at the same ``version`` (O(1)),
        or for a plain dict (``version`` None) the same keys and list
        objects (two scans)."""
        entry = self.entries.get(id(plan))
        if entry is None or entry[0]() is not plan:
            return None
        if version is not None:
            return entry[3] if entry[4] is placement and entry[5] == version else None
        same = list(placement.values()) == entry[2] and list(placement) == entry[1]
        return entry[3] if same else None

    def put(self, plan, keys: list, values: list, arrays, placement=None, version=None):
        """Remember ``arrays`` for ``plan`` (until it dies) and which
        placement object at which ``version`` they came from; returns them."""
        key = id(plan)
        size = len(keys)
        if self.ops + size > self.limit:
            self.entries.clear()
            self.ops = 0
        try:
            ref = weakref.ref(plan, lambda _, k=key, c=self: c.drop(k))
        except TypeError:           # not weak-referenceable: don't cache
            return arrays
        self.drop(key)
        self.entries[key] = (ref, keys, values, arrays, placement, version)
        self.ops += size
        return arrays

    def __getstate__(self):
        # a copy of the problem starts empty: entries hold weak references
        return {"limit": self.limit}

    def __setstate__(self, state):
        self.__init__(state["limit"])

    def __deepcopy__(self, memo):
        return _PlanArrays(self.limit)

    def drop(self, key: int) -> None:
        """Forget the entry of ``id(plan)`` (its plan was garbage collected)."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.ops -= len(entry[1])


def _measured_entry(measured, name: str, kind):
    """The ``{"fwd", "bwd"}`` figures of one op on device ``name`` of kind
    ``kind``: keyed by the device's name, else by its kind, else one figure
    for every device (a dict with "fwd", or a number: forward seconds)."""
    if measured is None:
        return None
    if isinstance(measured, (int, float)):
        return {"fwd": float(measured)}
    if not isinstance(measured, dict):
        return None
    if "fwd" in measured:
        return measured
    entry = measured.get(name)
    if entry is None and kind is not None:
        entry = measured.get(kind)
    if isinstance(entry, (int, float)):
        return {"fwd": float(entry)}
    return entry if isinstance(entry, dict) and "fwd" in entry else None


def _loss_flops(graph, ops, flops, bwd_flops, key: str = "loss_flops") -> np.ndarray:
    """The ops' ``loss_flops`` (or another node ``key`` of the same form:
    [forward, backward], at most ``flops``/``bwd_flops``) as an (n, 2)
    array; a malformed entry is a GraphError naming it."""
    from ..errors import GraphError
    out = np.zeros((len(ops), 2))
    for i, op in enumerate(ops):
        value = op.extra.get(key)
        if value is None:
            continue
        try:
            pair = [float(v) for v in value]
        except (TypeError, ValueError):
            pair = []
        if len(pair) != 2 or not all(np.isfinite(v) and v >= 0 for v in pair):
            raise GraphError(f"graph {graph.name!r}, node {op.id!r}: {key} must be "
                             f"[forward, backward] FLOPs >= 0, got {value!r}",
                             fix="write two numbers, or remove the key")
        out[i] = min(pair[0], flops[i]), min(pair[1], bwd_flops[i])
    return out


def _edge_fixed(graph, edges, edge_bytes) -> np.ndarray:
    """The edges' ``fixed_bytes`` (at most their bytes) as an array; a
    malformed entry is a GraphError naming the edge."""
    from ..errors import GraphError
    out = np.zeros(len(edges))
    for i, e in enumerate(edges):
        value = e.extra.get("fixed_bytes")
        if value is None:
            continue
        try:
            fixed = float(value)
        except (TypeError, ValueError):
            fixed = float("nan")
        if not (np.isfinite(fixed) and fixed >= 0):
            raise GraphError(f"graph {graph.name!r}, edge {e.src!r} -> {e.dst!r}: fixed_bytes "
                             f"must be bytes >= 0, got {value!r}",
                             fix="write a number, or remove the key")
        out[i] = min(fixed, edge_bytes[i])
    return out


def microbatch_edge_bytes(edge_bytes, edge_fixed, m):
    """Each edge's bytes over the whole step when a step runs ``m``
    microbatches: its fixed part is sent whole by every microbatch, so a
    model that sends ``bytes / m`` per microbatch sends ``fixed + (bytes -
    fixed) / m``. ``m`` may be an array broadcasting against the edges."""
    return edge_bytes + edge_fixed * (np.asarray(m, dtype=float) - 1.0)


#: dtypes whose tensors carry gradients
FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}


def output_gradients(ops, edge_src: np.ndarray, edge_dst: np.ndarray) -> np.ndarray:
    """Per op: whether its output requires a gradient, so a backward sends
    one back (a runtime sends none for integer indices, masks, or values
    computed from inputs alone). An op's output requires one when it is of a
    floating dtype (per the graph's ``dtype``, as ``placer.trace`` writes it)
    and the op holds parameters or reads an op's output that requires one;
    an op without ``dtype`` counts as requiring one. ``ops`` in topological
    order, edges as indices into it."""
    n = len(ops)
    preds: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(edge_src.tolist(), edge_dst.tolist()):
        preds[b].append(a)
    grad = np.ones(n, dtype=bool)
    for i, op in enumerate(ops):
        dtype = op.extra.get("dtype")
        if dtype is None:
            continue          # a graph without dtypes (not traced): as before, all do
        names = dtype if isinstance(dtype, (list, tuple)) else [dtype]
        floating = any(str(d).replace("torch.", "") in FLOAT_DTYPES for d in names)
        grad[i] = floating and (op.param_bytes > 0 or any(grad[a] for a in preds[i]))
    return grad


def measured_times(problem: "Problem") -> Times | None:
    """Compute times from the ops' ``extra["measured"]`` (None when no op has
    any), for the simulator and the analytical model alike.

    ``measured`` is what ``placer profile`` writes, ``{device: {"fwd": s,
    "bwd": s, ...}}`` for the traced batch, keyed by a device's name or by a
    device kind (``"A100-80GB"``: every device of that kind), or one figure
    for every device: ``{"fwd": s, "bwd": s}`` or a number (forward seconds).
    A missing backward is the forward scaled like the FLOPs (``bwd_flops /
    flops``, or 2x without FLOPs). A device's ``extra["cpu_share"]`` (the
    share of a core its process gets, from ``placer profile``) divides its
    figures, and the launch overhead ``op_overhead`` is taken out of each
    (it is added per replica), so a measured graph predicts like
    :func:`placer.runtime.profile.calibrated_graph` of it.
    Ops without a figure for a device keep ``flops / rate`` there."""
    g = problem.graph
    entries = [g.op(i).extra.get("measured") for i in problem.ids]
    if not any(e is not None for e in entries):
        return None
    devices = problem.cluster.devices
    keys: set = set()
    for e in entries:
        if isinstance(e, dict) and "fwd" not in e:
            keys.update(e)
    # devices whose figures come from the same keys at the same rate share a class
    classes: dict = {}
    cls = np.empty(problem.n_devices, dtype=np.int64)
    for d, dev in enumerate(devices):
        key = (dev.name if dev.name in keys else None,
               dev.kind if dev.kind in keys else None, float(problem.rate[d]),
               float(dev.extra.get("cpu_share", 1.0)))
        cls[d] = classes.setdefault(key, len(classes))
    K = len(classes)
    fwd = np.empty((problem.n_ops, K))
    bwd = np.empty((problem.n_ops, K))
    ovh = problem.op_overhead
    for (name, kind, rate, share), k in classes.items():
        fwd[:, k] = problem.flops / rate
        bwd[:, k] = problem.bwd_flops / rate
        for i, e in enumerate(entries):
            entry = _measured_entry(e, name, kind) if e is not None else None
            if entry is None:
                continue
            f = float(entry["fwd"]) / share
            if entry.get("bwd") is not None:
                b = float(entry["bwd"]) / share
            else:
                flops = problem.flops[i]
                b = f * (problem.bwd_flops[i] / flops if flops > 0 else 2.0)
            fwd[i, k] = max(0.0, f - ovh)
            bwd[i, k] = max(0.0, b - ovh) if b > 0 else 0.0
    return Times(cls, fwd, bwd)

"""The problem as a heterogeneous graph for torch-geometric.

:func:`encode_problem` turns a :class:`placer.cost.Problem` into a
:class:`ProblemGraph`: a :class:`torch_geometric.data.HeteroData` with two node
types, ``op`` (decision units: ops, or runs of consecutive ops in topological
order when the graph is larger than ``max_units``) and ``dev`` (devices), and
the edge types

- ``(op, flow, op)``: tensors between units (bytes, relative transfer time);
- ``(dev, link, dev)``: every ordered pair of devices (bandwidth, latency,
  same site);
- ``(op, cand, dev)`` and its reverse ``(dev, rcand, op)``: every candidate
  placement (relative compute time, memory share, and whether the current
  placement uses it, which the refinement mode sets).

Every feature is scale free (ratios, logs of ratios, positions), so one model
serves graphs and clusters of any size and kind. Devices carry ordinal
features so that identical devices can still be told apart by a policy that
wants to lay a pipeline over them.

Units also carry what decoding needs: the op -> unit map, memory need per
unit, colocation ties between units and the forward compute per unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch_geometric.data import HeteroData

from placer.cache import Cache

__all__ = ["ProblemGraph", "encode_problem", "chunk_units", "OP_FEATURES", "DEV_FEATURES",
           "FLOW_FEATURES", "LINK_FEATURES", "CAND_FEATURES"]

OP_FEATURES = 20
DEV_FEATURES = 16
FLOW_FEATURES = 3
LINK_FEATURES = 4
CAND_FEATURES = 4


@dataclass
class ProblemGraph:
    """A problem encoded for the policy.

    ``data`` is the :class:`HeteroData`; ``unit_of[i]`` the unit of
    ``problem.ids[i]``; ``tie[u]`` the unit whose device unit ``u`` must take
    (itself unless a colocation group joins it to an earlier unit); ``need``
    the bytes each unit adds to its device's memory, ``memory`` each device's
    capacity, ``work`` each unit's compute (FLOPs), ``rate`` each device's
    sustained FLOP/s; ``flow_*`` the unit-level flow edges (src, dst, bytes);
    ``inv_bandwidth`` (s/byte, 0 on the diagonal) and ``latency`` the links;
    ``workspace`` the largest transient memory of an op of each unit.
    """

    data: HeteroData
    n_units: int
    n_devices: int
    unit_of: np.ndarray
    tie: np.ndarray
    need: np.ndarray
    memory: np.ndarray
    work: np.ndarray
    rate: np.ndarray
    flow_src: np.ndarray
    flow_dst: np.ndarray
    flow_bytes: np.ndarray
    inv_bandwidth: np.ndarray
    latency: np.ndarray
    workspace: np.ndarray
    #: what the model derives from it (see :mod:`placer.cache`)
    cache: Cache = field(default_factory=Cache, repr=False, compare=False)

    def expand(self, unit_devices: np.ndarray) -> np.ndarray:
        """Device per op (``(..., n_ops)``) from device per unit (``(..., U)``)."""
        return np.asarray(unit_devices)[..., self.unit_of]


def chunk_units(problem, max_units: int) -> np.ndarray:
    """Unit of each op (indexed like ``problem.ids``): each op its own unit when
    the graph has at most ``max_units`` ops, else runs of consecutive ops in
    topological order, balanced by compute and count. Runs of a topological
    order never form a cycle, so any placement of units is a valid DAG cut."""
    n = problem.n_ops
    if n <= max_units:
        return np.arange(n, dtype=np.int64)
    work = problem.flops + (problem.bwd_flops if problem.training else 0.0)
    share = work / max(work.sum(), 1e-30) + 1.0 / n  # half by FLOPs, half by count
    cum = np.cumsum(share) - share / 2
    unit = np.minimum((cum / cum[-1] * max_units).astype(np.int64), max_units - 1)
    # renumber to 0..U-1 without gaps (a heavy op may skip a bucket)
    _, unit = np.unique(unit, return_inverse=True)
    return unit.astype(np.int64)


def _log_ratio(x, ref):
    return np.log(np.maximum(x, 1e-30) / max(float(ref), 1e-30))


class _Units(NamedTuple):
    """Per-unit sums: compute (FLOPs), output bytes, op count, memory need."""
    work: np.ndarray
    outs: np.ndarray
    count: np.ndarray
    need: np.ndarray


class _Flows(NamedTuple):
    """Unit-level flow edges: tensors crossing runs, bytes summed per pair."""
    src: np.ndarray
    dst: np.ndarray
    bytes: np.ndarray


class _Paths(NamedTuple):
    """Depth and critical-path levels of each unit on the unit DAG."""
    depth: np.ndarray
    top: np.ndarray     # longest compute path ending before the unit
    bottom: np.ndarray  # longest compute path from the unit to a sink, inclusive
    cp: float           # the critical path's length


class _Scales(NamedTuple):
    """The cluster's links and the reference scales the features divide by."""
    bw: np.ndarray
    lat: np.ndarray
    off: np.ndarray     # off-diagonal mask (every ordered pair of devices)
    mean_rate: float
    mean_bw: float
    mean_lat: float
    total_work: float
    total_need: float
    mean_unit_time: float


def encode_problem(problem, max_units: int = 128, placement: np.ndarray | None = None,
                   activation_factor: float = 1.0) -> ProblemGraph:
    """Encode ``problem`` (at most ``max_units`` decision units).

    ``placement`` (device per unit, optional) marks the current placement on
    the candidate edges, for refinement. ``activation_factor`` is the share of
    a unit's output bytes counted as kept for backward in its memory need.
    """
    unit_of = chunk_units(problem, max_units)
    U = int(unit_of.max()) + 1 if len(unit_of) else 0
    D = problem.n_devices
    units = _unit_sums(problem, unit_of, U, activation_factor)
    flows = _unit_flows(problem, unit_of, U)
    paths = _critical_paths(units.work, flows, U)
    scales = _scales(problem, units, U)
    x_op = _op_features(problem, units, flows, paths, scales, U)
    x_dev = _dev_features(problem, scales, D)
    x_flow = _flow_features(flows, scales, U)
    li, lj = np.nonzero(scales.off)
    x_link = _link_features(problem, scales, li, lj)
    cu = np.repeat(np.arange(U), D)
    cd = np.tile(np.arange(D), U)
    x_cand = _cand_features(problem, units, scales, cu, cd, placement, U, D)

    data = HeteroData()
    f = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
    i = lambda a, b: torch.as_tensor(np.stack([a, b]).astype(np.int64))  # noqa: E731
    data["op"].x = f(x_op)
    data["dev"].x = f(x_dev)
    data["op", "flow", "op"].edge_index = i(flows.src, flows.dst)
    data["op", "flow", "op"].edge_attr = f(x_flow)
    data["dev", "link", "dev"].edge_index = i(li, lj)
    data["dev", "link", "dev"].edge_attr = f(x_link)
    data["op", "cand", "dev"].edge_index = i(cu, cd)
    data["op", "cand", "dev"].edge_attr = f(x_cand)
    data["dev", "rcand", "op"].edge_index = i(cd, cu)
    data["dev", "rcand", "op"].edge_attr = f(x_cand)

    inv_bw = 1.0 / scales.bw
    np.fill_diagonal(inv_bw, 0.0)
    return ProblemGraph(data, U, D, unit_of, _colocation_ties(problem, unit_of, U), units.need,
                        problem.memory.astype(float), units.work, problem.rate.astype(float),
                        flows.src, flows.dst, flows.bytes, inv_bw, scales.lat,
                        _unit_max(unit_of, problem.workspace_bytes, U))


def _unit_sums(problem, unit_of: np.ndarray, U: int, activation_factor: float) -> _Units:
    training = bool(problem.training)
    work_op = problem.flops + (problem.bwd_flops if training else 0.0)
    state_factor = 1.0 + ((problem.gradient_bytes_per_param + problem.optimizer_bytes_per_param)
                          if training else 0.0)
    work = np.bincount(unit_of, work_op, minlength=U)
    params = np.bincount(unit_of, problem.param_bytes, minlength=U) * state_factor
    outs = np.bincount(unit_of, problem.output_bytes, minlength=U)
    count = np.bincount(unit_of, minlength=U).astype(float)
    need = params + activation_factor * outs * (1.0 if training else 0.0)
    return _Units(work, outs, count, need)


def _unit_flows(problem, unit_of: np.ndarray, U: int) -> _Flows:
    us, ud = unit_of[problem.edge_src], unit_of[problem.edge_dst]
    cross = us != ud
    key = us[cross] * max(U, 1) + ud[cross]
    uniq, inv = np.unique(key, return_inverse=True)
    fbytes = np.bincount(inv, problem.edge_bytes[cross], minlength=len(uniq)) \
        if len(uniq) else np.zeros(0)
    fsrc, fdst = (uniq // max(U, 1)).astype(np.int64), (uniq % max(U, 1)).astype(np.int64)
    return _Flows(fsrc, fdst, fbytes)


def _critical_paths(work: np.ndarray, flows: _Flows, U: int) -> _Paths:
    # units are topologically ordered, so sweeping edges by destination (then
    # by source, backwards) visits every unit after all its predecessors
    fsrc, fdst = flows.src, flows.dst
    order = np.argsort(fdst, kind="stable")
    depth = np.zeros(U)
    top = np.zeros(U)
    for s, d in zip(fsrc[order].tolist(), fdst[order].tolist()):
        depth[d] = max(depth[d], depth[s] + 1)
        top[d] = max(top[d], top[s] + work[s])
    bottom = work.copy()
    order_r = np.argsort(-fsrc, kind="stable")
    for s, d in zip(fsrc[order_r].tolist(), fdst[order_r].tolist()):
        bottom[s] = max(bottom[s], work[s] + bottom[d])
    cp = max(float((top + bottom).max()) if U else 1.0, 1e-30)
    return _Paths(depth, top, bottom, cp)


def _scales(problem, units: _Units, U: int) -> _Scales:
    D = problem.n_devices
    mean_rate = float(problem.rate.mean())
    bw = np.array(problem.bandwidth, dtype=float)
    off = ~np.eye(D, dtype=bool)
    mean_bw = float(bw[off].mean()) if D > 1 else 1e12
    lat = np.array(problem.latency, dtype=float)
    mean_lat = float(lat[off].mean()) if D > 1 else 0.0
    total_work = max(float(units.work.sum()), 1e-30)
    total_need = max(float(units.need.sum()), 1.0)
    mean_unit_time = total_work / U / mean_rate
    return _Scales(bw, lat, off, mean_rate, mean_bw, mean_lat, total_work, total_need,
                   mean_unit_time)


def _op_features(problem, units: _Units, flows: _Flows, paths: _Paths, scales: _Scales,
                 U: int) -> np.ndarray:
    work, need, outs, fbytes = units.work, units.need, units.outs, flows.bytes
    memory, total_work, total_need = problem.memory, scales.total_work, scales.total_need
    top, bottom, cp = paths.top, paths.bottom, paths.cp
    indeg = np.bincount(flows.dst, minlength=U)
    outdeg = np.bincount(flows.src, minlength=U)
    pos = np.arange(U) / max(U - 1, 1)
    on_cp = (np.abs(top + bottom - cp) <= 1e-6 * cp).astype(float)
    # global intensities: how slow links are next to compute, how tight memory is
    comm_ratio = math.log10(max((fbytes.mean() if len(fbytes) else 1.0) / scales.mean_bw
                                + scales.mean_lat, 1e-12) / max(scales.mean_unit_time, 1e-12))
    mem_ratio = math.log(total_need / max(float(memory.sum()), 1.0))
    x_op = np.stack([
        _log_ratio(work, total_work / U) / 4,
        work / total_work * min(U, 64) / 8,
        np.log1p(need / max(float(memory.mean()), 1.0) * 8) / 2,
        need / total_need * min(U, 64) / 8,
        np.log1p(outs / max(float(outs.mean()), 1.0)),
        pos,
        paths.depth / max(float(paths.depth.max()), 1.0),
        top / cp,
        bottom / cp,
        on_cp,
        np.log1p(indeg) / 2,
        np.log1p(outdeg) / 2,
        np.sin(math.pi * pos), np.cos(math.pi * pos),
        np.sin(2 * math.pi * pos), np.cos(2 * math.pi * pos),
        np.full(U, math.log(U) / 5),
        np.full(U, comm_ratio / 3),
        np.full(U, mem_ratio / 3),
        np.log1p(units.count) / 3,
    ], axis=1)
    assert x_op.shape[1] == OP_FEATURES
    return x_op


def _dev_features(problem, scales: _Scales, D: int) -> np.ndarray:
    rate, memory, bw, lat, off = problem.rate, problem.memory, scales.bw, scales.lat, scales.off
    mean_bw, total_work = scales.mean_bw, scales.total_work
    site = problem.site.astype(float)
    n_sites = max(int(problem.site.max()) + 1, 1)
    site_size = np.bincount(problem.site, minlength=n_sites)[problem.site]
    dpos = np.arange(D) / max(D - 1, 1)
    bw_out = np.where(off, bw, np.nan)
    mean_bw_d = np.nanmean(bw_out, axis=1) if D > 1 else np.full(D, mean_bw)
    lat_out = np.where(off, lat, np.nan)
    mean_lat_d = np.nanmean(lat_out, axis=1) if D > 1 else np.zeros(D)
    x_dev = np.stack([
        rate / float(rate.max()),
        _log_ratio(rate, scales.mean_rate),
        memory / float(memory.mean()),
        np.log1p(memory / (scales.total_need / D)) / 2,
        _log_ratio(mean_bw_d, bw[off].max() if D > 1 else mean_bw) / 4,
        np.log10(mean_lat_d + 1e-6) / 3 + 1,
        site_size / D,
        np.full(D, math.log(D) / 4),
        dpos,
        np.sin(math.pi * dpos), np.cos(math.pi * dpos),
        np.sin(2 * math.pi * dpos), np.cos(2 * math.pi * dpos),
        site / max(n_sites - 1, 1),
        np.full(D, n_sites / D),
        total_work / rate / max(total_work / rate.sum(), 1e-30) / D,
    ], axis=1)
    assert x_dev.shape[1] == DEV_FEATURES
    return x_dev


def _flow_features(flows: _Flows, scales: _Scales, U: int) -> np.ndarray:
    fsrc, fdst, fbytes = flows
    if not len(fsrc):
        return np.zeros((0, FLOW_FEATURES))
    return np.stack([
        np.log1p(fbytes / max(float(fbytes.mean()) if len(fbytes) else 1.0, 1.0)),
        np.log1p(fbytes / scales.mean_bw / max(scales.mean_unit_time, 1e-12)) / 3,
        (fdst - fsrc) / max(U, 1),
    ], axis=1)


def _link_features(problem, scales: _Scales, li: np.ndarray, lj: np.ndarray) -> np.ndarray:
    bw, lat = scales.bw, scales.lat
    if not len(li):
        return np.zeros((0, LINK_FEATURES))
    return np.stack([
        _log_ratio(bw[li, lj], bw[scales.off].max()) / 4,
        np.log10(lat[li, lj] + 1e-6) / 3 + 1,
        (problem.site[li] == problem.site[lj]).astype(float),
        np.log1p(scales.mean_unit_time / (lat[li, lj] + 1.0 / bw[li, lj] * 1e6)) / 4,
    ], axis=1)


def _cand_features(problem, units: _Units, scales: _Scales, cu: np.ndarray, cd: np.ndarray,
                   placement: np.ndarray | None, U: int, D: int) -> np.ndarray:
    need, memory = units.need, problem.memory
    rel_time = units.work[cu] / problem.rate[cd] / max(scales.mean_unit_time, 1e-30)
    current = np.zeros(U * D)
    if placement is not None:
        current[np.arange(U) * D + np.asarray(placement, dtype=np.int64)] = 1.0
    return np.stack([
        np.log1p(rel_time) / 2,
        np.minimum(need[cu] / memory[cd], 4.0),
        np.log1p(need[cu] / memory[cd] * U),
        current,
    ], axis=1)


def _colocation_ties(problem, unit_of: np.ndarray, U: int) -> np.ndarray:
    tie = np.arange(U, dtype=np.int64)
    labels: dict[str, int] = {}
    for op_index, op_id in enumerate(problem.ids):
        label = problem.graph.op(op_id).colocate
        if label is None:
            continue
        u = int(unit_of[op_index])
        if label in labels:
            _union(tie, labels[label], u)
        else:
            labels[label] = u
    for u in range(U):
        tie[u] = _find(tie, u)
    return tie


def _unit_max(unit_of: np.ndarray, values: np.ndarray, U: int) -> np.ndarray:
    out = np.zeros(U)
    np.maximum.at(out, unit_of, values)
    return out


def _find(parent: np.ndarray, x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = int(parent[x])
    return x


def _union(parent: np.ndarray, a: int, b: int) -> None:
    ra, rb = _find(parent, a), _find(parent, b)
    if ra != rb:
        # the earliest unit in topological order decides for the group
        lo, hi = min(ra, rb), max(ra, rb)
        parent[hi] = lo


def to_data(graph, cluster, *, max_units: int = 128, **problem_options) -> HeteroData:
    """The ``HeteroData`` of ``graph`` on ``cluster``: op and device nodes,
    op-op flow edges (bytes), device-device link edges (bandwidth, latency)
    and candidate-placement edges, all with normalized features.

    >>> import placer
    >>> data = to_data(placer.datasets.graph("gpt-125m.module"), placer.Cluster.preset("two-sites"))
    >>> data["op"].num_nodes, data["dev"].num_nodes
    (19, 8)
    """
    from placer.cost import Problem
    return encode_problem(Problem(graph, cluster, **problem_options), max_units=max_units).data


class ProblemDataset:
    """A sequence of (graph, cluster) problems as ``HeteroData`` for training.

    ``graphs`` are names for :func:`placer.datasets.graph` (or Graph objects),
    ``clusters`` preset names (or Cluster objects); every pair is one item,
    encoded on first access and cached. Works with
    ``torch_geometric.loader.DataLoader``.

    >>> ds = ProblemDataset(["gpt-125m.module"], ["two-sites", "a100x8"])
    >>> len(ds), ds[1]["dev"].num_nodes
    (2, 8)
    """

    def __init__(self, graphs, clusters, *, max_units: int = 128, **problem_options):
        from placer import Cluster, datasets
        self.graphs = [datasets.graph(g) if isinstance(g, str) else g for g in graphs]
        self.clusters = [Cluster.preset(c) if isinstance(c, str) else c for c in clusters]
        self.pairs = [(g, c) for g in self.graphs for c in self.clusters]
        self.max_units = max_units
        self.options = problem_options
        self._cache: dict[int, HeteroData] = {}

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> HeteroData:
        if index not in self._cache:
            graph, cluster = self.pairs[index]
            self._cache[index] = to_data(graph, cluster, max_units=self.max_units,
                                         **self.options)
        return self._cache[index]

    @classmethod
    def split(cls, which: str, clusters, **options) -> "ProblemDataset":
        """The problems of dataset split ``which`` ("train", "val", "test")."""
        from placer import datasets
        return cls(datasets.split(which), clusters, **options)

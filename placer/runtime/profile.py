"""``placer profile``: measure per-op times here and calibrate the cost model.

Every op of the graph is run alone on each local device (its inputs ready,
like :func:`placer.trace` measures FLOPs), forward and backward, at the
traced batch and at half of it. The times go into the graph as
``op.extra["measured"][device] = {"fwd": s, "bwd": s, "fwd_half": s,
"bwd_half": s}``. Per device, a fixed cost per op launch and a sustained
FLOP rate are fitted (``t = overhead + flops / rate``, the form the cost
model uses): the rate goes into the cluster as the device's ``efficiency``
(rate / peak) and the overhead into ``device.extra["op_overhead"]``.

Until the cost model reads ``measured`` itself, :func:`calibrated_graph`
turns the measurements into a graph whose FLOPs, at the calibrated rate,
take exactly the measured time, so the existing simulator predicts from
measurements rather than from peak FLOPs.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..cluster import Cluster
from ..errors import PlanError
from ..graph import Graph
from .split import capture

__all__ = ["profile", "calibrated_graph", "profile_main"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Timer(torch.fx.Interpreter):
    """Runs a graph node by node, timing each node's forward and backward."""

    def __init__(self, gm, device, repeats, training):
        super().__init__(gm)
        self.device = device
        self.repeats = repeats
        self.training = training
        self.times: dict[str, tuple[float, float]] = {}

    def baseline(self) -> tuple[float, float]:
        """What timing a trivial op costs (the timer's and autograd's own
        overhead), subtracted from every op: inside a piece, autograd runs
        the whole backward in one call."""
        if not hasattr(self, "_base"):
            x = torch.ones(1, device=self.device)
            fwd, bwd = [], []
            for _ in range(max(self.repeats, 5)):
                leaf = x.detach().requires_grad_(True)
                _sync(self.device)
                start = time.perf_counter()
                with torch.set_grad_enabled(self.training):
                    y = torch.neg(leaf.clone())
                _sync(self.device)
                fwd.append(time.perf_counter() - start)
                if self.training:
                    _sync(self.device)
                    start = time.perf_counter()
                    torch.autograd.grad([y], [leaf], [torch.ones_like(y)])
                    _sync(self.device)
                    bwd.append(time.perf_counter() - start)
            self._base = (statistics.median(fwd), statistics.median(bwd) if bwd else 0.0)
        return self._base

    def run_node(self, node):
        if node.op in ("placeholder", "get_attr", "output"):
            return super().run_node(node)
        with self._set_current_node(node):
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            leaves = []

            def prep(v):
                if isinstance(v, torch.Tensor) and v.is_floating_point() and self.training:
                    leaf = v.detach().requires_grad_(True)
                    leaves.append(leaf)
                    return leaf.clone()
                return v.detach() if isinstance(v, torch.Tensor) else v

            fwd, bwd = [], []
            value = None
            for _ in range(self.repeats):
                leaves.clear()
                a = pytree.tree_map(prep, args)
                k = pytree.tree_map(prep, kwargs)
                _sync(self.device)
                start = time.perf_counter()
                with torch.set_grad_enabled(self.training):
                    value = getattr(self, node.op)(node.target, a, k)
                _sync(self.device)
                fwd.append(time.perf_counter() - start)
                outs = [t for t in pytree.tree_leaves(value)
                        if isinstance(t, torch.Tensor) and t.requires_grad]
                wrt = list(leaves)
                if node.op == "call_module":
                    wrt += [p for p in self.fetch_attr(node.target).parameters()
                            if p.requires_grad]
                if self.training and outs and wrt:
                    grads = [torch.ones_like(t) for t in outs]
                    _sync(self.device)
                    start = time.perf_counter()
                    torch.autograd.grad(outs, wrt, grads, allow_unused=True)
                    _sync(self.device)
                    bwd.append(time.perf_counter() - start)
            base_f, base_b = self.baseline()
            self.times[node.name] = (max(0.0, statistics.median(fwd) - base_f),
                                     max(0.0, statistics.median(bwd) - base_b) if bwd else 0.0)
            return pytree.tree_map_only(torch.Tensor, lambda t: t.detach(), value)


def _time_nodes(model, inputs, gm, device, repeats, training, rows=None):
    mask = [isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == inputs_batch(inputs)
            for t in inputs]
    args = [(t[:rows] if (rows is not None and m) else t).to(device)
            if isinstance(t, torch.Tensor) else t for t, m in zip(inputs, mask)]
    work = copy.deepcopy(gm).to(device)
    timer = _Timer(work, device, repeats, training)
    timer.run(*args)
    return timer.times


def inputs_batch(inputs) -> int:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return 1


def profile(model: torch.nn.Module, example_inputs: Any, graph: Graph | None = None,
            cluster: Cluster | None = None, *, devices: list[str] | None = None,
            repeats: int = 5, warmup: int = 1) -> tuple[Graph, Cluster]:
    """Measure every op of ``graph`` (default: traced here) on each local
    device and return ``(graph, cluster)`` with the measurements and the
    fitted efficiencies (copies; the inputs are not modified).

    ``cluster`` defaults to :meth:`Cluster.local`; ``devices`` to the
    cluster's devices that are torch devices of this machine. Ops are timed
    ``repeats`` times after ``warmup`` runs (median)."""
    from ..trace import trace
    from .run import _as_device
    if graph is None:
        graph = trace(model, example_inputs)
    cluster = cluster or Cluster.local()
    names = devices or [d for d in cluster.names if _as_device(d) is not None]
    if not names:
        raise PlanError("no device of the cluster is a torch device of this machine",
                        fix="pass devices=[...] naming 'cpu' or 'cuda:N' devices")
    fx_names = {op.extra.get("fx") for op in graph if op.extra.get("fx")}
    gm, inputs = capture(model, example_inputs, graph.meta.get("granularity", "op"),
                         None, fx_names)
    batch = inputs_batch(inputs)
    half = max(1, batch // 2)
    out_graph = Graph.from_dict(graph.to_dict())
    devices_out = []
    for dev in cluster.devices:
        dev = copy.deepcopy(dev)
        if dev.name in names:
            tdev = _as_device(dev.name)
            for _ in range(warmup):
                _time_nodes(model, inputs, gm, tdev, 1, graph.training)
            full = _time_nodes(model, inputs, gm, tdev, repeats, graph.training)
            part = _time_nodes(model, inputs, gm, tdev, repeats, graph.training, rows=half) \
                if half < batch else full
            total_full = total_half = 0.0
            flops = 0.0
            n = 0
            for op in out_graph:
                name = op.extra.get("fx")
                if name not in full:
                    continue
                f, b = full[name]
                fh, bh = part.get(name, (f, b))
                op.extra.setdefault("measured", {})[dev.name] = {
                    "fwd": f, "bwd": b, "fwd_half": fh, "bwd_half": bh, "batch": batch}
                total_full += f + b
                total_half += fh + bh
                flops += op.flops + (op.bwd_flops if graph.training else 0.0)
                n += 1
            # t(B) = n*o + W, t(B/2) = n*o + W*h/B  ->  solve for o and W
            frac = half / batch
            work = (total_full - total_half) / (1 - frac) if frac < 1 else total_full
            work = min(max(work, 1e-12), total_full)
            launches = max(n * (2 if graph.training else 1), 1)
            overhead = max(0.0, (total_full - work) / launches)
            rate = flops / work if flops > 0 else dev.flops
            dev.efficiency = min(1.0, max(1e-6, rate / dev.flops))
            dev.extra = dict(dev.extra, op_overhead=overhead, measured_step=total_full)
        devices_out.append(dev)
    out_cluster = Cluster(cluster.name, devices_out, cluster.bandwidth, cluster.latency,
                          meta=getattr(cluster, "meta", None))
    return out_graph, out_cluster


def calibrated_graph(graph: Graph, cluster: Cluster, device: str | None = None,
                     *, overhead: float | None = None) -> Graph:
    """A copy of ``graph`` whose FLOPs take, on ``cluster``'s calibrated
    ``device`` (default: the first profiled one), the time measured for each
    op there less the per-op ``overhead`` (default: the device's fitted
    ``op_overhead``; pass the same value as ``Problem(op_overhead=...)``)."""
    data = graph.to_dict()
    if device is None:
        device = next((d.name for d in cluster.devices if "op_overhead" in d.extra), None)
    if device is None:
        raise PlanError("the cluster holds no profiled device", fix="run placer profile first")
    dev = cluster.device(device)
    rate = dev.flops * (dev.efficiency or 1.0)
    ovh = dev.extra.get("op_overhead", 0.0) if overhead is None else overhead
    for node in data["nodes"]:
        m = (node.get("measured") or {}).get(device)
        if m is None:
            continue
        node["flops"] = max(0.0, m["fwd"] - ovh) * rate
        node["bwd_flops"] = max(0.0, m["bwd"] - ovh) * rate if m["bwd"] > 0 else 0.0
    return Graph.from_dict(data)


def profile_main(argv: list[str] | None = None) -> int:
    """``placer profile --model NAME [--tiny] [--batch B] [--cluster C] -o graph.json
    [--cluster-out c.yaml]``: measure and write the calibrated graph/cluster."""
    from .._cli import add_json, add_seed, command_parser
    ap = command_parser("placer profile", "Measure per-op times on this machine's devices and "
                        "write a calibrated graph (and cluster) for the cost model.",
                        "placer profile --model gpt-125m --tiny -o gpt.measured.json "
                        "--cluster-out local.yaml",
                        "placer plan gpt.measured.json --cluster local.yaml -o plan.json")
    ap.add_argument("--model", required=True, help="zoo model name")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--cluster", default=None, help="cluster file or preset (default: local)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_seed(ap, "model's weights and example inputs")
    ap.add_argument("-o", "--output", required=True, help="graph JSON to write")
    ap.add_argument("--cluster-out", default=None, help="calibrated cluster YAML to write")
    add_json(ap)
    ns = ap.parse_args(argv)
    from .. import zoo
    from .dist import _cluster
    if ns.threads:
        torch.set_num_threads(ns.threads)
    model, inputs = zoo.build(ns.model, batch=ns.batch, seq=ns.seq, tiny=ns.tiny, seed=ns.seed)
    graph, cluster = profile(model, inputs, cluster=_cluster(ns.cluster), repeats=ns.repeats)
    graph.save(ns.output)
    if ns.cluster_out:
        cluster.save(ns.cluster_out)
    rows = [{"device": d.name, "efficiency": d.efficiency,
             "op_overhead_s": d.extra["op_overhead"], "measured_step_s": d.extra["measured_step"]}
            for d in cluster.devices if "op_overhead" in d.extra]
    if ns.json:
        print(json.dumps({"graph": ns.output, "cluster": ns.cluster_out, "devices": rows},
                         indent=1))
        return 0
    for r in rows:
        print(f"{r['device']}: efficiency {r['efficiency']:.3g}, op overhead "
              f"{r['op_overhead_s'] * 1e6:.1f} us, measured step "
              f"{r['measured_step_s'] * 1e3:.2f} ms")
    return 0

"""``placer profile``: measure per-op times here and calibrate the cost model.

Every op of the graph is run alone on each local device (its inputs ready,
like :func:`placer.trace` measures FLOPs), forward and backward, repeated in
a row (the median repeat: its typical time), at the traced batch, at
half and at a quarter of it. The times go into the graph as
``op.extra["measured"][device] = {"fwd": s, "bwd": s, "fwd_half": s,
"bwd_half": s, "fwd_fixed": s, "bwd_fixed": s}`` (the fixed parts: what
the op costs whatever its rows, the intercept of its times over the row
counts). Per device, a fixed cost per op launch is fitted over
those row counts in the form the cost model uses (``t = overhead + flops /
rate``) and the share of a core this process gets is measured
(:func:`cpu_share`: on a shared host a step runs for many time slices, an
op for less than one); the rate goes into the cluster as the device's
``efficiency`` (rate / peak), the overhead into
``device.extra["op_overhead"]``, the share into
``device.extra["cpu_share"]`` and what one runtime task (a piece, per
microbatch and phase) costs beyond its ops into
``device.extra["task_overhead"]`` (:func:`task_overhead`; pass it as
``Problem(task_overhead=...)``).

:func:`calibrated_graph` turns the measurements into a graph whose FLOPs,
at the calibrated rate, take the measured time (divided by the share), so
the simulator predicts from measurements rather than from peak FLOPs.

Between ``torch.distributed`` ranks, :func:`measure_links` times a
ping-pong at several sizes and an all-reduce, :func:`fit_link` fits
``latency + bytes / bandwidth`` and :func:`ranks_cluster` builds the
ranks' cluster (``placer launch --calibrate`` does all of it in the ranks,
see :func:`placer.runtime.rank_loop.run_rank`).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from typing import Any, Callable

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
        self.samples: dict[str, tuple[list, list]] = {}

    def baseline(self) -> tuple[float, float]:
        """What the timer itself costs, subtracted from every op: forward,
        an empty timed region (an op's own launch cost stays in its time,
        since a piece pays it too); backward, the start-up of a call of
        autograd (inside a piece, autograd runs the whole backward in one
        call), i.e. a one-node backward less one node's share, measured
        from chains of 1 and 9 nodes (each node's dispatch stays in its
        op's time, since a piece pays it too)."""
        if not hasattr(self, "_base"):
            x = torch.ones(1, device=self.device)
            fwd, bwd1, bwd9 = [], [], []
            for _ in range(max(self.repeats, 7)):
                _sync(self.device)
                start = time.perf_counter()
                with torch.set_grad_enabled(self.training):
                    pass
                _sync(self.device)
                fwd.append(time.perf_counter() - start)
                if self.training:
                    bwd1.append(self._chain_grad(x, 1))
                    bwd9.append(self._chain_grad(x, 9))
            if self.training:
                t1, t9 = statistics.median(bwd1), statistics.median(bwd9)
                base_b = max(0.0, t1 - max(0.0, t9 - t1) / 8)
            else:
                base_b = 0.0
            self._base = (statistics.median(fwd), base_b)
        return self._base

    def _chain_grad(self, x, nodes: int) -> float:
        leaf = x.detach().requires_grad_(True)
        y = leaf
        for _ in range(nodes):
            y = torch.neg(y)
        _sync(self.device)
        start = time.perf_counter()
        torch.autograd.grad([y], [leaf], [torch.ones_like(y)])
        _sync(self.device)
        return time.perf_counter() - start

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
            f_all, b_all = self.samples.setdefault(node.name, ([], []))
            # the median repeat: the op's typical speed. An op is far shorter
            # than a time slice, so few repeats are preempted (the share of
            # the core is measured apart, see cpu_share); the fastest repeat
            # is the one that ran at the host's best speed, which a virtual
            # CPU gives only now and then (a fixed chunk's CPU time here:
            # fastest 1.2 ms, median 1.9 ms)
            f_all.append(max(0.0, _typical(fwd) - base_f))
            b_all.append(max(0.0, _typical(bwd) - base_b) if bwd else 0.0)
            return pytree.tree_map_only(torch.Tensor, lambda t: t.detach(), value)

    @property
    def times(self) -> dict[str, tuple[float, float]]:
        """Node name -> (forward, backward) seconds, medians over the passes."""
        return {k: (statistics.median(f), statistics.median(b))
                for k, (f, b) in self.samples.items()}


def _time_nodes(model, inputs, gm, device, repeats, training, rows=None, loss_fn=None):
    mask = [isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == inputs_batch(inputs)
            for t in inputs]
    args = [(t[:rows] if (rows is not None and m) else t).to(device)
            if isinstance(t, torch.Tensor) else t for t, m in zip(inputs, mask)]
    work = copy.deepcopy(gm).to(device)
    timer = _Timer(work, device, repeats, training)
    # each op repeated in a row (a whole pass per sample was tried: the
    # timer's own backward calls between ops then evict more than a step does)
    out = timer.run(*args)
    times = timer.times
    if training and loss_fn is not None:
        times[LOSS] = _time_loss(out, loss_fn, device, repeats)
    return times


#: key of the loss's (forward, backward) seconds among the timed nodes
LOSS = "<loss>"


def _time_loss(outputs, loss_fn, device, repeats: int) -> tuple[float, float]:
    """The loss's forward and backward seconds on ``outputs`` (the runtime
    computes it once per microbatch on the device of the last output; the
    graph has no op for it). Median repeat, like the ops."""
    fwd, bwd = [], []
    for _ in range(max(1, repeats)):
        leaves = pytree.tree_map_only(
            torch.Tensor, lambda t: t.detach().requires_grad_(t.is_floating_point()), outputs)
        wrt = [t for t in pytree.tree_leaves(leaves)
               if isinstance(t, torch.Tensor) and t.requires_grad]
        _sync(device)
        start = time.perf_counter()
        loss = loss_fn(leaves)
        _sync(device)
        fwd.append(time.perf_counter() - start)
        if loss.requires_grad and wrt:
            start = time.perf_counter()
            torch.autograd.grad([loss], wrt, allow_unused=True)
            _sync(device)
            bwd.append(time.perf_counter() - start)
    return _typical(fwd), (_typical(bwd) if bwd else 0.0)


def _loss_fixed(losses: dict, batch: int) -> tuple[float, float]:
    """The loss's (or an op's) forward and backward seconds that do not
    shrink with the rows (the intercept of a line through its times at the
    measured row counts, ``{rows: (fwd, bwd)}``), within [0, its time at
    ``batch``]: a microbatch pays them whole (launches, the runtime's loss
    task)."""
    import numpy as np
    if len(losses) < 2 or batch not in losses:
        return 0.0, 0.0
    rows = np.array(sorted(losses), dtype=float)
    out = []
    for k in range(2):
        times = np.array([losses[int(r)][k] for r in rows])
        slope, intercept = np.polyfit(rows, times, 1)
        out.append(float(min(max(intercept, 0.0), losses[batch][k])))
    return out[0], out[1]


#: how the repeats of one op's timing are summarised (see _Timer.run_node)
OP_STATISTIC = "median"


def _typical(times: list[float]) -> float:
    """One op's time from its repeats (:data:`OP_STATISTIC`)."""
    return min(times) if OP_STATISTIC == "min" else statistics.median(times)


def _output_nodes(gm) -> list[str]:
    """Names of the fx nodes whose values are the model's outputs."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [n.name for n in pytree.tree_leaves(out.args) if isinstance(n, torch.fx.Node)]


def inputs_batch(inputs) -> int:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return 1


def cpu_share(device: torch.device, seconds: float = 0.1) -> float:
    """The share of a core this thread gets now (CPU time / wall time over
    ``seconds`` of small matrix products; 1.0 on an idle machine and for
    CUDA devices). On a host shared with other work the scheduler hands out
    time slices; ops timed one by one fit inside a slice, whole steps do
    not."""
    return cpu_speed(device, seconds)[0]


def cpu_speed(device: torch.device, seconds: float = 0.1,
              work: Callable[[], Any] | None = None) -> tuple[float, float]:
    """(:func:`cpu_share`, chunks of work done per second of wall time).
    Two ranks computing at once on cores of their own get whole cores but
    may each run slower (shared caches, memory bandwidth, clocks, a virtual
    machine's siblings): the work rate sees that, the share does not.
    ``work``: one chunk (default: small matrix products); at least one
    chunk runs. CUDA devices: (1.0, 0.0)."""
    if device.type != "cpu":
        return 1.0, 0.0
    if work is None:
        a = torch.randn(64, 64)

        def work():
            b = a
            for _ in range(20):
                b = torch.tanh(b @ b)
    chunks = 0
    wall, cpu = time.perf_counter(), time.thread_time()
    while chunks == 0 or time.perf_counter() - wall < seconds:
        work()
        chunks += 1
    used, spent = time.thread_time() - cpu, time.perf_counter() - wall
    return min(1.0, max(0.05, used / max(spent, 1e-9))), chunks / max(spent, 1e-9)


def model_work(model: torch.nn.Module, example_inputs, device: torch.device,
               budget: float = 0.02) -> Callable[[], Any] | None:
    """A chunk of the model's own work for :func:`cpu_speed`: its forward
    pass (no autograd) on the example inputs, on a copy of the model. Ranks
    that share a machine slow each other down by how much their ops contend
    for caches and memory; the default chunk (small matrix products that
    fit a core's cache) saw 2-10% where the model's steps ran 10-60% slower
    on this project's 2-core virtual machine. None when one pass takes more
    than ``budget`` seconds (too slow to sample before every step) or the
    model does not run as given."""
    if device.type != "cpu":
        return None
    try:
        copy_ = copy.deepcopy(model).to(device)
        args = [t.to(device) if isinstance(t, torch.Tensor) else t
                for t in (example_inputs if isinstance(example_inputs, (list, tuple))
                          else [example_inputs])]

        def work():
            with torch.no_grad():
                copy_(*args)
        work()
        start = time.perf_counter()
        work()
        if time.perf_counter() - start > budget:
            return None
    except Exception:   # noqa: BLE001 - the default chunk stands in
        return None
    return work


def resume_cost(work: Callable[[], Any] | None, idle: float = 0.002,
                repeats: int = 9) -> float:
    """Seconds a chunk of ``work`` (:func:`model_work`) takes longer when
    it starts after the core waited ``idle`` seconds than when it follows
    the same chunk at once: median over ``repeats`` of (after the wait -
    back to back), at least 0 (``Problem(resume_overhead=...)``). A rank
    that waits for a message hands its core to other threads and
    processes; its caches hold their data when it resumes (the tiny GPT's
    forward ran 15-22% slower after a 5 ms sleep on this project's 2-core
    VM, with or without a spinner keeping the core awake). 0 without
    ``work``."""
    if work is None:
        return 0.0
    diffs = []
    work()
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        warm = time.perf_counter() - start
        time.sleep(idle)
        start = time.perf_counter()
        work()
        diffs.append(time.perf_counter() - start - warm)
    return max(0.0, statistics.median(diffs))


def task_overhead(device: torch.device, repeats: int = 15) -> float:
    """Seconds one runtime task costs beyond its ops: a piece's module
    call, its autograd call, gathering its inputs and handing on its
    outputs, per microbatch and phase (``Problem(task_overhead=...)``).
    Measured as the runtime runs it: a chain of 17 tiny linear layers
    placed as one piece and as 16 pieces alternating between two names for
    ``device`` (messages between them stay in this process), steps
    interleaved; the difference of the two plans' task time, per extra
    task. Op times are measured apart (:func:`profile`), so the chain's ops
    cost the same in both plans."""
    from ..plan import Plan
    from ..trace import trace
    from .run import Runner
    gen = torch.Generator().manual_seed(0)
    layers = 17
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(layers)])
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(torch.randn(prm.shape, generator=gen) * 0.3)
    x = torch.randn(4, 8, generator=gen)
    graph = trace(model, (x,))
    order = graph.topological_order()
    runners, tasks = {}, {}
    for pieces in (1, 16):
        placement = {op: ["a" if i * pieces // len(order) % 2 == 0 else "b"]
                     for i, op in enumerate(order)}
        runners[pieces] = Runner(model, Plan(placement), (x,), graph=graph,
                                 device_map={"a": device, "b": device})
    times: dict = {1: [], 16: []}
    for k in range(repeats + 2):
        for pieces, runner in runners.items():
            runner.step()
            if k >= 2:      # two warm-up steps
                bars = [e for e in runner.engine.events
                        if e.category in ("forward", "backward")]
                tasks[pieces] = len(bars)
                times[pieces].append(sum(e.duration for e in bars))
    extra = tasks[16] - tasks[1]
    diff = statistics.median(times[16]) - statistics.median(times[1])
    return max(0.0, diff / max(extra, 1))


def _fit_launch(phases: list[dict], batch: int) -> float:
    """The per-launch overhead ``o`` the cost model should use, given each
    op phase's (forward or backward of an op) measured seconds at several
    row counts (``{rows: seconds}``). The cost model charges a phase
    ``o + max(0, t_batch - o) * rows / batch`` (see :func:`calibrated_graph`);
    ``o`` is chosen on a grid to minimise the squared relative errors of the
    summed time at every measured row count (microbatches and replicas run
    ops at fewer rows)."""
    import numpy as np
    sizes = sorted(phases[0]) if phases else []
    if len(sizes) < 2:
        return 0.0
    t = np.array([[ph[r] for r in sizes] for ph in phases])       # (phases, sizes)
    full = t[:, sizes.index(batch)]
    measured = t.sum(axis=0)
    frac = np.array(sizes, dtype=float) / batch
    # a launch costs at most what a typical op takes (a graph of a few big
    # modules must not read their time as launch overhead)
    busy = full[full > 0]
    grid = np.linspace(0.0, float(np.median(busy)) if len(busy) else 0.0, 401)
    scaled = np.maximum(0.0, full[None, :] - grid[:, None]).sum(axis=1)   # (grid,)
    pred = grid[:, None] * len(phases) + scaled[:, None] * frac[None, :]
    err = ((pred / np.maximum(measured, 1e-12) - 1.0) ** 2).sum(axis=1)
    return float(grid[int(np.argmin(err))])


def profile(model: torch.nn.Module, example_inputs: Any, graph: Graph | None = None,
            cluster: Cluster | None = None, *, devices: list[str] | None = None,
            repeats: int = 5, warmup: int = 1, loss_fn=None,
            share: float | None = None, tasks: bool = True) -> tuple[Graph, Cluster]:
    """Measure every op of ``graph`` (default: traced here) on each local
    device and return ``(graph, cluster)`` with the measurements and the
    fitted efficiencies (copies; the inputs are not modified).

    ``cluster`` defaults to :meth:`Cluster.local`; ``devices`` to the
    cluster's devices that are torch devices of this machine. Ops are timed
    ``repeats`` times after ``warmup`` runs (median).

    Training graphs: the loss (``loss_fn``, default the runtime's
    :func:`~placer.runtime.run.default_loss`) is timed too and its time added
    to the ops whose values are the model's outputs (the runtime computes it
    beside them; the graph has no op for it); ``loss_fn=False`` times none.
    ``share``: the share of a core the steps will get (default: measured
    here, :func:`cpu_share`); ranks that share a host's cores measure it
    while all of them are busy. ``tasks``: also measure :func:`task_overhead`
    (``extra["task_overhead"]``); False where only the op times are wanted."""
    from ..trace import trace
    from .devices import as_device
    if graph is None:
        graph = trace(model, example_inputs)
    cluster = cluster or Cluster.local()
    names = devices or [d for d in cluster.names if as_device(d) is not None]
    if not names:
        raise PlanError("no device of the cluster is a torch device of this machine",
                        fix="pass devices=[...] naming 'cpu' or 'cuda:N' devices")
    fx_names = {op.extra.get("fx") for op in graph if op.extra.get("fx")}
    gm, inputs = capture(model, example_inputs, graph.meta.get("granularity", "op"),
                         None, fx_names)
    batch = inputs_batch(inputs)
    half = max(1, batch // 2)
    if loss_fn is None:
        from .run import default_loss as loss_fn
    elif loss_fn is False:    # not timed (e.g. a loss that needs targets)
        loss_fn = None
    outputs = [n for n in _output_nodes(gm) if n in fx_names] if graph.training else []
    # rows the plans run at: the batch, a half (two microbatches or
    # replicas), a quarter (both); the fit is over all of them
    sizes = sorted({batch, half, max(1, batch // 4)}, reverse=True)
    out_graph = Graph.from_dict(graph.to_dict())
    devices_out = []
    for dev in cluster.devices:
        dev = copy.deepcopy(dev)
        if dev.name in names:
            tdev = as_device(dev.name)
            for _ in range(warmup):
                _time_nodes(model, inputs, gm, tdev, 1, graph.training)
            timed = {r: _time_nodes(model, inputs, gm, tdev, repeats, graph.training,
                                    rows=None if r == batch else r, loss_fn=loss_fn)
                     for r in sizes}
            # each op's time that does not shrink with its rows (launches,
            # dispatch, small fixed work), before the loss is added to it
            op_fixed = {name: _loss_fixed({r: timed[r][name] for r in sizes
                                           if name in timed[r]}, batch)
                        for name in timed[batch] if name != LOSS}
            loss_part, losses = {}, {}
            for r, times in timed.items():
                loss = times.pop(LOSS, None)
                if loss is not None:
                    losses[r] = loss
                for name in outputs if loss is not None else ():
                    f, b = times.get(name, (0.0, 0.0))
                    part = (loss[0] / len(outputs), loss[1] / len(outputs))
                    times[name] = (f + part[0], b + part[1])
                    if r == batch:
                        loss_part[name] = part
            fixed = _loss_fixed(losses, batch)
            full, part = timed[batch], timed[half]
            totals = {r: 0.0 for r in sizes}
            phases = []
            flops = 0.0
            for op in out_graph:
                name = op.extra.get("fx")
                if name not in full:
                    # the cost model charges it a launch too
                    phases += [{r: 0.0 for r in sizes}] * (2 if graph.training else 1)
                    continue
                f, b = full[name]
                fh, bh = part.get(name, (f, b))
                op.extra.setdefault("measured", {})[dev.name] = {
                    "fwd": f, "bwd": b, "fwd_half": fh, "bwd_half": bh, "batch": batch,
                    "fwd_fixed": op_fixed[name][0], "bwd_fixed": op_fixed[name][1]}
                if name in loss_part:
                    # the loss's share of those figures: the runtime computes
                    # the loss on one device, not on every replica
                    op.extra["measured"][dev.name].update(
                        loss_fwd=loss_part[name][0], loss_bwd=loss_part[name][1],
                        loss_fwd_fixed=fixed[0] / len(outputs),
                        loss_bwd_fixed=fixed[1] / len(outputs))
                for r in sizes:
                    totals[r] += sum(timed[r].get(name, (f, b)))
                for k in range(2 if graph.training else 1):
                    phases.append({r: timed[r].get(name, (f, b))[k] for r in sizes})
                flops += op.flops + (op.bwd_flops if graph.training else 0.0)
            share = cpu_share(tdev) if share is None else share
            # an op's time is measured in a burst shorter than a time slice,
            # so it is the speed while running; a step runs for many slices
            # and gets only this process's share of a core
            overhead = _fit_launch(phases, batch) / share
            work = max(sum(max(0.0, ph[batch] / share - overhead) for ph in phases), 1e-12)
            rate = flops / work if flops > 0 else dev.flops
            dev.efficiency = min(1.0, max(1e-6, rate / dev.flops))
            dev.extra = dict(dev.extra, op_overhead=overhead, measured_step=totals[batch],
                             cpu_share=share)
            if tasks:
                dev.extra["task_overhead"] = task_overhead(tdev) / share
        devices_out.append(dev)
    out_cluster = Cluster(cluster.name, devices_out, cluster.bandwidth, cluster.latency,
                          meta=getattr(cluster, "meta", None))
    return out_graph, out_cluster


def calibrated_graph(graph: Graph, cluster: Cluster, device: str | None = None,
                     *, overhead: float | None = None) -> Graph:
    """A copy of ``graph`` whose FLOPs take, on ``cluster``'s calibrated
    ``device`` (default: the first profiled one), the time measured for each
    op there less the per-op ``overhead`` (default: the device's fitted
    ``op_overhead``; pass the same value as ``Problem(op_overhead=...)``).
    Every measured op gets ``fixed_flops`` (``[forward, backward]``): the part of
    its FLOPs that its measured fixed time less ``overhead`` takes, paid
    whole by every microbatch and replica (see :class:`placer.cost.Problem`).
    Ops whose outputs the loss reads also get ``loss_flops``: the part of
    their forward and backward FLOPs that is the loss's, and ``loss_fixed``:
    the part of that which does not shrink with a microbatch's rows (see
    :class:`placer.cost.Problem`)."""
    data = graph.to_dict()
    if device is None:
        device = next((d.name for d in cluster.devices if "op_overhead" in d.extra), None)
    if device is None:
        raise PlanError("the cluster holds no profiled device", fix="run placer profile first")
    dev = cluster.device(device)
    rate = dev.flops * (dev.efficiency or 1.0)
    ovh = dev.extra.get("op_overhead", 0.0) if overhead is None else overhead
    share = dev.extra.get("cpu_share", 1.0)
    for node in data["nodes"]:
        m = (node.get("measured") or {}).get(device)
        if m is None:
            continue
        node["flops"] = max(0.0, m["fwd"] / share - ovh) * rate
        node["bwd_flops"] = max(0.0, m["bwd"] / share - ovh) * rate if m["bwd"] > 0 else 0.0
        if "fwd_fixed" in m:
            # the part every microbatch and replica pays whole, beyond the
            # launch overhead (see Problem's fixed_flops)
            node["fixed_flops"] = [
                min(node["flops"], max(0.0, m["fwd_fixed"] / share - ovh) * rate),
                min(node["bwd_flops"], max(0.0, m["bwd_fixed"] / share - ovh) * rate)
                if m["bwd"] > 0 else 0.0]
        if "loss_fwd" in m:
            node["loss_flops"] = [min(node["flops"], m["loss_fwd"] / share * rate),
                                  min(node["bwd_flops"], m["loss_bwd"] / share * rate)]
            if "loss_fwd_fixed" in m:
                lf, lb = node["loss_flops"]
                node["loss_fixed"] = [min(lf, m["loss_fwd_fixed"] / share * rate),
                                      min(lb, m["loss_bwd_fixed"] / share * rate)]
        # the FLOPs now say it all (share included); a cost model that reads
        # measured times directly must not see the raw ones beside them
        node.pop("measured", None)
    return Graph.from_dict(data)


def profile_main(argv: list[str] | None = None) -> int:
    """``placer profile --model NAME [--tiny] [--batch B] [--cluster C] -o graph.json
    [--cluster-out c.yaml]``: measure and write the calibrated graph/cluster."""
    from .._cli import add_json, add_seed, command_parser, note_atomic_outputs
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
    ns = note_atomic_outputs(ap).parse_args(argv)
    from .. import zoo
    from .._io import check_outputs
    from ..loaders import load_cluster
    check_outputs([("--output", ns.output), ("--cluster-out", ns.cluster_out)], [ns.cluster])
    if ns.threads:
        torch.set_num_threads(ns.threads)
    model, inputs = zoo.build(ns.model, batch=ns.batch, seq=ns.seq, tiny=ns.tiny, seed=ns.seed)
    cluster = None if ns.cluster is None else load_cluster(ns.cluster)
    graph, cluster = profile(model, inputs, cluster=cluster, repeats=ns.repeats)
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


# --------------------------------------------------------------------------
# links between torch.distributed ranks
# --------------------------------------------------------------------------
#: message sizes (bytes) of the ping-pong; a slow link stops early (below)
LINK_SIZES = (256, 16 << 10, 256 << 10, 1 << 20, 4 << 20)


def _pingpong(peer: int, first: bool, nbytes: int, repeats: int) -> float:
    """Median one-way time of ``nbytes`` between this rank and ``peer``
    (half a round trip; the receiver is always waiting, as the runtime's
    pre-posted receives are)."""
    import torch.distributed as dist
    buf = torch.zeros(max(1, nbytes // 4))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if first:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(times)


def fit_link(points: dict) -> tuple[float, float]:
    """``(bandwidth bytes/s, latency s)`` of ``t = latency + bytes /
    bandwidth`` from ``{bytes: seconds}``: the bandwidth from the two
    largest messages (what a link sustains: a rate limiter lets a burst of
    small messages through faster, which a fit over all sizes reads as
    speed; over ``tc tbf`` at 12.5 MB/s an all-size fit gave 25-40 MB/s),
    the latency from the smallest message less its bytes' time."""
    sizes = sorted(points)
    if len(sizes) < 2:
        return float("inf"), max(0.0, float(points[sizes[0]])) if sizes else 0.0
    big, prev = sizes[-1], sizes[-2]
    slope = (points[big] - points[prev]) / (big - prev)
    if slope <= 0:   # flat within noise: the largest size bounds the speed
        slope = max(points[big] - points[sizes[0]], 1e-12) / max(big - sizes[0], 1.0)
    latency = points[sizes[0]] - sizes[0] * slope
    return float(1.0 / slope), max(0.0, float(latency))


def fit_burst(points: dict) -> float:
    """Bytes a link lets through at once before its rate applies (a token
    bucket's size, as ``tc tbf`` shapes a link), from the ping-pong's
    ``{bytes: seconds}``: the line :func:`fit_link` draws through the two
    largest messages meets zero bytes below the smallest message's time;
    the gap, at the link's rate, is what a lone message passes free. Over
    ``tc tbf`` at 200 mbit (a 64 KB bucket on either end of a veth pair)
    it read 26-103 KB. 0 where the largest message took less than 20
    times the smallest (a fast link, whose line meets zero bytes within
    noise: over loopback it read up to 1 MB) or no third size ran; at
    most half the largest message."""
    sizes = sorted(points)
    if len(sizes) < 3:
        return 0.0
    bw, _lat = fit_link(points)
    big = sizes[-1]
    if not (math.isfinite(bw) and bw > 0):
        return 0.0
    intercept = points[big] - big / bw
    if points[big] < 20 * points[sizes[0]]:
        return 0.0     # a fast link: the line's end is noise, and bytes cost little
    return float(min(big / 2, max(0.0, (points[sizes[0]] - intercept) * bw)))


def measure_links(world: int, rank: int, *, sizes=LINK_SIZES, repeats: int = 9,
                  budget: float = 1.0, spin: bool = False,
                  allreduce_sizes=None) -> dict:
    """Collective over every rank of the default process group: a ping-pong
    between each pair of ranks at several message sizes (a size is skipped
    once one round at the previous size took over ``budget`` / ``repeats``
    seconds, so a slow link is measured in about ``budget`` seconds) and an
    all-reduce over all ranks. Returns, identically on every rank,
    ``{"pairs": {(i, j): {"bandwidth", "latency", "points"}},
    "allreduce": {bytes: seconds}}`` (what a message costs the ranks' CPUs
    is measured on the runtime's own transport, see
    :func:`placer.runtime.rank_loop.run_rank`'s calibration). ``spin``: the
    all-reduces are waited for as a busy-polling rank waits for them (:mod:`placer.runtime.waiting`); the ping-pong always blocks
    (polled point-to-point waits gave no faster steps, and over a 100
    mbit ``tbf`` link they read 40 MB/s where blocking read 22-25 MB/s,
    both with the earlier all-size fit). ``allreduce_sizes``: the bytes
    :func:`collective_efficiency` is fitted on (default
    :data:`ALLREDUCE_SIZES`; :func:`allreduce_sizes` gives a model's)."""
    import torch.distributed as dist
    from .waiting import wait_work
    pairs = {}
    for i in range(world):
        for j in range(i + 1, world):
            points = {}
            for nbytes in sizes:
                dist.barrier()
                if rank in (i, j):
                    _pingpong(j if rank == i else i, rank == i, nbytes, 2)   # warm-up
                    t = _pingpong(j if rank == i else i, rank == i, nbytes, repeats)
                else:
                    t = 0.0
                # both ends agree on every figure (and on when to stop)
                shared = torch.tensor([t], dtype=torch.float64)
                dist.all_reduce(shared, op=dist.ReduceOp.MAX)
                points[nbytes] = float(shared[0])
                if points[nbytes] * 2 * repeats > budget:
                    break
            bw, lat = fit_link(points)
            pairs[(i, j)] = {"bandwidth": bw, "latency": lat, "points": points}
    allreduce = {}
    for nbytes in sorted({*sizes[:3], *(allreduce_sizes or ALLREDUCE_SIZES)}):
        # as the runtime does it: gradients flattened into one buffer,
        # all-reduced, copied back (see Engine.allreduce)
        grads = [torch.zeros(max(1, nbytes // 4 // GRADIENTS)) for _ in range(GRADIENTS)]
        times = []
        for _ in range(repeats):
            wait_work(dist.barrier(async_op=True), spin)
            start = time.perf_counter()
            flat = torch.cat([g.reshape(-1) for g in grads])
            wait_work(dist.all_reduce(flat, async_op=True), spin)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            times.append(time.perf_counter() - start)
        shared = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(shared, op=dist.ReduceOp.MAX)
        allreduce[nbytes] = float(shared)
    return {"pairs": pairs, "allreduce": allreduce}


#: all-reduce sizes (bytes) that :func:`collective_efficiency` is fitted on
#: when the model's are not known (see :func:`allreduce_sizes`)
ALLREDUCE_SIZES = (1 << 20, 4 << 20)
#: tensors the measured all-reduce flattens (a model's gradients are many)
GRADIENTS = 32


def allreduce_sizes(param_bytes: float) -> tuple[int, int]:
    """The all-reduce sizes to calibrate for a model of ``param_bytes``
    parameter bytes: a quarter of them and all of them (a plan's buckets
    hold the gradients of the ops its replicated groups share), each within
    64 KB .. 64 MB. An all-reduce's time is not linear in its size (on this
    project's CPU machine 1 MB took 0.96 ms and 4 MB 5.2 ms), so sizes
    far from the model's misjudge it."""
    lo, hi = 64 << 10, 64 << 20
    full = int(min(hi, max(lo, param_bytes)))
    return int(min(hi, max(lo, param_bytes / 4))), full


def collective_efficiency(allreduce: dict, bandwidth: float, latency: float,
                          world: int, sizes=None) -> float:
    """``Problem(collective_efficiency=...)`` from :func:`measure_links`'
    all-reduce times: the ring's time on the links as the cost model sees
    them (``2 (k - 1)`` latencies and ``2 (k - 1) / k`` of the bytes at
    ``bandwidth``; pass the latency the cluster file says, synchronisation
    delay included) over the measured time, geometric mean over ``sizes``
    (default: every measured size of at least 64 KB), in [0.01, 100]. Above
    1 where the links' latency, measured between lone messages, overstates
    what a collective pays for it."""
    k = max(2, world)
    if world < 2 or not math.isfinite(bandwidth) or bandwidth <= 0:
        return 1.0
    if sizes is None:
        sizes = [n for n in allreduce if n >= 64 << 10]
    ratios = []
    for nbytes in sizes:
        seconds = allreduce.get(nbytes)
        if seconds:
            model = 2 * (k - 1) * latency + 2 * (k - 1) / k * nbytes / bandwidth
            ratios.append(math.log(model / seconds))
    if not ratios:
        return 1.0
    return float(min(100.0, max(0.01, math.exp(statistics.fmean(ratios)))))


def _chunk(a, n: int):
    """A fixed slice of compute (``n`` small matrix products)."""
    for _ in range(n):
        a = torch.tanh(a @ a)
    return a


#: message tags of :func:`sync_delay` on the runtime's transport (above a step's)
SYNC_TAGS = 2_000_000


def sync_delay(peer: int, latency: float, *, work: int = 48, repeats: int = 20,
               rounds: int = 2, transport=None, names: tuple = ()) -> float:
    """Collective between this rank and ``peer`` (both call it): the time a
    synchronisation costs beyond what a prediction from average speeds
    charges. Both ranks compute equal chunks of work at once, first freely
    and then in lockstep (a message each way after every chunk, receives
    posted before the chunk, as the runtime's are); the per-chunk time in
    lockstep less the slower rank's free chunk, the CPU time its messages
    took the rank (a send and a receive, which the cost model charges as
    ``message_overhead``) and one message's
    ``latency`` is what each synchronisation loses to the peer that was
    late (preempted on a shared host, woken late from its receive). Free
    and lockstep phases alternate ``rounds`` times so both see the same
    load. Returns seconds, the same figure on both ranks, at least
    ``-latency``: negative where a message between busy ranks costs less
    than ``latency`` says. The ping-pong that measures ``latency`` blocks
    (see :func:`measure_links`), so it includes a halted core's wake-up,
    which busy-polling ranks do not pay: it read 0.23-0.67 ms (loopback and
    ``tc tbf``) where the lockstep exchange was shorter in 7 of 8
    calibrations of the fidelity bench, and
    the simulator, charged the ping-pong's latency per message, predicted
    op-level plans of many messages (gnmt's round_robin, 220 a step) at
    twice their measured step. ``latency + sync_delay`` is what
    :func:`ranks_cluster` gives the link.

    ``transport`` (a :class:`placer.runtime.transport.DistTransport`, with
    ``names`` = (this rank's device, the peer's)): the messages go through
    it as a step's do (receives posted up front, each taken by a watcher
    thread, sends waited for at the end), so the figure includes what that
    path adds to a message (the watcher's wake-up, the GIL, gloo's threads
    at idle priority running only while the rank waits). Without it, plain
    ``irecv``/``send``, which missed most of it: 0-0.4 ms where messages in
    2-rank steps took 0.3-1.0 ms from send to arrival."""
    import torch.distributed as dist
    a = torch.randn(64, 64) * 0.1
    buf, got = torch.zeros(1), torch.zeros(1)
    _chunk(a, work)   # warm-up
    free = lock = cpu = 0.0
    for _ in range(rounds):
        _pingpong(peer, dist.get_rank() < peer, 4, 1)   # start together
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(repeats):
            _chunk(a, work)
        free += time.perf_counter() - start
        cpu -= time.process_time() - cpu_start
        _pingpong(peer, dist.get_rank() < peer, 4, 1)
        start, cpu_start = time.perf_counter(), time.process_time()
        if transport is None:
            for _ in range(repeats):
                req = dist.irecv(got, peer)
                _chunk(a, work)
                dist.send(buf, peer)
                req.wait()
        else:
            me, other = names
            tags = [SYNC_TAGS + k for k in range(repeats)]
            transport.post([(t, (1,), torch.float32, other, me) for t in tags])
            for t in tags:
                _chunk(a, work)
                transport.send(buf, me, other, t)
                transport.recv((1,), torch.float32, other, me, t)
            transport.finish()
        lock += time.perf_counter() - start
        cpu += time.process_time() - cpu_start
    n = rounds * repeats
    # both ends agree: the slower rank's free chunk (a prediction waits
    # for the slower), the longer lockstep and the larger CPU time the
    # messages took (a send and a receive a chunk, which the cost model
    # charges as message_overhead at either end, not as latency)
    mine = torch.tensor([free / n, lock / n, max(0.0, cpu / n)], dtype=torch.float64)
    other = torch.zeros(3, dtype=torch.float64)
    req = dist.isend(mine, peer)
    dist.recv(other, peer)
    req.wait()
    both = torch.maximum(mine, other)
    return max(-latency, float(both[1]) - float(both[0]) - float(both[2]) - latency)


def ranks_cluster(names: list[str], device, links: dict, memory: float = 1e10) -> Cluster:
    """A cluster of the ranks' devices ``names`` (in rank order), each a copy
    of the calibrated ``device`` (its efficiency and ``op_overhead``), joined
    by the measured ``links`` (:func:`measure_links`; a pair's
    ``sync_delay``, where measured, adds to its latency)."""
    import numpy as np
    from ..cluster import Device
    n = len(names)
    bw = np.full((n, n), np.inf)
    lat = np.zeros((n, n))
    for (i, j), link in links["pairs"].items():
        bw[i, j] = bw[j, i] = link["bandwidth"]
        # a synchronisation's loss to a late peer (sync_delay) is paid by
        # every message, like the link's latency; a negative one says a
        # message between busy ranks costs less than the ping-pong read
        lat[i, j] = lat[j, i] = max(0.0, link["latency"] + link.get("sync_delay", 0.0))
    devices = [Device(name, device.flops, memory, efficiency=device.efficiency,
                      kind=device.kind, extra=dict(device.extra)) for name in names]
    return Cluster("ranks", devices, bw, lat)

"""What the runtime pays for its pieces, measured as it runs them.

Op times are measured one op at a time (:func:`placer.runtime.profile.profile`);
the runtime runs merged runs of ops (pieces, :func:`placer.pieces.merge_runs`)
as one module call and one autograd call each. On this project's 2-core VM
a model run as one piece took 0.67-0.9 of its ops' summed times (launches
inside a piece cost less than a timed op's), and each extra piece cost
170-200 us (gathering inputs, the module and autograd calls, handing
outputs on), not the 70-80 us a chain of tiny linear layers reads
(:func:`placer.runtime.profile.task_overhead`).

:func:`measure_pieces` times the model in this process on
:func:`piece_plans` (the whole model as one piece, and cut into many
pieces over two names for one device); :func:`fit_piece_costs` finds the
factor on the ops' predicted times and the cost per piece run that
predict those measurements (:func:`placer.runtime.calibration.combine_calibration`
applies them: ``compute_scale`` and ``task_overhead``).
"""

from __future__ import annotations

import math
import statistics

__all__ = ["piece_plans", "measure_pieces", "fit_piece_costs", "scale_graph"]

#: runs the many-piece plan cuts the topological order into
PIECE_RUNS = 16

#: bounds of the fitted compute scale (one outside them is a broken measurement)
SCALE_BOUNDS = (0.5, 1.5)

#: the most a piece run may cost (seconds)
TASK_COST_MAX = 1e-3


def piece_plans(graph) -> list:
    """The plans :func:`measure_pieces` runs: the whole model as one piece
    in one microbatch, and its topological order cut into
    :data:`PIECE_RUNS` runs alternating between devices ``a`` and ``b``
    in two microbatches (where the batch allows; colocated ops follow the
    first of their group)."""
    from ..search.base import microbatch_candidates
    m = max(m for m in microbatch_candidates(graph, 2))
    return [segments_plan(graph, ["a", "b"], runs, mb) for runs, mb in ((1, 1), (PIECE_RUNS, m))]


def segments_plan(graph, devs: list[str], runs: int, microbatches: int = 1,
                  schedule: str = "1f1b"):
    """``graph``'s topological order cut into ``runs`` runs of equal op
    counts, placed on ``devs`` in turn; colocated ops
    follow the first of their group. The calibration's plans are all of
    this shape (:func:`piece_plans`,
    :func:`placer.runtime.calibration.reference_plan` and ``message_plan``)."""
    from ..plan import Plan
    order = graph.topological_order()
    n = max(len(order), 1)
    placement = {op: [devs[(i * runs // n) % len(devs)]] for i, op in enumerate(order)}
    for members in graph.colocation_groups().values():
        for op in members[1:]:
            placement[op] = list(placement[members[0]])
    return Plan(placement, microbatches=max(1, int(microbatches)), schedule=schedule)


#: the last model's runners (building one splits the model: seconds for a
#: model of a hundred ops); calibration rounds reuse them
_built: dict = {}


def measure_pieces(model, example_inputs, graph, device, *, repeats: int = 3,
                   warmup: int = 1, loss_fn=None) -> list[dict]:
    """Time :func:`piece_plans` in this process, both names on the torch
    ``device``: per plan ``{"compute": s, "tasks": n}``, the median over
    ``repeats`` steps (after ``warmup``) of its tasks' time less their
    messages, and how many tasks ran (the loss's included); [] where the
    runtime cannot run those plans (the fit then keeps the op times)."""
    from ..errors import PlacerError
    from .run import Runner
    key = (id(model), id(graph))
    if key not in _built:
        _built.clear()
        try:
            _built[key] = [Runner(model, plan, example_inputs, graph=graph, loss_fn=loss_fn,
                                  device_map={"a": device, "b": device})
                           for plan in piece_plans(graph)]
        except PlacerError:
            # a model the runtime cannot cut so: the op times stand alone
            _built[key] = []
    out = []
    for runner in _built[key]:
        times, tasks = [], 0
        for k in range(warmup + repeats):
            runner.step()
            bars = [e for e in runner.engine.events if e.category in ("forward", "backward")]
            if k >= warmup:
                times.append(sum(e.duration - e.args.get("waited", 0.0) for e in bars))
                tasks = len(bars)
        out.append({"compute": statistics.median(times), "tasks": tasks})
    return out


def fit_piece_costs(graph, device, runs: list[dict], options: dict,
                    default_task: float) -> tuple[float, float]:
    """``(scale, task_cost)``: the factor on the ops' predicted time and the
    cost of a piece run (a task) for which the simulator, on the calibrated
    ``graph`` and two copies of the calibrated ``device``, predicts the
    measured ``runs`` (:func:`measure_pieces`, in :func:`piece_plans`'
    order) in relative least squares; ``(1.0, default_task)`` when the
    measurements cannot tell them apart. ``options``: the cost model's
    (their task, message and resume costs are not used)."""
    import numpy as np
    from ..cluster import Cluster, Device
    from ..cost import simulate
    if len(runs) < 2 or any(r["compute"] <= 0 for r in runs):
        return 1.0, default_task
    pair = Cluster("pieces", [Device(n, device.flops, device.memory, efficiency=device.efficiency,
                                     kind=device.kind) for n in ("a", "b")],
                   [[math.inf] * 2] * 2, [[0.0] * 2] * 2)
    opts = {k: v for k, v in options.items()
            if k not in ("task_overhead", "message_overhead", "message_copy_rate",
                         "resume_overhead", "link_burst")}
    rows = []
    for plan, run in zip(piece_plans(graph), runs):
        bars = [e for e in simulate(graph, pair, plan, **opts).events()
                if e.category in ("forward", "backward")]
        rows.append((sum(e.duration for e in bars), len(bars), run["compute"]))
    a = np.array([[p / y, n / y] for p, n, y in rows])
    (scale, task), *_ = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)
    if not (math.isfinite(scale) and math.isfinite(task)):
        return 1.0, default_task
    lo, hi = SCALE_BOUNDS
    if task < 0:
        # more pieces cost nothing extra: all of it is the ops' scale
        task = 0.0
        scale = float(np.mean([y / p for p, _, y in rows]))
    task = min(task, TASK_COST_MAX)
    return min(hi, max(lo, float(scale))), float(task)


def scale_graph(graph, scale: float):
    """A copy of the calibrated ``graph`` whose ops take ``scale`` times as
    long (their FLOPs and their fixed and loss parts)."""
    data = graph.to_dict()
    for node in data["nodes"]:
        for key in ("flops", "bwd_flops"):
            if key in node:
                node[key] = node[key] * scale
        for key in ("fixed_flops", "loss_flops", "loss_fixed"):
            if node.get(key):
                node[key] = [x * scale for x in node[key]]
    return type(graph).from_dict(data)

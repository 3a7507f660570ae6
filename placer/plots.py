"""Pictures people would rather see than read: placements and clusters (PNG).

matplotlib with the Agg backend, so they work on machines without a screen.
"""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

from ._io import PathLike, atomic_write_bytes

if TYPE_CHECKING:
    from .cluster import Cluster
    from .graph import Graph
    from .plan import Plan

MAX_DRAWN_OPS = 400
#: placement pictures label every op up to this many ops drawn
MAX_LABELLED_OPS = 80
#: and box a pipeline's stages up to this many stages
MAX_BOXED_STAGES = 16


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: PathLike) -> None:
    """Write ``fig`` to ``path`` as a PNG, atomically, and close it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def device_colors(names: list[str]) -> dict[str, tuple]:
    """A stable colour per device name (tab20, then hsv for large clusters).

    >>> colors = device_colors(["a0", "a1", "b0"])
    >>> list(colors), len(colors["a0"]), colors["a0"] != colors["a1"]
    (['a0', 'a1', 'b0'], 4, True)
    """
    plt = pyplot()
    cmap = plt.get_cmap("tab20" if len(names) <= 20 else "hsv")
    count = max(len(names), 1)
    return {n: cmap(i if len(names) <= 20 else i / count) for i, n in enumerate(names)}


def plot_placement(graph: "Graph", plan: "Plan", path: PathLike, *,
                   title: str | None = None) -> None:
    """Draw the computation graph by depth, ops coloured by device (striped
    grey for data-parallel ops), cross-device edges thick and red, each op
    labelled with its id (module names at module granularity; up to
    :data:`MAX_LABELLED_OPS` ops) and a pipeline's stages boxed and numbered
    (see :mod:`placer.describe`). Graphs over 400 ops are coarsened first
    (groups take their majority device).

    >>> import pathlib, tempfile
    >>> from placer import Edge, Graph, Op, Plan
    >>> g = Graph("chain", [Op(f"op{i}", flops=1e6) for i in range(4)],
    ...           [Edge(f"op{i}", f"op{i + 1}", 8) for i in range(3)])
    >>> plan = Plan({"op0": ["a0"], "op1": ["a0"], "op2": ["b0"], "op3": ["b0", "b1"]})
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "placement.png"
    >>> plot_placement(g, plan, path)
    >>> path.read_bytes()[1:4]
    b'PNG'
    """
    plt = pyplot()
    shown, placement = graph, plan.placement
    if len(graph) > MAX_DRAWN_OPS:
        shown = graph.coarsen(MAX_DRAWN_OPS)
        placement = {}
        for group, members in shown.subgraph_members().items():
            votes: dict[tuple, float] = {}
            for m in members:
                key = tuple(plan.placement[m])
                votes[key] = votes.get(key, 0.0) + graph.op(m).flops + 1.0
            placement[group] = list(max(votes, key=votes.get))
    depth = shown.depths()
    by_depth: dict[int, list[str]] = {}
    for op_id in shown.topological_order():
        by_depth.setdefault(depth[op_id], []).append(op_id)
    pos = {}
    for d, ids in by_depth.items():
        for k, op_id in enumerate(ids):
            pos[op_id] = (d, k - (len(ids) - 1) / 2)
    devices = sorted({d for ds in placement.values() for d in ds},
                     key=lambda n: (len(n), n))
    colors = device_colors(devices)
    width = min(22, 4 + 0.12 * len(by_depth))
    height = min(14, 3 + 0.35 * max(len(v) for v in by_depth.values()))
    fig, ax = plt.subplots(figsize=(width, height))
    cut = same = 0
    for edge in shown.edges:
        (x0, y0), (x1, y1) = pos[edge.src], pos[edge.dst]
        crosses = placement[edge.src] != placement[edge.dst]
        cut += crosses
        same += not crosses
        ax.plot([x0, x1], [y0, y1], color="#d62728" if crosses else "#bbbbbb",
                lw=1.8 if crosses else 0.5, zorder=2 if crosses else 1)
    size = max(12, min(120, 4000 / max(len(shown), 1)))
    for op_id, (x, y) in pos.items():
        ds = placement[op_id]
        face = colors[ds[0]] if len(ds) == 1 else "#999999"
        ax.scatter([x], [y], s=size, color=face, edgecolors="black", linewidths=0.3,
                   hatch="///" if len(ds) > 1 else None, zorder=3)
    if len(shown) <= MAX_LABELLED_OPS:
        for op_id, (x, y) in pos.items():
            ax.annotate(_short(op_id), (x, y), xytext=(0, 5), textcoords="offset points",
                        ha="left", va="bottom", rotation=35, fontsize=6, color="#333333",
                        zorder=4)
    if shown is graph:
        _group_stages(ax, plan, graph.topological_order(), pos, colors)
    handles = [plt.Line2D([], [], marker="o", ls="", color=colors[d], label=d)
               for d in devices[:24]]
    if any(len(ds) > 1 for ds in placement.values()):
        handles.append(plt.Line2D([], [], marker="o", ls="", color="#999999",
                                  label="data-parallel"))
    handles.append(plt.Line2D([], [], color="#d62728", lw=1.8, label="cross-device edge"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)
    ax.set_xlabel("depth (longest path from an input)")
    ax.set_yticks([])
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    note = f" (coarsened {len(graph)} -> {len(shown)} ops)" if shown is not graph else ""
    ax.set_title((title or f"{graph.name}: placement by {plan.method}") + note
                 + f"\n{cut} of {cut + same} edges cross devices", fontsize=10)
    save_figure(fig, path)


def _short(op_id: str, width: int = 22) -> str:
    return op_id if len(op_id) <= width else "…" + op_id[-(width - 1):]


def _group_stages(ax, plan: "Plan", order: list[str], pos: dict, colors: dict) -> None:
    """Box each stretch of a pipeline stage's ops and number the stage on
    its last stretch, where it sits in the pipeline (op-level placements are
    left unboxed)."""
    from matplotlib.patches import FancyBboxPatch
    from .describe import is_pipeline, stages
    found = stages(plan, order)
    if not is_pipeline(found) or len(found) < 2 or len(found) > MAX_BOXED_STAGES:
        return
    for stage in found:
        face = colors[stage.devices[0]] if len(stage.devices) == 1 else "#999999"
        last = stage.runs[-1]       # where the stage sits in the pipeline
        for run in stage.runs:
            xs, ys = [pos[o][0] for o in run], [pos[o][1] for o in run]
            x0, y0 = min(xs) - 0.4, min(ys) - 0.45
            box = FancyBboxPatch((x0, y0), max(xs) - min(xs) + 0.8, max(ys) - min(ys) + 0.9,
                                 boxstyle="round,pad=0.02,rounding_size=0.2", linewidth=0.8,
                                 edgecolor=face, facecolor=face, alpha=0.12, zorder=0)
            ax.add_patch(box)
            if run is last:
                where = (stage.devices[0] if len(stage.devices) == 1
                         else f"{len(stage.devices)} devices")
                ax.text(x0 + 0.05, y0 - 0.05, f"stage {stage.index} ({where})", fontsize=7,
                        ha="left", va="top", color="black", zorder=4)


def plot_cluster(cluster: "Cluster", path: PathLike, *, title: str | None = None) -> None:
    """Draw sites as circles of devices, with the bandwidth and latency of the
    link between each pair of sites on the line joining them.

    >>> import pathlib, tempfile
    >>> from placer import Cluster
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "two-sites.png"
    >>> plot_cluster(Cluster.preset("two-sites"), path, title="two sites")
    >>> path.read_bytes()[1:4]
    b'PNG'
    """
    plt = pyplot()
    sites = cluster.sites()
    names = list(sites)
    fig, ax = plt.subplots(figsize=(9, 9 if len(names) > 2 else 5))
    largest_ring = 0.35 + 0.05 * max(len(m) for m in sites.values())
    radius = 0.0 if len(names) == 1 else \
        max(2.0, 1.3 * (largest_ring + 0.7) / math.sin(math.pi / len(names)))
    centre = {}
    for i, site in enumerate(names):
        angle = 2 * math.pi * i / max(len(names), 1) + math.pi / 2
        centre[site] = (radius * math.cos(angle), radius * math.sin(angle))
    max_bw = max(cluster.link(sites[a][0], sites[b][0])[0]
                 for a in names for b in names if a != b) if len(names) > 1 else 1.0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            bw, lat = cluster.link(sites[a][0], sites[b][0])
            (x0, y0), (x1, y1) = centre[a], centre[b]
            ax.plot([x0, x1], [y0, y1], color="#1f77b4", alpha=0.6,
                    lw=0.5 + 5 * bw / max_bw, zorder=1)
            if len(names) <= 8:
                ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"{_rate(bw)}\n{lat * 1e3:.3g} ms",
                        fontsize=7, ha="center", va="center",
                        bbox=dict(fc="white", ec="none", alpha=0.8), zorder=2)
    kinds = sorted({d.kind or "device" for d in cluster.devices})
    kind_color = device_colors(kinds)
    for site, members in sites.items():
        cx, cy = centre[site]
        ring = 0.35 + 0.05 * len(members)
        for k, name in enumerate(members):
            angle = 2 * math.pi * k / len(members)
            device = cluster.device(name)
            x, y = cx + ring * math.cos(angle), cy + ring * math.sin(angle)
            ax.scatter([x], [y], s=30 + 60 * device.memory / max(cluster.total_memory() /
                                                                   len(cluster), 1.0),
                       color=kind_color[device.kind or "device"], edgecolors="black",
                       linewidths=0.4, zorder=3)
        inner = members[1:2]
        label = site
        if inner:
            bw, lat = cluster.link(members[0], inner[0])
            label += f"\n{len(members)} devices, {_rate(bw)} inside"
        norm = math.hypot(cx, cy)
        ux, uy = (cx / norm, cy / norm) if norm else (0.0, -1.0)
        ax.text(cx + ux * (ring + 0.5), cy + uy * (ring + 0.5), label, fontsize=8,
                ha="center" if abs(ux) < 0.3 else ("left" if ux > 0 else "right"),
                va="center" if abs(uy) < 0.3 else ("bottom" if uy > 0 else "top"))
    handles = [plt.Line2D([], [], marker="o", ls="", color=kind_color[k], label=k) for k in kinds]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False, title="kind (size = memory)")
    ax.set_aspect("equal")
    ax.margins(0.25)
    ax.axis("off")
    ax.set_title(title or f"cluster {cluster.name}: {len(cluster)} devices, {len(names)} site(s)",
                 pad=28)
    save_figure(fig, path)


def _rate(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    for unit, scale in (("Tb/s", 1e12), ("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} b/s"


def plot_comparison(rows: list[dict], path: PathLike, *, title: str = "") -> None:
    """Bars of simulated step time per plan (hatched: over memory), as
    written by ``placer compare``; ``rows`` have ``plan``, ``method``,
    ``step_time`` and ``feasible``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(rows) + 2), 3.5))
    labels = [f"{r['method']}\n{str(r['plan']).rsplit('/', 1)[-1]}" for r in rows]
    times = [r["step_time"] * 1e3 for r in rows]
    bars = ax.bar(range(len(rows)), times, color=["#1f77b4" if r["feasible"] else "#d62728"
                                                   for r in rows])
    for bar, r in zip(bars, rows):
        if not r["feasible"]:
            bar.set_hatch("//")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("simulated step time (ms)")
    ax.set_title(title + ("\nred, hatched: over a device's memory"
                          if not all(r["feasible"] for r in rows) else ""), fontsize=10)
    save_figure(fig, path)


def plot_convergence(series: dict[str, list[dict]], path: PathLike, *, title: str = "") -> None:
    """Best step time found so far against search time, one line per
    strategy (``series`` as recorded by :class:`placer.convergence.Convergence`);
    a strategy that reported once (a heuristic) is a single marker."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    names = sorted(series)
    cmap = plt.get_cmap("tab10")
    colors = {n: cmap(i % 10) for i, n in enumerate(names)}
    for name in names:
        rows = series[name]
        if not rows:
            continue
        xs = [max(r["seconds"], 1e-3) for r in rows]
        ys = [r["step_time"] * 1e3 for r in rows]
        if len(rows) == 1:
            ax.plot(xs, ys, "o", color=colors[name], label=name)
        else:
            ax.step(xs, ys, where="post", color=colors[name], label=name, lw=1.6)
            ax.plot(xs[-1:], ys[-1:], "o", color=colors[name], ms=4)
    values = [r["step_time"] * 1e3 for rows in series.values() for r in rows]
    if values:   # a flat search should look flat, not zoomed into rounding
        low, high = min(values), max(values)
        pad = max(high - low, 0.04 * high) * 0.25
        ax.set_ylim(max(0.0, low - pad), high + pad)
    ax.set_xscale("log")
    ax.set_xlabel("search time (s, log scale)")
    ax.set_ylabel("best step time found (ms)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(title or "search convergence", fontsize=10)
    save_figure(fig, path)


_GANTT_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "transfer": "tab:green",
                 "allreduce": "tab:red", "update": "tab:purple", "messaging": "tab:olive",
                 "compute": "tab:gray"}


def plot_gantt(report, path: PathLike, *, title: str | None = None) -> None:
    """A Gantt chart (PNG) of a report's timeline: a row per device and per
    busy link; colour is the kind of work, and microbatches alternate dark
    and light with their number written on bars wide enough to hold it."""
    from matplotlib.patches import Patch
    plt = pyplot()
    events = report.events()
    lanes: list[str] = []
    for name in list(report.peak_memory) + [e.lane for e in events]:
        if name not in lanes:
            lanes.append(name)
    row = {name: i for i, name in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.3 * max(len(lanes), 1)))
    span = max([e.start + e.duration for e in events] or [1.0]) * 1e3
    bars: dict[tuple, list] = {}
    for e in events:
        mb = e.args.get("microbatch")
        shade = 1.0 if mb is None or mb % 2 == 0 else 0.55
        bars.setdefault((e.category, e.lane, shade), []).append((e.start * 1e3, e.duration * 1e3))
        if mb is not None and e.duration * 1e3 > 0.025 * span and e.category != "transfer":
            ax.text(e.start * 1e3 + e.duration * 5e2, row[e.lane], str(mb), ha="center",
                    va="center", fontsize=6, color="white")
    cats: list[str] = []
    for (cat, lane, shade), spans in bars.items():
        ax.broken_barh(spans, (row[lane] - 0.4, 0.8), facecolors=_GANTT_COLORS.get(cat, "tab:purple"),
                       alpha=shade, edgecolor="white", linewidth=0.4)
        if cat not in cats:
            cats.append(cat)
    handles = [Patch(color=_GANTT_COLORS.get(c, "tab:purple"), label=c) for c in cats]
    ax.set_yticks(range(len(lanes)), lanes, fontsize=7)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlabel("time (ms); microbatches alternate dark/light, numbered where they fit")
    ax.set_title(title or f"{report.model or 'report'}: step {report.step_time * 1e3:.4g} ms")
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7,
                  frameon=False)
    save_figure(fig, path)

"""``placer bench search``: every strategy on every case of a suite.

For each case (graph x cluster) and strategy: the step time of its plan
(analytical model, the search's screening model) and, for the final
ranking, by the event simulator; feasibility and planning time; its ratio to
the best heuristic on that case, to the best of HEFT, m-SCT and pipeline_dp,
and to a lower bound (:func:`lower_bound`: the total work over the total
speed, tightened by the per-op launch overhead along paths; the plain
``work / speed`` ratio is kept beside it), by either model. Writes a results
JSON and a PNG comparing the ratios.

A case's graph may carry a ``.xN`` suffix (``gpt-1.3b.module.x128``): the
traced batch scaled N times (:func:`placer.graph.scale_batch`), e.g. the
large global batch of the DT-FM paper. Suites: ``quick``, ``hetero``
(heterogeneous and geo-distributed), ``homo`` (homogeneous), ``dtfm``
(the paper's five scenarios) and ``scale`` (planning time of 1,000- and
10,000-op graphs on 16 devices).
"""

from __future__ import annotations

import functools
import io
import json
import math
import platform
import time
from typing import Sequence

import numpy as np

from .._io import atomic_write_bytes, atomic_write_text
from ..errors import StrategyError
from ..executors import run_all

HEURISTICS = ("single", "round_robin", "even_pipeline", "m_topo", "heft", "m_etf", "m_sct",
              "partition", "pipeline_dp")
STRONG = ("heft", "m_sct", "pipeline_dp")
OURS = ("evolution", "dtfm")

_DTFM = ["dtfm-datacenter-ondemand", "dtfm-datacenter-spot", "dtfm-multi-universities",
         "dtfm-regional", "dtfm-worldwide"]
SUITES: dict[str, dict] = {
    "quick": {"cases": ["gpt-125m.module@hetero-lab", "layered-n60-w4-s0@two-sites"],
              "time": 3.0},
    "hetero": {"cases": ["gpt-1.3b.module@hetero-lab", "gpt-1.3b.module@two-sites",
                         "gpt-1.3b.module@edge-wireless", "bert-large.module@hetero-lab",
                         "gpt-350m.op@two-sites", "layered-n200-w8-s0@hetero-lab",
                         "gpt-1.3b.module.x128@dtfm-worldwide",
                         "gpt-1.3b.module.x128@dtfm-regional"],
               "time": 20.0},
    "homo": {"cases": ["gpt-1.3b.module@a100x8", "resnet50.op@a100x8",
                       "bert-large.module@ib-4x8-a100", "gpt-1.3b.module.x128@a100x8"],
             "time": 20.0},
    "dtfm": {"cases": [f"gpt-1.3b.module.x128@{c}" for c in _DTFM], "time": 30.0,
             "strategies": ("even_pipeline", "heft", "m_sct", "pipeline_dp", "dtfm",
                            "evolution")},
    "scale": {"cases": ["random_dag-n1000-w8-s0@bench16", "random_dag-n10000-w8-s0@bench16"],
              "time": None, "strategies": ("even_pipeline", "heft", "m_sct", "pipeline_dp",
                                           "evolution")},
}


def load_case(spec: str):
    """(graph, cluster) of ``GRAPH@CLUSTER`` (``bench16``: the 16-device
    geo-distributed bench cluster of ``placer bench cost``)."""
    from ..datasets import cluster, graph
    from .cost import bench_cluster
    gname, cname = spec.split("@", 1)
    factor = None
    if ".x" in gname and gname.rsplit(".x", 1)[1].replace(".", "").isdigit():
        gname, f = gname.rsplit(".x", 1)
        factor = float(f)
    g = graph(gname)
    if factor:
        from ..graph import scale_batch
        g = scale_batch(g, factor)
    c = bench_cluster(int(cname[5:])) if cname.startswith("bench") else cluster(cname)
    return g, c


def work_speed_bound(problem) -> float:
    """Total work over total sustained speed (the plain bound, reported as W/S)."""
    return float(_op_work(problem).sum() / problem.rate.sum())


def _op_work(problem) -> np.ndarray:
    p = problem
    work = p.flops + (p.bwd_flops if p.training else 0.0)
    if p.training and p.recompute:
        work = work + p.flops
    return np.asarray(work, dtype=float)


def lower_bound(problem) -> float:
    """A lower bound of any plan's step time, at least the work over the
    total speed (:func:`work_speed_bound`).

    Say op i runs as ``k_i >= 1`` *pieces* (replicas x microbatches), each
    launch costing ``c`` (the per-op overhead, once per phase). Then

    - the devices' speed-weighted busy time holds all work and launches:
      ``T * sum(rate) >= W + rate_min * c * sum_i k_i``;
    - a sample of the batch crosses every op of a path P in order, and the
      piece holding a random sample is ``1/k_i`` of op i on average:
      ``T >= sum_{i in P} (w_i / (k_i * rate_max) + c)``.

    ``T`` is at least the smaller, over every ``k``, of the larger of the
    two; for a fixed path that is at least ``lambda * first + (1 - lambda) *
    second`` minimised over ``k`` in closed form (any ``lambda`` in [0, 1]).
    This takes the best over a grid of ``lambda`` and a few heavy paths.
    With no launch overhead it is ``W / sum(rate)``; the critical path on
    the fastest device alone is no bound once ops are split into
    microbatches or replicas. Communication and memory are left out, so it
    bounds the simulator and the analytical model alike."""
    p = problem
    w = _op_work(p)
    R, rmin, rmax = float(p.rate.sum()), float(p.rate.min()), float(p.rate.max())
    W = float(w.sum())
    base = W / R
    c = p.op_overhead * (2.0 if p.training else 1.0)
    n = len(w)
    if c <= 0 or n == 0:
        return base
    lam = np.linspace(0.0, 1.0, 201)[1:, None]             # (grid, 1)
    best = base
    for on_path in _heavy_paths(p, w / rmax, c):
        wp = w[on_path][None, :]
        a = lam * rmin * c / R                              # launch price per piece
        b = (1.0 - lam) * wp / rmax                         # path price x piece
        k = np.maximum(1.0, np.sqrt(b / a))
        first = (W + rmin * c * (n - on_path.sum() + k.sum(axis=1, keepdims=True))) / R
        second = (wp / (k * rmax)).sum(axis=1, keepdims=True) + c * on_path.sum()
        value = lam * first + (1.0 - lam) * second
        # lambda = 0: however finely split, each op on the path is launched
        best = max(best, float(value.max()), c * float(on_path.sum()))
    return best


def _heavy_paths(problem, t: np.ndarray, c: float) -> list[np.ndarray]:
    """Boolean masks of the heaviest paths for op weights ``t / k + c``,
    ``k`` in 1, 4, 16, ... (from compute-bound to launch-bound)."""
    from ..search.common import context
    ctx = context(problem)
    n = len(t)
    ks = 4.0 ** np.arange(8)
    wt = t[:, None] / ks[None, :] + c                       # (n, K)
    h = np.empty_like(wt)
    parent = np.full(wt.shape, -1, dtype=np.int64)
    cols = np.arange(len(ks))
    for i in range(n):
        preds, _ = ctx.preds(i)
        if len(preds):
            hp = h[preds]
            j = hp.argmax(axis=0)
            h[i] = wt[i] + hp[j, cols]
            parent[i] = preds[j]
        else:
            h[i] = wt[i]
    masks = []
    for q in range(len(ks)):
        mask = np.zeros(n, dtype=bool)
        i = int(h[:, q].argmax())
        while i >= 0:
            mask[i] = True
            i = int(parent[i, q])
        masks.append(mask)
    return masks


def critical_path_time(problem) -> float:
    """The critical path's work on the fastest device."""
    _, cp = problem.graph.critical_path("compute")
    return cp / problem.rate.max()


def run_case(spec: str, strategies: Sequence[str], seconds: float | None, seed: int = 0,
             log=print) -> dict:
    """Run every strategy on one case; returns its results row."""
    from ..cost import Problem, get_cost_model
    from ..search import Budget, get_strategy
    g, c = load_case(spec)
    problem = Problem(g, c)
    model = get_cost_model("analytical")
    sim = get_cost_model("simulator")
    lb = lower_bound(problem)
    ws = work_speed_bound(problem)
    rows = {}
    for name in strategies:
        if seconds is None:
            budget_s = 60.0 if len(g) <= 2000 else 300.0
        else:
            budget_s = seconds
        budget = Budget(time=budget_s * (0.9 if name in OURS else 1.0))
        t0 = time.perf_counter()
        try:
            plan = get_strategy(name).search(problem, budget.meter(model), budget, seed)
        except StrategyError as exc:
            rows[name] = {"error": str(exc)}
            continue
        wall = time.perf_counter() - t0
        rep = model.estimate(problem, plan)
        srep = sim.estimate(problem, plan)
        rows[name] = {"step_time": rep.step_time, "feasible": bool(rep.feasible),
                      "sim_step_time": srep.step_time, "sim_feasible": bool(srep.feasible),
                      "objective": rep.objective, "planning_seconds": wall,
                      "microbatches": plan.microbatches, "schedule": plan.schedule,
                      "devices_used": len(plan.devices_used())}
        log(f"  {spec:45s} {name:14s} step {rep.step_time:10.4g}s "
            f"{'ok ' if rep.feasible else 'OOM'} sim {srep.step_time:10.4g}s {wall:6.1f}s")
    best = {}
    for tag, step, feasible in (("", "step_time", "feasible"),
                                ("sim_", "sim_step_time", "sim_feasible")):
        best[tag] = _ratios(rows, step, feasible, tag, lb, ws)
    return {"case": spec, "graph": g.name, "ops": len(g), "cluster": c.name,
            "devices": len(c), "lower_bound": lb, "work_speed_bound": ws,
            "critical_path_fastest": critical_path_time(problem),
            "best_heuristic": best[""][0], "best_of_heft_msct_pipeline_dp": best[""][1],
            "sim_best_heuristic": best["sim_"][0],
            "sim_best_of_heft_msct_pipeline_dp": best["sim_"][1], "strategies": rows}


def _ratios(rows: dict, step: str, feasible: str, tag: str, lb: float, ws: float):
    """Fill ``{tag}ratio_*`` of every row from the ``step`` times of its
    feasible plans (infeasible ones have no step time to beat); returns the
    best heuristic's and the best strong heuristic's step times."""
    feas = {k: v for k, v in rows.items() if v.get(feasible)}
    best_h = min((v[step] for k, v in feas.items() if k in HEURISTICS), default=None)
    best_s = min((v[step] for k, v in feas.items() if k in STRONG), default=None)
    for v in rows.values():
        ok = v.get(feasible)
        v[f"{tag}ratio_best_heuristic"] = v[step] / best_h if ok and best_h else None
        v[f"{tag}ratio_best_strong"] = v[step] / best_s if ok and best_s else None
        v[f"{tag}ratio_lower_bound"] = v[step] / lb if ok else None
        v[f"{tag}ratio_work_speed"] = v[step] / ws if ok else None
    return best_h, best_s


def summarize(results: list[dict]) -> dict:
    """Per strategy: mean speed-up over the best of HEFT/m-SCT/pipeline_dp
    (``1 - ratio``), worst ratio to the best heuristic, mean ratio to the
    lower bound (and to ``work / speed``); the same from the simulator's
    step times under ``sim_``-prefixed keys."""
    out = {}
    names = sorted({n for r in results for n in r["strategies"]})
    for n in names:
        entry = {}
        for tag, feasible in (("", "feasible"), ("sim_", "sim_feasible")):
            part = _summary(results, n, tag, feasible)
            if part:
                entry.update(part)
        if entry:
            out[n] = entry
    return out


def _summary(results: list[dict], n: str, tag: str, feasible: str) -> dict:
    rows = [r["strategies"][n] for r in results if r["strategies"].get(n, {}).get(feasible)]
    if not rows:
        return {}
    strong = [x[f"{tag}ratio_best_strong"] for x in rows if x.get(f"{tag}ratio_best_strong")]
    heur = [x[f"{tag}ratio_best_heuristic"] for x in rows
            if x.get(f"{tag}ratio_best_heuristic")]
    out = {f"{tag}cases": len(rows),
           f"{tag}mean_faster_than_best_strong": 1 - float(np.mean(strong)) if strong else None,
           f"{tag}worst_ratio_best_heuristic": max(heur) if heur else None,
           f"{tag}mean_ratio_lower_bound": float(np.mean([x[f"{tag}ratio_lower_bound"]
                                                          for x in rows])),
           f"{tag}mean_ratio_work_speed": float(np.mean([x[f"{tag}ratio_work_speed"]
                                                         for x in rows])),
           f"{tag}infeasible_cases": sum(1 for r in results
                                         if r["strategies"].get(n, {}).get(feasible) is False)}
    if not tag:
        out["max_planning_seconds"] = max(x["planning_seconds"] for x in rows)
    return out


def plot(results: list[dict], path: str) -> None:
    """Bars of each strategy's ratio to the best heuristic, per case, by the
    analytical model (top) and the simulator (bottom); the legend sits
    right of the bars (PNG)."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    names = sorted({n for r in results for n in r["strategies"]
                    if r["strategies"][n].get("feasible")
                    or r["strategies"][n].get("sim_feasible")})
    fig, axes = plt.subplots(2, 1, figsize=(max(7, 1.6 * len(results) + 2.5), 8), sharex=True)
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(results))
    for ax, tag, title in ((axes[0], "", "analytical model"), (axes[1], "sim_", "simulator")):
        for k, n in enumerate(names):
            vals = [min(r["strategies"].get(n, {}).get(f"{tag}ratio_best_heuristic") or np.nan,
                        3.0) for r in results]
            ax.bar(x + k * width, vals, width, label=n, color=plt.cm.tab20(k % 20))
        ax.axhline(1.0, color="k", lw=0.8)
        for i, r in enumerate(results):
            if not r.get(f"{tag}best_heuristic"):
                ax.text(i + 0.4 - width / 2, 0.5, "no heuristic\nplan fits", ha="center",
                        fontsize=7, color="0.3")
        ax.set_ylabel("step / best heuristic (cap 3)")
        ax.set_title(title, fontsize=9)
    axes[1].set_xticks(x + 0.4 - width / 2, [r["case"].replace("@", "\n") for r in results],
                       fontsize=7)
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def bench_search(out: str = "bench-search.json", quick: bool = False,
                 suite: str | None = None, strategies: Sequence[str] | None = None,
                 seconds: float | None = None, seed: int = 0, log=print,
                 backend: str = "local", workers: int = 0) -> dict:
    """Run a suite and write ``out`` (JSON) and ``out`` with ``.png``.

    Cases run one after another in this process, or on ``workers`` Ray
    workers at once with a Ray ``backend`` (0: one per cluster CPU; see
    :mod:`placer.executors`); with ``workers`` > 1 on the local backend, on
    that many processes. Each case's searches are timed on the worker that
    runs them, so give each worker a CPU of its own."""
    from ..cost.warmup import warm_up
    warm_up()      # compiled kernels load before any timed search
    suite = suite or ("quick" if quick else "hetero")
    if suite not in SUITES:
        raise StrategyError(f"unknown suite {suite!r}", field="--suite",
                            fix=f"use one of: {', '.join(SUITES)}")
    spec = SUITES[suite]
    names = list(strategies or spec.get("strategies") or (HEURISTICS + OURS))
    secs = seconds if seconds is not None else spec["time"]
    results = run_all(functools.partial(run_case, strategies=names, seconds=secs, seed=seed,
                                        log=log), spec["cases"], backend=backend,
                      workers=workers)
    doc = {"suite": suite, "seconds_per_strategy": secs, "seed": seed,
           "machine": platform.platform(), "results": results,
           "summary": summarize(results)}
    atomic_write_text(out, json.dumps(doc, indent=2, default=_clean) + "\n")
    png = out[:-5] + ".png" if out.endswith(".json") else out + ".png"
    plot(results, png)
    return doc


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


__all__ = ["SUITES", "bench_search", "load_case", "lower_bound", "run_case", "summarize",
           "work_speed_bound"]

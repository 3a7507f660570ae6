"""``placer bench search``: every strategy on every case of a suite.

For each case (graph x cluster) and strategy: the step time of its plan
(analytical model), feasibility and planning time; its ratio to the best
heuristic on that case, to the best of HEFT, m-SCT and pipeline_dp, and to a
lower bound ``max(total work / total speed, critical path on the fastest
device)``. Writes a results JSON and a PNG comparing the ratios.

A case's graph may carry a ``.xN`` suffix (``gpt-1.3b.module.x128``): the
traced batch scaled N times (:func:`evolution.dtfm.scale_batch`), e.g. the
large global batch of the DT-FM paper. Suites: ``quick``, ``hetero``
(heterogeneous and geo-distributed), ``homo`` (homogeneous), ``dtfm``
(the paper's five scenarios) and ``scale`` (planning time of 1,000- and
10,000-op graphs on 16 devices).
"""

from __future__ import annotations

import io
import json
import math
import platform
import time
from typing import Sequence

import numpy as np

from .._io import atomic_write_bytes, atomic_write_text
from ..errors import StrategyError

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
        from evolution.dtfm import scale_batch
        g = scale_batch(g, factor)
    c = bench_cluster(int(cname[5:])) if cname.startswith("bench") else cluster(cname)
    return g, c


def lower_bound(problem) -> float:
    """Total work over total sustained speed. (The critical path on the
    fastest device, reported beside it, bounds only plans without data
    parallelism: replicas split an op's batch.)"""
    g = problem.graph
    work = g.total_flops() + (g.total_bwd_flops() if g.training else 0.0)
    return work / problem.rate.sum()


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
    lb = lower_bound(problem)
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
        rows[name] = {"step_time": rep.step_time, "feasible": bool(rep.feasible),
                      "objective": rep.objective, "planning_seconds": wall,
                      "microbatches": plan.microbatches, "schedule": plan.schedule,
                      "devices_used": len(plan.devices_used())}
        log(f"  {spec:45s} {name:14s} step {rep.step_time:10.4g}s "
            f"{'ok ' if rep.feasible else 'OOM'} {wall:6.1f}s")
    # ratios compare feasible plans only (infeasible ones have no step time to beat)
    feas = {k: v for k, v in rows.items() if v.get("feasible")}
    best_h = min((v["step_time"] for k, v in feas.items() if k in HEURISTICS), default=None)
    best_s = min((v["step_time"] for k, v in feas.items() if k in STRONG), default=None)
    for v in rows.values():
        ok = v.get("feasible")
        v["ratio_best_heuristic"] = v["step_time"] / best_h if ok and best_h else None
        v["ratio_best_strong"] = v["step_time"] / best_s if ok and best_s else None
        v["ratio_lower_bound"] = v["step_time"] / lb if ok else None
    return {"case": spec, "graph": g.name, "ops": len(g), "cluster": c.name,
            "devices": len(c), "lower_bound": lb,
            "critical_path_fastest": critical_path_time(problem), "best_heuristic": best_h,
            "best_of_heft_msct_pipeline_dp": best_s, "strategies": rows}


def summarize(results: list[dict]) -> dict:
    """Per strategy: mean speed-up over the best of HEFT/m-SCT/pipeline_dp
    (``1 - ratio``), worst ratio to the best heuristic, mean ratio to the
    lower bound."""
    out = {}
    names = sorted({n for r in results for n in r["strategies"]})
    for n in names:
        rows = [r["strategies"][n] for r in results if r["strategies"].get(n, {}).get("feasible")]
        if not rows:
            continue
        strong = [x["ratio_best_strong"] for x in rows if x.get("ratio_best_strong")]
        heur = [x["ratio_best_heuristic"] for x in rows if x.get("ratio_best_heuristic")]
        out[n] = {"cases": len(rows),
                  "mean_faster_than_best_strong": 1 - float(np.mean(strong)) if strong else None,
                  "worst_ratio_best_heuristic": max(heur) if heur else None,
                  "mean_ratio_lower_bound": float(np.mean([x["ratio_lower_bound"]
                                                           for x in rows])),
                  "infeasible_cases": sum(1 for r in results
                                          if r["strategies"].get(n, {}).get("feasible") is False),
                  "max_planning_seconds": max(x["planning_seconds"] for x in rows)}
    return out


def plot(results: list[dict], path: str) -> None:
    """Bars of each strategy's ratio to the best heuristic, per case (PNG)."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    names = sorted({n for r in results for n in r["strategies"]
                    if r["strategies"][n].get("feasible")})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(results)), 4.5))
    width = 0.8 / max(len(names), 1)
    for k, n in enumerate(names):
        vals = [min(r["strategies"].get(n, {}).get("ratio_best_heuristic") or np.nan, 3.0)
                for r in results]
        ax.bar(np.arange(len(results)) + k * width, vals, width, label=n)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(results)) + 0.4 - width / 2,
                  [r["case"].replace("@", "\n") for r in results], fontsize=7)
    ax.set_ylabel("step time / best heuristic (capped at 3)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def bench_search(out: str = "bench-search.json", quick: bool = False,
                 suite: str | None = None, strategies: Sequence[str] | None = None,
                 seconds: float | None = None, seed: int = 0, log=print) -> dict:
    """Run a suite and write ``out`` (JSON) and ``out`` with ``.png``."""
    suite = suite or ("quick" if quick else "hetero")
    if suite not in SUITES:
        raise StrategyError(f"unknown suite {suite!r}", field="--suite",
                            fix=f"use one of: {', '.join(SUITES)}")
    spec = SUITES[suite]
    names = list(strategies or spec.get("strategies") or (HEURISTICS + OURS))
    secs = seconds if seconds is not None else spec["time"]
    results = [run_case(case, names, secs, seed, log) for case in spec["cases"]]
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


__all__ = ["SUITES", "bench_search", "load_case", "lower_bound", "run_case", "summarize"]

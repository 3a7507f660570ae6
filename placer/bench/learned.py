"""``placer bench learned``: the learned policy against evolution.

On the test split (model families and cluster scenarios never seen in
training) it runs, per graph x cluster case, through :func:`placer.optimize`
(analytical model in the search, the event simulator for the figures):

- ``greedy``: ``method="rl"`` decoding only the most likely placement (no
  baselines, no re-ranking: the policy alone);
- ``policy``: ``rl`` with greedy plus ``samples`` sampled placements and
  refinement rounds, without the baseline plans (the policy alone);
- ``zero-shot``: ``rl`` as shipped (the above plus the simple baseline plans
  as candidates and refinement from the best), no fine-tuning; its plan's
  ``source`` says which won (policy, refined, polished or baseline);
- ``fine-tuned``: ``rl`` after ``finetune`` seconds of REINFORCE on the case;
- ``evolution`` and ``hybrid`` (policy plans seed evolution's population)
  at the same ``time_budget``.

Each row has the simulated step time, feasibility and planning seconds
(``plan_seconds``: the search's own wall time, from the start of the
strategy to its final plan, without building the problem or the final
simulation, alike for every method); for evolution and hybrid also the trace
of the best (search-model) objective over time.

Time to produce: zero-shot's ``plan_seconds`` against both evolution's
``plan_seconds`` (its whole search; it stops after ``patience`` stale
generations) and, stricter, ``evolution_time_to_final``: the elapsed time of
the first progress event whose best objective is already evolution's final
one (``planning_speedup`` and ``speedup_vs_time_to_final``). The summary
gives the targets: zero-shot step time within 10% of evolution's and at least
100x faster to produce; hybrid reaching evolution's final objective in at
most half of evolution's time to it, or beating it at equal time budget.
"""

from __future__ import annotations

import platform
import time
from typing import Sequence

import numpy as np

from .._io import PathLike, atomic_write_text, dump_json

__all__ = ["bench_learned", "TEST_GRAPHS", "TEST_CLUSTERS"]

TEST_GRAPHS = ("inception.op", "unet.op", "dlrm.op", "moe.op", "gnmt.op")
TEST_CLUSTERS = ("hetero-lab", "edge-wireless", "dtfm-worldwide")
QUICK = {"graphs": ("unet.op", "inception.module"), "clusters": ("hetero-lab", "edge-wireless"),
         "time_budget": 5.0, "finetune": 2.0}


def _run(graph, cluster, method, seed, time_budget, **options):
    from ..search import optimize
    trace: list[tuple[float, float]] = []

    def progress(event):
        if np.isfinite(event.best):
            trace.append((float(event.elapsed), float(event.best)))

    start = time.perf_counter()
    plan = optimize(graph, cluster, method, seed=seed, time_budget=time_budget,
                    progress=progress, **options)
    total = time.perf_counter() - start
    search = plan.predicted.get("search", {})
    return {"step_time": plan.predicted.get("step_time"),
            "feasible": plan.predicted.get("feasible"),
            "search_objective": search.get("objective", search.get("step_time")),
            "plan_seconds": search.get("search_seconds", total),
            "total_seconds": total, "microbatches": plan.microbatches,
            "schedule": plan.schedule, "devices_used": len(plan.devices_used()),
            "source": (plan.extra or {}).get("source"), "trace": trace}


def _warm_up(graph: str, cluster: str, checkpoint, have_evolution: bool) -> None:
    """Load the policy and import every strategy once, untimed, so that the
    first case does not pay one-off costs the others do not."""
    import placer
    g, c = placer.datasets.graph(graph), placer.Cluster.preset(cluster)
    _run(g, c, "rl", 0, None, samples=0, refine=0, checkpoint=checkpoint)
    if have_evolution:
        _run(g, c, "evolution", 0, 0.5)


def _time_to_reach(trace, target: float) -> float | None:
    for elapsed, best in trace:
        if best <= target * (1 + 1e-9):
            return elapsed
    return None


def bench_learned(graphs: Sequence[str] | None = None, clusters: Sequence[str] | None = None,
                  *, time_budget: float = 20.0, finetune: float = 5.0, seed: int = 0,
                  checkpoint=None, samples: int | None = None, quick: bool = False,
                  out: PathLike | None = "bench-learned.json", quiet: bool = False) -> dict:
    """Run the benchmark (see the module doc); prints a table unless
    ``quiet`` and writes the JSON results to ``out`` atomically. ``samples``
    (None: the strategies' defaults) is passed to ``rl`` and ``hybrid``."""
    from ..cost.warmup import warm_up
    warm_up()      # compiled kernels load before any timed search
    import placer
    from ..search import strategies
    if quick:
        graphs = graphs or QUICK["graphs"]
        clusters = clusters or QUICK["clusters"]
        time_budget, finetune = QUICK["time_budget"], QUICK["finetune"]
    graphs = list(graphs or TEST_GRAPHS)
    clusters = list(clusters or TEST_CLUSTERS)
    have_evolution = "evolution" in strategies()
    learned = {"checkpoint": None if checkpoint is None else str(checkpoint)}
    if samples is not None:   # else each learned strategy's own default
        learned["samples"] = samples
    rows = []
    start = time.perf_counter()
    _warm_up(graphs[0], clusters[0], learned["checkpoint"], have_evolution)
    for gname in graphs:
        graph = placer.datasets.graph(gname)
        for cname in clusters:
            cluster = placer.Cluster.preset(cname)
            row = {"graph": gname, "ops": len(graph), "cluster": cname,
                   "devices": len(cluster)}
            # zero-shot planning is not bounded by the time budget: it is its own figure
            row["greedy"] = _run(graph, cluster, "rl", seed, None, samples=0, refine=0,
                                 baselines=False, final=None, polish=0,
                                 checkpoint=learned["checkpoint"])
            row["policy"] = _run(graph, cluster, "rl", seed, None, baselines=False,
                                 polish=0, **learned)
            row["zero_shot"] = _run(graph, cluster, "rl", seed, None, **learned)
            row["fine_tuned"] = _run(graph, cluster, "rl", seed, None, finetune=finetune,
                                     **learned)
            if have_evolution:
                row["evolution"] = _run(graph, cluster, "evolution", seed, time_budget)
                row["hybrid"] = _run(graph, cluster, "hybrid", seed, time_budget, **learned)
                evo, hyb = row["evolution"], row["hybrid"]
                target = evo["search_objective"]
                row["evolution_time_to_final"] = _time_to_reach(evo["trace"], target)
                row["hybrid_time_to_evolution"] = _time_to_reach(hyb["trace"], target)
                z = row["zero_shot"]
                row["zero_shot_vs_evolution"] = z["step_time"] / evo["step_time"]
                row["hybrid_vs_evolution"] = hyb["step_time"] / evo["step_time"]
                row["fine_tuned_vs_evolution"] = row["fine_tuned"]["step_time"] / evo["step_time"]
                row["policy_vs_evolution"] = row["policy"]["step_time"] / evo["step_time"]
                row["planning_speedup"] = evo["plan_seconds"] / max(z["plan_seconds"], 1e-9)
                reach = row["evolution_time_to_final"]
                row["speedup_vs_time_to_final"] = None if reach is None \
                    else reach / max(z["plan_seconds"], 1e-9)
                row["greedy_vs_evolution"] = row["greedy"]["step_time"] / evo["step_time"]
                row["greedy_planning_speedup"] = evo["plan_seconds"] / max(
                    row["greedy"]["plan_seconds"], 1e-9)
            rows.append(row)
            if not quiet:
                print(_line(row), flush=True)
    summary = _summary(rows) if have_evolution else {"note": "evolution strategy unavailable"}
    result = {"benchmark": "learned", "time_budget": time_budget, "finetune": finetune,
              "samples": samples,
              "seed": seed, "graphs": graphs, "clusters": clusters,
              "machine": {"python": platform.python_version(), "cpu": platform.processor()
                          or platform.machine()},
              "rows": rows, "summary": summary,
              "bench_seconds": round(time.perf_counter() - start, 1)}
    if not quiet:
        print(_table(rows))
        for k, v in summary.items():
            print(f"{k}: {v}")
    if out is not None:
        atomic_write_text(out, dump_json(_clean(result)))
    return result


def _summary(rows) -> dict:
    def gmean(values):
        values = [v for v in values if v is not None and np.isfinite(v) and v > 0]
        return float(np.exp(np.mean(np.log(values)))) if values else None

    z = [r["zero_shot_vs_evolution"] for r in rows]
    speed = [r["planning_speedup"] for r in rows]
    strict = [r["speedup_vs_time_to_final"] for r in rows]
    half = []
    for r in rows:
        reach, final = r["hybrid_time_to_evolution"], r["evolution_time_to_final"]
        half.append(reach is not None and final is not None and reach <= 0.5 * max(final, 1e-9))
    beats = [r["hybrid_vs_evolution"] <= 1.0 + 1e-9 for r in rows]
    # where evolution finds no plan that fits, step-time ratios say little
    feasible = [r for r in rows if r["evolution"].get("feasible")]
    zf = [r["zero_shot_vs_evolution"] if r["zero_shot"].get("feasible") else np.inf
          for r in feasible]
    return {
        "cases": len(rows),
        "cases_evolution_feasible": len(feasible),
        "zero_shot_vs_evolution_gmean_feasible": gmean(zf) if np.all(np.isfinite(zf)) else None,
        "zero_shot_within_10pct_feasible": int(sum(v <= 1.10 for v in zf)),
        "zero_shot_vs_evolution_gmean": gmean(z),
        "zero_shot_within_10pct": int(sum(v <= 1.10 for v in z)),
        "planning_speedup_gmean": gmean(speed),
        "planning_speedup_at_least_100x": int(sum(v >= 100 for v in speed)),
        "speedup_vs_time_to_final_gmean": gmean(strict),
        "speedup_vs_time_to_final_at_least_100x": int(sum(v is not None and v >= 100
                                                          for v in strict)),
        "zero_shot_seconds_median": float(np.median([r["zero_shot"]["plan_seconds"]
                                                     for r in rows])),
        "evolution_time_to_final_median": float(np.median(
            [r["evolution_time_to_final"] for r in rows
             if r["evolution_time_to_final"] is not None] or [np.nan])),
        "policy_vs_evolution_gmean": gmean([r["policy_vs_evolution"] for r in rows]),
        "policy_within_10pct": int(sum(r["policy_vs_evolution"] <= 1.10 for r in rows)),
        "zero_shot_sources": {k: sum(r["zero_shot"].get("source") == k for r in rows)
                              for k in ("policy", "refined", "polished", "baseline")},
        "greedy_vs_evolution_gmean": gmean([r["greedy_vs_evolution"] for r in rows]),
        "greedy_within_10pct": int(sum(r["greedy_vs_evolution"] <= 1.10 for r in rows)),
        "greedy_planning_speedup_gmean": gmean([r["greedy_planning_speedup"] for r in rows]),
        "fine_tuned_vs_evolution_gmean": gmean([r["fine_tuned_vs_evolution"] for r in rows]),
        "hybrid_vs_evolution_gmean": gmean([r["hybrid_vs_evolution"] for r in rows]),
        "hybrid_at_most_equal_time_no_worse": int(sum(beats)),
        "hybrid_beats_evolution": int(sum(r["hybrid_vs_evolution"] < 1.0 - 1e-9
                                          for r in rows)),
        "hybrid_reaches_evolution_in_half_time": int(sum(half)),
    }


def _fmt(seconds) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.4g} ms" if seconds < 1 else f"{seconds:.4g} s"


def _line(row) -> str:
    z = row["zero_shot"]
    text = (f"{row['graph']} on {row['cluster']}: zero-shot {_fmt(z['step_time'])} "
            f"in {z['plan_seconds']:.3g}s")
    if "evolution" in row:
        text += (f", evolution {_fmt(row['evolution']['step_time'])}, hybrid "
                 f"{_fmt(row['hybrid']['step_time'])}")
    return text


def _table(rows) -> str:
    head = ["graph", "cluster", "greedy", "plan s", "zero-shot", "plan s", "src", "fine-tuned",
            "evolution", "plan s", "hybrid", "zs/evo", "hyb/evo", "hyb reach s", "evo final s"]
    lines = [head]
    for r in rows:
        evo = r.get("evolution")
        hyb = r.get("hybrid")
        lines.append([
            r["graph"], r["cluster"], _fmt(r["greedy"]["step_time"]),
            f"{r['greedy']['plan_seconds']:.3g}", _fmt(r["zero_shot"]["step_time"]),
            f"{r['zero_shot']['plan_seconds']:.3g}", r["zero_shot"].get("source") or "-",
            _fmt(r["fine_tuned"]["step_time"]),
            _fmt(evo["step_time"]) if evo else "-",
            f"{evo['plan_seconds']:.3g}" if evo else "-",
            _fmt(hyb["step_time"]) if hyb else "-",
            f"{r['zero_shot_vs_evolution']:.3f}" if evo else "-",
            f"{r['hybrid_vs_evolution']:.3f}" if evo else "-",
            "-" if r.get("hybrid_time_to_evolution") is None
            else f"{r['hybrid_time_to_evolution']:.3g}",
            "-" if r.get("evolution_time_to_final") is None
            else f"{r['evolution_time_to_final']:.3g}"])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines)


def _clean(value):
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value

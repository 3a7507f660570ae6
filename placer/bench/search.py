"""``placer bench search``: the heuristics side by side.

For each graph (``placer.datasets`` names: shipped traces or synthetic
generators) and cluster preset, every strategy plans with the analytical
cost model; the plan is scored by the event simulator. Figures are
reported as ratios to ``even_pipeline`` in the same process (step time:
lower is better; planning time), so they compare across machines.
"""

from __future__ import annotations

import math
import platform
import time
from typing import Sequence

from .._io import PathLike, atomic_write_text, dump_json

GRAPHS = ("gpt-125m.op", "inception.op", "layered-n400-w8-s0", "random_dag-n2000-w8-s0")
CLUSTERS = ("two-sites", "hetero-lab", "dtfm-regional")
STRATEGIES = ("single", "round_robin", "even_pipeline", "m_topo", "heft", "m_etf", "m_sct",
              "partition", "pipeline_dp")
QUICK = {"graphs": ("layered-n200-w6-s0",), "clusters": ("two-sites",)}


def bench_search(graphs: Sequence[str] = GRAPHS, clusters: Sequence[str] = CLUSTERS,
                 strategies: Sequence[str] = STRATEGIES, *, seed: int = 0,
                 time_budget: float = 30.0, baseline: str = "even_pipeline",
                 out: PathLike | None = None, quiet: bool = False) -> dict:
    """Run every strategy on every graph x cluster; returns (and writes to
    ``out`` as JSON, atomically) rows of simulated step time, feasibility
    and planning seconds, with ratios to ``baseline``, and prints a table
    unless ``quiet``."""
    from ..cost.warmup import warm_up
    warm_up()      # compiled kernels load before any timed search
    import placer
    from ..search import optimize

    names = list(strategies)
    if baseline not in names:
        names.insert(0, baseline)
    rows = []
    for gname in graphs:
        graph = placer.datasets.graph(gname)
        for cname in clusters:
            cluster = placer.Cluster.preset(cname)
            base = None
            results = []
            for name in [baseline] + [n for n in names if n != baseline]:
                start = time.perf_counter()
                plan = optimize(graph, cluster, name, seed=seed, time_budget=time_budget)
                seconds = time.perf_counter() - start
                row = {"graph": gname, "ops": len(graph), "cluster": cname, "strategy": name,
                       "step_time": plan.predicted["step_time"],
                       "feasible": plan.predicted["feasible"],
                       "search_step_time": plan.predicted["search"].get("step_time"),
                       "plan_seconds": plan.predicted["search"].get("search_seconds", seconds),
                       "total_seconds": seconds, "microbatches": plan.microbatches,
                       "schedule": plan.schedule, "devices_used": len(plan.devices_used())}
                if name == baseline:
                    base = row
                results.append(row)
            for row in results:
                row["step_ratio"] = _ratio(row["step_time"], base["step_time"])
                row["plan_time_ratio"] = _ratio(row["plan_seconds"], base["plan_seconds"])
            rows.extend(results)
    doc = {"format": "placer.bench.search/v1", "baseline": baseline, "seed": seed,
           "machine": {"python": platform.python_version(), "platform": platform.platform()},
           "rows": rows}
    if not quiet:
        print(table(rows))
    if out is not None:
        atomic_write_text(out, dump_json(doc))
    return doc


def _ratio(a: float, b: float) -> float | None:
    if b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def table(rows: Sequence[dict]) -> str:
    """A fixed-width text table of :func:`bench_search` rows."""
    head = (f"{'graph':<24} {'cluster':<15} {'strategy':<14} {'step (sim)':>11} "
            f"{'vs base':>8} {'feas':>5} {'plan s':>8} {'vs base':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        sr = "-" if r["step_ratio"] is None else f"{r['step_ratio']:.3f}"
        pr = "-" if r["plan_time_ratio"] is None else f"{r['plan_time_ratio']:.2f}"
        lines.append(f"{r['graph'][:24]:<24} {r['cluster'][:15]:<15} {r['strategy']:<14} "
                     f"{r['step_time']:>11.4g} {sr:>8} {'yes' if r['feasible'] else 'NO':>5} "
                     f"{r['plan_seconds']:>8.3f} {pr:>8}")
    return "\n".join(lines)

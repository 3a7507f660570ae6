"""Place GPT-1.3B on geo-distributed clusters and compare strategies.

The shipped ``gpt-1.3b.module`` graph (costs of one training step, traced
from the zoo model) is placed on two DT-FM scenarios -- 64 V100s in eight
cities around the world (``dtfm-worldwide``) and in one region
(``dtfm-regional``) -- by a few strategies with short time budgets. Each plan
is scored by the event simulator; the best one's schedule is drawn as a Gantt
chart.

    python examples/geo_gpt.py                  # ~40 s on a laptop CPU
    python examples/geo_gpt.py --budget 30 --out /tmp/geo   # longer searches

Prints one table row per (cluster, strategy) and ``best on CLUSTER: ...``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import placer

CLUSTERS = ["dtfm-worldwide", "dtfm-regional"]
STRATEGIES = ["even_pipeline", "pipeline_dp", "dtfm", "evolution"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="gpt-1.3b.module")
    parser.add_argument("--budget", type=float, default=4.0,
                        help="seconds of search per strategy and cluster")
    parser.add_argument("--out", help="folder for the Gantt charts (default: a temp folder)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="placer-geo-"))
    out.mkdir(parents=True, exist_ok=True)

    graph = placer.datasets.graph(args.graph)
    totals = graph.totals()
    print(f"{graph.name}: {totals['ops']} ops, {totals['param_bytes'] / 1e9:.2f} GB of "
          f"parameters, {totals['flops'] + totals['bwd_flops']:.3g} FLOP per step")
    print(f"{'cluster':<16}{'strategy':<15}{'step (s)':>10}{'feasible':>10}"
          f"{'devices':>9}{'mb':>5}{'search (s)':>12}")
    for name in CLUSTERS:
        cluster = placer.Cluster.preset(name)
        best = None
        for method in STRATEGIES:
            start = time.perf_counter()
            plan = placer.optimize(graph, cluster, method=method, seed=0,
                                   time_budget=args.budget)
            seconds = time.perf_counter() - start
            report = placer.simulate(graph, cluster, plan)
            used = len({d for ds in plan.placement.values() for d in ds})
            print(f"{name:<16}{method:<15}{report.step_time:>10.3f}{str(report.feasible):>10}"
                  f"{used:>9}{plan.microbatches:>5}{seconds:>12.1f}")
            key = (not report.feasible, report.step_time)
            if best is None or key < best[0]:
                best = (key, method, plan, report)
        _, method, plan, report = best
        gantt = out / f"{graph.name}.{name}.{method}.gantt.png"
        report.plot_gantt(gantt, title=f"{graph.name} on {name} ({method})")
        plan.save(out / f"{graph.name}.{name}.{method}.plan.json")
        print(f"best on {name}: {method}, step {report.step_time:.3f} s "
              f"({report.summary().splitlines()[1]}); Gantt chart {gantt}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

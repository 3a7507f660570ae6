"""``placer bench search --suite bigraph``: planning 100,000-op graphs on 64 devices.

Cases: a generated graph (``layered-nN-w8-s0`` on ``dtfm-worldwide``) and a
foundation model at op granularity (GPT-125M's block repeated to ``N`` ops
by :func:`placer.deepen.deepen`, batch 8 x 256 tokens, on the generated
64-GPU cluster ``regions-d64-r4-s0``). Each runs ``heft`` and
``pipeline_dp`` on the whole graph and ``evolution`` through ``optimize``'s
coarsen-search-refine path, each in a fresh process, so its peak memory
(``ru_maxrss``) is its own. Reported per run: wall seconds (loading the
graph file excluded and reported apart), the search's own seconds, the
final step time and which model gave it, feasibility, peak RSS.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

#: run on the whole graph, as the reference
BASELINES = ("heft", "pipeline_dp")

#: (case, graph, cluster)
CASES = {"generated": ("layered-n{n}-w8-s0", "dtfm-worldwide"),
         "gpt": ("gpt-125m-deep-n{n}", "regions-d64-r4-s0")}


def _graph(spec: str, n: int):
    import placer
    if spec.startswith("gpt-125m-deep"):
        from placer.deepen import deepen
        return deepen("gpt-125m", max(3, round((n - 7) / 17)), batch=8, seq=256)
    return placer.datasets.graph(spec.format(n=n))


def _cluster(name: str):
    import placer
    from placer import generators
    return generators.cluster(name) if generators.is_cluster(name) else \
        placer.Cluster.preset(name)


def _one(path: str, cluster: str, method: str, seconds: float, seed: int, queue) -> None:
    import resource
    import placer
    from placer.cost.warmup import warm_up
    from placer.search import optimize_with_report
    warm_up()
    start = time.perf_counter()
    graph = placer.Graph.load(path)
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    lines = []

    def progress(event):
        if event.message and "generation" not in event.message:
            lines.append(f"{time.perf_counter() - start:.1f}s {event.message}")
            print(f"  [{method}] {lines[-1]}", file=sys.stderr, flush=True)
    # the baselines see the whole graph; the search coarsens it (the default)
    plan, report = optimize_with_report(graph, _cluster(cluster), method, seed=seed,
                                        time_budget=seconds, progress=progress,
                                        coarsen=None if method in BASELINES else "auto")
    search = plan.predicted["search"]
    queue.put({"method": method, "ops": len(graph), "load_seconds": round(loaded, 2),
               "wall_seconds": round(time.perf_counter() - start, 1),
               "search_seconds": round(search["search_seconds"], 1),
               "step_time": report.step_time, "feasible": report.feasible,
               "final_model": search.get("final_model", report.model),
               "coarsened": (plan.extra.get("search") or {}).get("coarsened"),
               "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                                    2)})


def run_case(case: str, n: int, methods=("heft", "pipeline_dp", "evolution"),
             seconds: float = 120.0, seed: int = 0, folder: str = ".") -> dict:
    """One case at ``n`` ops: each method in a fresh process."""
    spec, cluster = CASES[case]
    graph = _graph(spec, n)
    path = Path(folder) / f"bigraph-{case}-{len(graph)}.json"
    graph.save(path)
    rows = []
    ctx = mp.get_context("spawn")
    for method in methods:
        queue = ctx.Queue()
        proc = ctx.Process(target=_one, args=(str(path), cluster, method, seconds, seed, queue))
        proc.start()
        rows.append(queue.get())
        proc.join()
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    path.unlink()
    best = min((r["step_time"] for r in rows if r["method"] in BASELINES
                and r["feasible"]), default=None)
    for r in rows:
        r["vs_best_baseline"] = None if best is None else round(r["step_time"] / best, 3)
    return {"case": case, "graph": graph.name, "ops": len(graph), "cluster": cluster,
            "time_budget": seconds, "runs": rows}


def bench_bigraph(out: str, sizes=(100_000,), cases=("generated", "gpt"),
                  seconds: float = 120.0, seed: int = 0) -> dict:
    """Every case at every size; writes ``out`` (JSON) and returns it."""
    from .._io import atomic_write_text, dump_json
    doc = {"bench": "bigraph", "date": time.strftime("%Y-%m-%d"), "results": []}
    for case in cases:
        for n in sizes:
            doc["results"].append(run_case(case, n, seconds=seconds, seed=seed,
                                           folder=str(Path(out).parent)))
            atomic_write_text(out, dump_json(doc))
    return doc


def _budget_run(n: int, budget: float, method: str, queue) -> None:
    import resource
    import placer
    from placer.cost.warmup import warm_up
    from placer.search import optimize_with_report
    warm_up()
    graph = placer.datasets.graph(f"random_dag-n{n}-w8-s0")
    start = time.perf_counter()
    plan, report = optimize_with_report(graph, placer.Cluster.preset("dtfm-worldwide"), method,
                                        seed=0, time_budget=budget)
    wall = time.perf_counter() - start
    search = plan.predicted["search"]
    queue.put({"ops": n, "method": method, "budget": budget,
               "search_seconds": round(search["search_seconds"], 2),
               "overrun": round(search["search_seconds"] / budget - 1, 3),
               "wall_seconds": round(wall, 2), "step_time": report.step_time,
               "final_model": search.get("final_model", report.model),
               "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                                    2)})


def budgets(n: int, budget: float, methods) -> list[dict]:
    """Each of ``methods`` on ``random_dag-n{n}-w8-s0`` @ dtfm-worldwide with
    ``budget`` seconds, in a fresh process: its search seconds, overrun,
    wall seconds of ``optimize`` (final scoring included, generating the
    graph and compiling kernels not), peak RSS and the host's load."""
    rows = []
    ctx = mp.get_context("spawn")
    for method in methods:
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        queue = ctx.Queue()
        proc = ctx.Process(target=_budget_run, args=(n, budget, method, queue))
        proc.start()
        rows.append({**queue.get(), "load": load})
        proc.join()
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    # python -m placer.bench.bigraph OUT CASE N [SECONDS] [METHODS]
    # python -m placer.bench.bigraph OUT budgets N SECONDS METHODS
    from placer._io import atomic_write_text, dump_json
    args = sys.argv[1:]
    if args[1] == "budgets":
        result = budgets(int(args[2]), float(args[3]), args[4].split(","))
    else:
        result = run_case(args[1], int(args[2]),
                          methods=tuple(args[4].split(",")) if len(args) > 4 else
                          ("heft", "pipeline_dp", "evolution"),
                          seconds=float(args[3]) if len(args) > 3 else 120.0,
                          folder=str(Path(args[0]).parent))
    atomic_write_text(args[0], dump_json(result))
    print(json.dumps(result, indent=1))

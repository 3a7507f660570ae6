"""The same evolution search on the local pool and on Ray: wall time and
speed-up per worker added, and that the plan is the same everywhere.

    python -m placer.bench.backends -o bench-backends.json

runs evolution (an evaluation budget, so the plan is fixed by the seed) on
one graph and cluster: in this process (the local backend with one worker),
on a local pool of two, then on a two-node Ray cluster started here
(``ray start``, one CPU per node; see :mod:`placer.bench.raycluster`) with
one worker and with two; each search in a fresh process, whose peak memory
(the driver's) is reported with the seconds at which its phases began.
By default the screening model is the simulator, whose estimates are
costly enough for workers to pay. On a graph over 20,000 ops
(``--screen default``) the search is coarsened: the workers then take the
rankings by the simulator and the refinement's batches on the whole graph
(:mod:`placer.search.parallel`); the seeding heuristics and the genetic
algorithm's driver run in the driver whatever the backend.

    python -m placer.bench.backends --graph layered-n100000-w8-s0 --screen default \
        --evaluations 1000 --runs local1 pool2 ray1 ray2 -o backends-100k.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time

from .._io import atomic_write_text


def _search(graph: str, cluster: str, evaluations: int, seed: int, screen: str, coarsen,
            backend: str, workers: int, queue) -> None:
    """One search in a fresh process (its peak memory is its own): its
    row, with the seconds at which each phase began, onto ``queue``."""
    import resource
    import placer
    from placer.cost.warmup import warm_up
    warm_up()
    g = placer.datasets.graph(graph)
    c = placer.Cluster.preset(cluster)
    phases: list = []
    t0 = time.perf_counter()

    def progress(event) -> None:
        if event.message and "generation" not in event.message:
            phases.append([round(time.perf_counter() - t0, 1), event.message])
    options = {} if screen == "default" else {"screen": screen}
    plan = placer.optimize(g, c, "evolution", seed=seed, time_budget=None,
                           evaluations=evaluations, backend=backend, workers=workers,
                           progress=progress, coarsen=coarsen, **options)
    wall = time.perf_counter() - t0
    digest = hashlib.sha256(json.dumps(sorted(plan.placement.items())).encode()).hexdigest()
    queue.put({"seconds": round(wall, 2), "step_time": plan.predicted["step_time"],
               "microbatches": plan.microbatches, "schedule": plan.schedule,
               "placement_sha256": digest,
               "evaluations": plan.predicted["search"].get("evaluations"),
               "driver_peak_rss_gb": round(
                   resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
               "phases": phases})


#: the runs: label, backend (``ray`` runs on the two-node cluster), workers
RUNS = {"local1": ("local, 1 worker (in process)", "local", 1),
        "pool2": ("local pool, 2 workers", "local", 2),
        "ray1": ("ray, 1 worker (2-node cluster)", "auto", 1),
        "ray2": ("ray, 2 workers (2-node cluster)", "auto", 2)}


def bench_backends(graph: str = "random_dag-n20000-w8-s0", cluster: str = "dtfm-worldwide",
                   evaluations: int = 240, seed: int = 0,
                   runs: tuple = ("local1", "ray1", "ray2"), log=print,
                   screen: str = "simulator", coarsen="auto") -> list[dict]:
    """Run the searches ``runs`` (keys of :data:`RUNS`; see the module doc),
    each in a fresh process; returns their rows. ``screen``: evolution's
    screening model (``"default"``: its own choice); ``coarsen``: as
    :func:`placer.optimize`'s."""
    import multiprocessing as mp
    from .raycluster import local_cluster
    rows = []
    ctx = mp.get_context("spawn")

    def run(key: str) -> None:
        label, backend, workers = RUNS[key]
        row = {"run": key, "label": label, "backend": backend, "workers": workers,
               "load_before": os.getloadavg()}
        queue = ctx.Queue()
        proc = ctx.Process(target=_search, args=(graph, cluster, evaluations, seed, screen,
                                                 coarsen, backend, workers, queue))
        proc.start()
        row.update(queue.get())
        proc.join()
        row["load_after"] = os.getloadavg()
        rows.append(row)
        log(f"{label}: {row['seconds']} s, step {row['step_time']:.6g} s, driver "
            f"{row['driver_peak_rss_gb']} GB", flush=True)

    for key in runs:
        if RUNS[key][1] == "local":
            run(key)
    remote = [key for key in runs if RUNS[key][1] != "local"]
    if remote:
        with local_cluster(nodes=2, cpus=1) as address:
            os.environ["RAY_ADDRESS"] = address
            try:
                for key in remote:
                    run(key)
            finally:
                os.environ.pop("RAY_ADDRESS", None)
    return rows


def summarize(doc: dict) -> dict:
    """Speed-ups against the in-process run and per Ray worker added, and
    whether every run found the same plan."""
    by = {r["run"]: r for r in doc["runs"]}
    if "local1" in by:
        for row in doc["runs"]:
            row["speedup"] = round(by["local1"]["seconds"] / row["seconds"], 3)
    if "ray1" in by and "ray2" in by:
        doc["speedup_per_ray_worker_added"] = round(by["ray1"]["seconds"]
                                                    / by["ray2"]["seconds"], 3)
    doc["same_plan_everywhere"] = len({(r["placement_sha256"], r["step_time"],
                                        r["microbatches"], r["schedule"])
                                       for r in doc["runs"]}) == 1
    return doc


def main(argv: list[str] | None = None) -> int:
    """Command line of this benchmark: runs merge into ``--output`` (a run
    of the same key is replaced), so the runs may go in several calls."""
    p = argparse.ArgumentParser(prog="python -m placer.bench.backends",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", default="bench-backends.json")
    p.add_argument("--graph", default="random_dag-n20000-w8-s0")
    p.add_argument("--cluster", default="dtfm-worldwide")
    p.add_argument("--evaluations", type=int, default=240)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--coarsen", default="auto", type=lambda v: v if v == "auto" else int(v),
                   help="coarsen the graph to this many groups first (auto: above "
                        "20,000 ops)")
    p.add_argument("--screen", default="simulator", choices=["simulator", "default"],
                   help="evolution's screening model (default: its own choice, the "
                        "analytical model on big graphs)")
    p.add_argument("--runs", nargs="+", choices=list(RUNS), default=["local1", "ray1", "ray2"])
    args = p.parse_args(argv)
    setup = {"graph": args.graph, "cluster": args.cluster, "evaluations": args.evaluations,
             "seed": args.seed, "method": "evolution", "screen": args.screen,
             "coarsen": args.coarsen}
    doc = {**setup, "runs": []}
    if os.path.exists(args.output):
        with open(args.output) as f:
            old = json.load(f)
        if {k: old.get(k) for k in setup} == setup:
            doc["runs"] = [r for r in old["runs"] if r["run"] not in args.runs]
    doc["runs"] += bench_backends(args.graph, args.cluster, args.evaluations, args.seed,
                                  tuple(args.runs), screen=args.screen,
                                  coarsen=args.coarsen)
    doc["runs"].sort(key=lambda r: list(RUNS).index(r["run"]))
    doc.update(cpus=os.cpu_count(), machine=platform.platform(),
               python=sys.version.split()[0])
    summarize(doc)
    atomic_write_text(args.output, json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc.get(k) for k in ("speedup_per_ray_worker_added",
                                              "same_plan_everywhere")}))
    return 0 if doc["same_plan_everywhere"] else 1


if __name__ == "__main__":
    sys.exit(main())

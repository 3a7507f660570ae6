"""The same evolution search on the local pool and on Ray: wall time and
speed-up per worker added, and that the plan is the same everywhere.

    python -m placer.bench.backends -o docs/bench/backends.json

runs evolution (an evaluation budget, so the plan is fixed by the seed) on
one graph and cluster: in this process (the local backend with one worker),
then on a two-node Ray cluster started here (``ray start``, one CPU per
node; see :mod:`placer.bench.raycluster`) with one worker and with two.
The screening model is the simulator, whose estimates are costly enough
for workers to pay; the searches' serial parts (seeding heuristics, the
final ranking on the full graph) run in the driver whatever the backend.
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


def _search(graph, cluster, evaluations: int, seed: int, **options) -> dict:
    import placer
    t0 = time.perf_counter()
    plan = placer.optimize(graph, cluster, "evolution", seed=seed, time_budget=None,
                           evaluations=evaluations, screen="simulator", **options)
    wall = time.perf_counter() - t0
    digest = hashlib.sha256(json.dumps(sorted(plan.placement.items())).encode()).hexdigest()
    return {"seconds": round(wall, 2), "step_time": plan.predicted["step_time"],
            "microbatches": plan.microbatches, "schedule": plan.schedule,
            "placement_sha256": digest,
            "evaluations": plan.predicted["search"].get("evaluations")}


def bench_backends(graph: str = "random_dag-n20000-w8-s0", cluster: str = "dtfm-worldwide",
                   evaluations: int = 240, seed: int = 0, local_pool: bool = False,
                   log=print) -> dict:
    """Run the searches (see the module doc); returns the results."""
    import placer
    from placer.cost.warmup import warm_up
    from placer.executors import connect
    from .raycluster import local_cluster
    warm_up()
    g = placer.datasets.graph(graph)
    c = placer.Cluster.preset(cluster)
    runs = []

    def run(label: str, backend: str, workers: int) -> None:
        row = {"label": label, "backend": backend, "workers": workers,
               **_search(g, c, evaluations, seed, backend=backend, workers=workers)}
        runs.append(row)
        log(f"{label}: {row['seconds']} s, step {row['step_time']:.6g} s", flush=True)

    run("local, 1 worker (in process)", "local", 1)
    if local_pool:
        run("local pool, 2 workers", "local", 2)
    with local_cluster(nodes=2, cpus=1) as address:
        os.environ["RAY_ADDRESS"] = address
        try:
            connect("auto")
            run("ray, 1 worker (2-node cluster)", "auto", 1)
            run("ray, 2 workers (2-node cluster)", "auto", 2)
        finally:
            os.environ.pop("RAY_ADDRESS", None)
    base = runs[0]["seconds"]
    for row in runs:
        row["speedup"] = round(base / row["seconds"], 3)
    ray1, ray2 = runs[-2]["seconds"], runs[-1]["seconds"]
    same = len({(r["placement_sha256"], r["step_time"], r["microbatches"], r["schedule"])
                for r in runs}) == 1
    return {"graph": graph, "cluster": cluster, "evaluations": evaluations, "seed": seed,
            "method": "evolution", "screen": "simulator", "runs": runs,
            "speedup_per_ray_worker_added": round(ray1 / ray2, 3),
            "same_plan_everywhere": same, "cpus": os.cpu_count(),
            "load_before": os.getloadavg(), "machine": platform.platform(),
            "python": sys.version.split()[0]}


def main(argv: list[str] | None = None) -> int:
    """Command line of this benchmark."""
    p = argparse.ArgumentParser(prog="python -m placer.bench.backends",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", default="bench-backends.json")
    p.add_argument("--graph", default="random_dag-n20000-w8-s0")
    p.add_argument("--cluster", default="dtfm-worldwide")
    p.add_argument("--evaluations", type=int, default=240)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--local-pool", action="store_true",
                   help="also run the local process pool with two workers")
    args = p.parse_args(argv)
    load = os.getloadavg()
    doc = bench_backends(args.graph, args.cluster, args.evaluations, args.seed,
                         args.local_pool)
    doc["load_before"], doc["load_after"] = load, os.getloadavg()
    atomic_write_text(args.output, json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("speedup_per_ray_worker_added",
                                          "same_plan_everywhere")}))
    return 0 if doc["same_plan_everywhere"] else 1


if __name__ == "__main__":
    sys.exit(main())

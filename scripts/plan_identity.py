"""Fixed-seed searches under an evaluation budget, one line each: the
method, problem, seed, a digest of the plan (placement, microbatches,
schedule) and its predicted step time. Two runs of this script on two
versions of the code give the same lines when a change keeps the
searches' behaviour.

    python scripts/plan_identity.py > before.txt   # on one version
    python scripts/plan_identity.py > after.txt    # on the other
    diff before.txt after.txt

``--quick`` runs one problem at one seed (``tests/test_plan_identity.py``
checks that a line repeats).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import placer

METHODS = ("evolution", "dtfm", "rl", "hybrid", "heft", "pipeline_dp", "partition")
PROBLEMS = (("inception.module", "hetero-lab"), ("dlrm.module", "edge-wireless"),
            ("gnmt.module", "two-sites"))
SEEDS = (0, 1)
EVALUATIONS = 600


def digest(plan) -> str:
    """A short hash of ``plan``'s placement, microbatches and schedule."""
    body = json.dumps([sorted((op, list(devs)) for op, devs in plan.placement.items()),
                       int(plan.microbatches), plan.schedule])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def run(method: str, graph: str, cluster: str, seed: int, evaluations: int) -> str:
    """One search's line: ``method graph@cluster seed digest step_time``."""
    plan = placer.optimize(placer.datasets.graph(graph), placer.Cluster.preset(cluster),
                           method, seed=seed, time_budget=None, evaluations=evaluations)
    return (f"{method} {graph}@{cluster} {seed} {digest(plan)} "
            f"{plan.predicted['step_time']:.9e}")


def main(argv=None) -> None:
    """Print one line per search (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one problem, one seed")
    ap.add_argument("--methods", nargs="*", default=list(METHODS))
    ap.add_argument("--evaluations", type=int, default=EVALUATIONS)
    args = ap.parse_args(argv)
    problems = PROBLEMS[:1] if args.quick else PROBLEMS
    seeds = SEEDS[:1] if args.quick else SEEDS
    for method in args.methods:
        for graph, cluster in problems:
            for seed in seeds:
                print(run(method, graph, cluster, seed, args.evaluations), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

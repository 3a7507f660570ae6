"""hybrid against evolution alone at the same evaluation budget and seed,
on the cases of ``tests/test_gnn.py``'s hybrid test (and a few more): one
JSON line per case and seed with both plans' final (simulator) objectives,
their ratio and where each winner came from.

    python scripts/hybrid_check.py dlrm.op 1,2,3,4,5,6
    python scripts/hybrid_check.py layered,dlrm.module,moe.op 1,2,3
"""
from __future__ import annotations

import argparse
import json
import time

from placer import datasets
from placer.cost import Problem, get_cost_model
from placer.search import Budget, get_strategy

#: name -> (graph, cluster, evaluations, evolution's options)
CASES = {
    "layered": ("layered-n30-w4-s0", "hetero-lab", 1500, {"population": 16}),
    "dlrm.module": ("dlrm.module", "edge-wireless", 1500,
                    {"population": 16, "patience": 5, "restarts": 0}),
    "dlrm.op": ("dlrm.op", "hetero-lab", 4000, {}),
    "dlrm.op-edge": ("dlrm.op", "edge-wireless", 4000, {}),
    "moe.op": ("moe.op", "hetero-lab", 4000, {}),
    "moe.op-edge": ("moe.op", "edge-wireless", 4000, {}),
    "inception.op": ("inception.op", "hetero-lab", 4000, {}),
    "unet.op": ("unet.op", "hetero-lab", 4000, {}),
}


def compare(name: str, seed: int) -> dict:
    """One case at one seed: evolution's and hybrid's plans by the simulator."""
    graph, cluster, evaluations, options = CASES[name]
    problem = Problem(datasets.graph(graph), datasets.cluster(cluster))
    cost, sim = get_cost_model("analytical"), get_cost_model("simulator")

    def run(strategy, **strategy_options):
        budget = Budget(evaluations=evaluations)
        return get_strategy(strategy, **strategy_options).search(
            problem, budget.meter(cost), budget, seed=seed)

    start = time.perf_counter()
    evo, hyb = run("evolution", **options), run("hybrid", evolution=options)
    e, h = sim.estimate(problem, evo), sim.estimate(problem, hyb)
    return {"case": name, "seed": seed, "evolution": e.objective, "hybrid": h.objective,
            "ratio": h.objective / e.objective, "feasible": [e.feasible, h.feasible],
            "origin": [(p.extra or {}).get("search", {}).get("origin") for p in (evo, hyb)],
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("seeds", help="comma-separated seeds")
    args = parser.parse_args()
    for name in args.cases.split(","):
        if name not in CASES:
            parser.error(f"unknown case {name!r}: one of {', '.join(CASES)}")
        for seed in args.seeds.split(","):
            print(json.dumps(compare(name, int(seed))), flush=True)


if __name__ == "__main__":
    main()

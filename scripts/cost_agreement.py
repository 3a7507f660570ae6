"""How well the analytical model ranks the moves a local search weighs.

For each learned-bench case (test split graphs x clusters) it takes the rl
strategy's best few candidate plans over several devices (no polish), and
around each the moves a descent would score: evolution's memetic
neighbourhood (48) and the widening replica moves (24). Each neighbourhood
is scored by both cost models; reported per neighbourhood and summarised:
the Kendall rank correlation between the two models, the median
``|log(analytical / simulator)|``, and ``move``: the simulator's step time of
the neighbour the analytical model ranks best over the start's (above 1:
the descent would take a step the simulator calls worse).

    python scripts/cost_agreement.py -o agreement.json
"""

from __future__ import annotations

import argparse

import numpy as np

import placer
from placer._io import atomic_write_text, dump_json
from placer.bench.learned import TEST_CLUSTERS, TEST_GRAPHS
from placer.cost import INFEASIBLE, Problem, get_cost_model
from placer.cost.warmup import warm_up
from placer.search.base import Budget


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-a of two equally long sequences (ties count for neither)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    concordant = discordant = 0
    for i in range(len(a) - 1):
        s = np.sign(a[i + 1:] - a[i]) * np.sign(b[i + 1:] - b[i])
        concordant += int((s > 0).sum())
        discordant += int((s < 0).sum())
    return (concordant - discordant) / max(concordant + discordant, 1)


def neighbourhoods(problem: Problem, starts: int = 4, seed: int = 0):
    """Yield ``(start, neighbours)`` genomes around rl's best candidates."""
    from placer.space import OpGenome, Space, neighbourhood
    from gnn.candidates import replica_moves
    from gnn.checkpoint import load_policy
    from gnn.problems import microbatch_choices
    from gnn.strategies import policy_plans
    space = Space(problem, microbatch_choices(problem), ("1f1b",))
    found = policy_plans(load_policy(None), problem, get_cost_model("analytical"), Budget(),
                         keep=16, polish=0, widen=False)
    D = problem.n_devices
    # single-device groups only: the candidates' data-parallel ids belong to
    # another group table than this space's
    found = [c for c in found if len(np.unique(c.assign)) > 1 and c.assign.max() < D]
    rng = np.random.default_rng(seed)
    for c in found[:starts]:
        g = OpGenome(c.assign.copy(), c.microbatches, c.schedule)
        near = [x for x in neighbourhood(space, g, rng, 48) if x.schedule == c.schedule]
        yield space, g, near + replica_moves(space, g, rng, 24)


def measure(graphs=TEST_GRAPHS, clusters=TEST_CLUSTERS) -> dict:
    """Per case, per neighbourhood figures and the summary (see the module doc)."""
    from placer.space import compact
    warm_up()
    models = [get_cost_model("analytical"), get_cost_model("simulator")]
    cases, taus, errors, moves = {}, [], [], []
    for gname in graphs:
        graph = placer.datasets.graph(gname)
        for cname in clusters:
            problem = Problem(graph, placer.Cluster.preset(cname))
            rows = []
            for space, start, near in neighbourhoods(problem):
                plans = [start] + near
                A, used = compact(np.stack([x.assign for x in plans]), space)
                ana, sim = (np.array([m.step_times(problem, A[i:i + 1], groups=tuple(used),
                                                   microbatches=x.microbatches,
                                                   schedule=x.schedule)[0]
                                      for i, x in enumerate(plans)]) for m in models)
                fits = (ana < INFEASIBLE) & (sim < INFEASIBLE)
                if fits.sum() < 4:
                    continue
                best = int(np.argmin(np.where(fits, ana, np.inf)))
                row = {"plans": int(fits.sum()),
                       "tau": kendall_tau(ana[fits], sim[fits]),
                       "log_error": float(np.median(np.abs(np.log(ana[fits] / sim[fits])))),
                       "move": float(sim[best] / sim[0])}
                rows.append(row)
                taus.append(row["tau"])
                errors.append(row["log_error"])
                moves.append(row["move"])
            cases[f"{gname}@{cname}"] = rows
            print(f"{gname:14s} {cname:15s} " + " ".join(
                f"[tau {r['tau']:.3f} err {r['log_error']:.3f} move {r['move']:.3f}]"
                for r in rows), flush=True)
    summary = {"neighbourhoods": len(taus),
               "median_tau": float(np.median(taus)) if taus else None,
               "mean_tau": float(np.mean(taus)) if taus else None,
               "median_log_error": float(np.median(errors)) if errors else None,
               "move_gmean": float(np.exp(np.mean(np.log(moves)))) if moves else None,
               "moves_worse": int(sum(m > 1 + 1e-9 for m in moves))}
    return {"cases": cases, "summary": summary}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", default="cost-agreement.json")
    args = parser.parse_args(argv)
    result = measure()
    print(result["summary"])
    atomic_write_text(args.out, dump_json(result))


if __name__ == "__main__":
    main()

"""Train a GNN placement policy for a few iterations, then place with it.

A tiny REINFORCE run (:func:`gnn.train.train`, what ``train_policy.py`` and
``placer train`` run) writes a checkpoint into a temporary folder; then
``placer.optimize(..., method="rl", checkpoint=STEM)`` places a held-out
graph with it, beside the shipped default policy (no ``checkpoint``) and the
``even_pipeline`` baseline. A few iterations teach the policy little: the
point is the workflow, not the numbers.

    python examples/train_and_use_policy.py              # ~20 s on a laptop CPU
    python examples/train_and_use_policy.py --iterations 200   # a real (short) run

The same from the shell:

    python train_policy.py --iterations 5 --graphs layered-n40-w4-s0 -o /tmp/p/policy
    placer plan utransformer.module --cluster two-sites --method rl -o plan.json

Prints ``trained N iterations``, one line per method and ``checkpoint STEM``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import placer
from gnn.train import TrainConfig, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--out", help="checkpoint stem (default: in a temp folder)")
    args = parser.parse_args(argv)
    stem = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="placer-policy-")) / "policy"

    # Small graphs, two training clusters, few samples: seconds per iteration.
    config = TrainConfig(seed=0, iterations=args.iterations, problems=2, samples=4,
                         graphs=["layered-n40-w4-s0", "series_parallel-n40-s1",
                                 "gpt-125m.module"],
                         clusters=["two-sites", "a100x8"], checkpoint_every=args.iterations,
                         policy={"hidden": 32, "layers": 2})
    start = time.perf_counter()
    trainer = train(config, stem, progress=False, validate=False)
    last = trainer.history[-1]
    print(f"trained {trainer.iteration} iterations in {time.perf_counter() - start:.1f} s; "
          f"last mean reward {last['reward']:.3f}, best {last['best']:.3f}")
    print(f"checkpoint {stem} ({', '.join(sorted(p.name for p in stem.parent.iterdir()))})")

    # A graph from the validation split (a family the policy never trained on).
    graph = placer.datasets.graph("utransformer.module")
    cluster = placer.Cluster.preset("two-sites")
    print(f"placing {graph.name} ({len(graph)} ops) on {cluster.name} ({len(cluster)} devices):")
    runs = [("rl, this checkpoint", "rl", {"checkpoint": stem}),
            ("rl, shipped policy", "rl", {}),
            ("even_pipeline", "even_pipeline", {})]
    for label, method, options in runs:
        start = time.perf_counter()
        plan = placer.optimize(graph, cluster, method=method, seed=0, time_budget=2,
                               **options)
        report = placer.simulate(graph, cluster, plan)
        used = len({d for ds in plan.placement.values() for d in ds})
        print(f"  {label:<22} step {report.step_time * 1e3:8.2f} ms  feasible {report.feasible}"
              f"  on {used} device(s)  ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

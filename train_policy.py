"""Train a placement policy over the training split of graphs and clusters.

    python train_policy.py --iterations 1000 -o gnn/checkpoints/policy
    python train_policy.py --resume -o gnn/checkpoints/policy --iterations 1500
    python train_policy.py --tune 20 --tune-iterations 100

See :mod:`gnn.train` for what it does; :func:`main` is also what
``placer train`` runs.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), train, return the exit status."""
    from gnn.train import main as run
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())

"""Benchmarks behind ``placer bench`` (see :func:`placer.bench.cost.bench_cost`)."""

from __future__ import annotations

__all__ = ["bench_cost"]


def bench_cost(*args, **kwargs):
    """Run the cost-model benchmark; see :func:`placer.bench.cost.bench_cost`."""
    from .cost import bench_cost as run
    return run(*args, **kwargs)

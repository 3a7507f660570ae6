"""The top-level verbs: ``simulate``, ``optimize``, ``strategies``.

They are thin front doors to :mod:`placer.cost` and :mod:`placer.search`,
kept here so ``import placer`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import Cluster
    from .cost import Report
    from .graph import Graph
    from .plan import Plan


def simulate(graph: "Graph", cluster: "Cluster", plan: "Plan", **problem_options: Any) -> "Report":
    """Simulate one training step (or inference pass) of ``plan`` with the
    event simulator and return its :class:`placer.Report`.

    >>> import placer
    >>> g = placer.Graph("one", [placer.Op("mm", flops=1e12)])
    >>> c = placer.Cluster.preset("a100x8")
    >>> r = placer.simulate(g, c, placer.Plan({"mm": ["gpu0"]}))
    >>> r.feasible and r.step_time > 0
    True
    """
    from .cost import simulate as _simulate
    return _simulate(graph, cluster, plan, **problem_options)


def optimize(graph: "Graph", cluster: "Cluster", method: str = "evolution", seed: int = 0,
             time_budget: float = 30.0, **options: Any) -> "Plan":
    """Search a plan for ``graph`` on ``cluster`` with strategy ``method``
    (see :func:`strategies`); the returned plan's ``predicted`` block holds
    the simulator's figures. Options (``evaluations``, ``progress``,
    ``microbatches``, ``schedule``, ...) are described in
    :func:`placer.search.optimize_with_report`.

    >>> import placer
    >>> g = placer.datasets.graph("gpt-125m.module")
    >>> c = placer.Cluster.preset("two-sites")
    >>> heft = placer.optimize(g, c, "heft")
    >>> best = placer.optimize(g, c, "evolution", seed=1, time_budget=None, evaluations=400)
    >>> best.predicted["step_time"] <= heft.predicted["step_time"]
    True
    >>> best.placement == placer.optimize(g, c, "evolution", seed=1, time_budget=None,
    ...                                   evaluations=400).placement   # same seed, same plan
    True
    """
    from .search import optimize as _optimize
    return _optimize(graph, cluster, method=method, seed=seed, time_budget=time_budget,
                     **options)


def strategies() -> list[str]:
    """Names usable as ``method=`` in :func:`optimize`.

    >>> import placer
    >>> {"heft", "m_sct", "pipeline_dp", "evolution", "dtfm", "rl"} <= set(placer.strategies())
    True
    """
    from .search import strategies as _strategies
    return _strategies()

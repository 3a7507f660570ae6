"""Big graphs: coarsen, search the coarse graph, project back, refine.

Above :data:`COARSEN_ABOVE` ops :func:`placer.search.optimize` does not
hand the whole graph to the strategy: it coarsens it to
:data:`COARSEN_TO` groups (:meth:`placer.Graph.coarsen`), runs the strategy
on that graph with :data:`COARSE_SHARE` of the time (and evaluation)
budget, expands the plan back to the original ops and spends the rest on
boundary moves on the fine graph (:func:`placer.search.refine.refine`).
Everything, coarsening included, runs on the search's clock.

Memory is then bounded by the fine graph's arrays (a few per op and edge,
the search's per-op device table of ``n_ops x n_devices`` floats, one
batch of ``8 x n_ops`` candidate rows) plus the strategy's footprint on
``COARSEN_TO`` ops, which does not grow with the graph.
"""

from __future__ import annotations

import time as _time
from dataclasses import replace
from typing import TYPE_CHECKING

from .base import Budget, Progress, SearchInterrupted

if TYPE_CHECKING:
    from ..cost import Problem
    from ..plan import Plan

#: graphs with more ops than this are coarsened first (``coarsen="auto"``)
COARSEN_ABOVE = 20_000
#: how many groups they are coarsened to
COARSEN_TO = 2_000
#: share of the budget for the search on the coarse graph (the rest refines)
COARSE_SHARE = 0.6


def coarsen_target(coarsen, n_ops: int) -> int | None:
    """Groups to coarsen an ``n_ops`` graph to under option ``coarsen``
    (``"auto"``: :data:`COARSEN_TO` above :data:`COARSEN_ABOVE` ops, None:
    never, an int: that many groups when the graph is larger), or None."""
    from ..errors import StrategyError
    if coarsen is None or coarsen is False:
        return None
    if coarsen == "auto":
        return COARSEN_TO if n_ops > COARSEN_ABOVE else None
    if isinstance(coarsen, bool) or not isinstance(coarsen, int) or coarsen < 2:
        raise StrategyError(f"coarsen must be 'auto', None or a whole number >= 2, got "
                            f"{coarsen!r}", field="coarsen")
    return coarsen if n_ops > coarsen else None


def search_coarsened(strategy, problem: "Problem", metered, budget: Budget, seed: int,
                     callback, groups: int) -> "Plan":
    """``strategy``'s plan for ``problem`` found on its graph coarsened to
    ``groups`` ops, expanded and refined (see the module doc); its
    ``predicted`` figures are the search model's of the refined plan."""
    from ..cost import Problem
    from .refine import refine
    graph = problem.graph
    name = strategy.name

    def say(message: str, best: float = float("inf")) -> None:
        callback(Progress(name, budget.used, budget.elapsed, best, message=message,
                          extra={"model": metered.name}))

    say(f"coarsening {len(graph)} ops to {groups}")
    start = _time.perf_counter()
    coarse_graph = graph.coarsen(groups)
    coarse = Problem(coarse_graph, problem.cluster, **problem.options)
    coarsening = _time.perf_counter() - start
    say(f"coarsened to {len(coarse_graph)} ops in {coarsening:.1f} s; searching them")
    if strategy.initial:
        strategy.initial = [_project(plan, coarse_graph) for plan in strategy.initial]
    sub = _share(budget, COARSE_SHARE)
    used, elapsed = budget.used, budget.elapsed

    def inner(event: Progress) -> None:
        # the coarse search counts on its own budget: report on the whole one
        callback(replace(event, evaluations=used + event.evaluations,
                         elapsed=elapsed + event.elapsed, done=False,
                         message=f"{event.message} (coarse)".strip()))
    try:
        found = strategy.search(coarse, sub.meter(metered.inner), sub, seed, inner)
    except SearchInterrupted as exc:
        if exc.plan is not None:
            exc.plan = exc.plan.expand(coarse_graph)
        raise
    finally:
        budget.charge(sub.used)
    say("expanding the plan to the original ops", found.predicted.get("objective", float("inf")))
    plan = found.expand(coarse_graph)
    plan, value, kept, expanded = refine(problem, plan, metered, budget,
                               progress=lambda v, msg: say(msg, v))
    plan.predicted = {"objective": value, "step_time": value, "model": metered.name,
                      "coarse": dict(found.predicted)}
    plan.extra["search"] = {**plan.extra.get("search", {}),
                            "coarsened": {"ops": len(graph), "to": len(coarse_graph),
                                          "seconds": round(coarsening, 3),
                                          "expanded_objective": expanded,
                                          "refine_moves": kept}}
    say(f"refined: {kept} moves kept", value)
    return plan


def _share(budget: Budget, share: float) -> Budget:
    """A budget of ``share`` of what is left of ``budget`` (its clock starts now)."""
    import math
    t, e = budget.remaining_time, budget.remaining_evaluations
    return Budget(time=None if math.isinf(t) else max(t * share, 1e-3),
                  evaluations=None if math.isinf(e) else max(int(e * share), 1))


def _project(plan: "Plan", coarse_graph) -> "Plan":
    """A plan of the original graph as one of ``coarse_graph``: each group
    where its first member is."""
    from ..plan import Plan
    members = coarse_graph.subgraph_members()
    out = Plan({g: list(plan.placement[ms[0]]) for g, ms in members.items()},
               plan.microbatches, plan.schedule, plan.method)
    return out

"""Big graphs: coarsen, search the coarse graph, project back, refine.

Above :data:`COARSEN_ABOVE` ops :func:`placer.search.optimize` does not
hand the whole graph to the strategy: it coarsens it to
:data:`COARSEN_TO` groups (:meth:`placer.Graph.coarsen`), runs the fast
heuristics of :data:`FINE_SEEDS` on the whole graph where they fit the
time, runs the strategy on the coarse graph with :data:`COARSE_SHARE` of
the time (and evaluation) budget left, expands its plan back to the
original ops, and spends the rest on boundary moves
(:func:`placer.search.refine.refine`) from the best of those plans by the
search's model. Everything, coarsening included, runs on the search's
clock.

Memory is then bounded by the whole graph's objects and arrays (a few per
op and edge, some per op x device) plus the strategy's footprint on
``COARSEN_TO`` ops, which does not grow with the graph: measured with
evolution at 64 devices, about 0.35 GB + 4.5 KB per op (0.80 GB at 100,000
ops). The final simulation in :func:`placer.search.optimize` adds at most
about 1 GB (:attr:`placer.search.common.SimulationClock.max_tasks`).
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import replace
from typing import TYPE_CHECKING

from .base import Budget, Progress, SearchInterrupted
from .parallel import ProblemPool, pool_workers

if TYPE_CHECKING:
    from ..cost import Problem
    from ..plan import Plan

#: graphs with more ops than this are coarsened first (``coarsen="auto"``)
COARSEN_ABOVE = 20_000
#: how many groups they are coarsened to
COARSEN_TO = 2_000
#: share of the time left for the search on the coarse graph (the rest refines)
COARSE_SHARE = 0.6
#: heuristics also run on the whole graph, where they fit in
#: :data:`FINE_SEED_SHARE` of the budget: their plans compete with the
#: coarse search's as the refinement's start (a plan found on the coarse
#: graph can overflow memory once expanded; these never leave the search
#: worse than they are)
FINE_SEEDS = ("heft", "pipeline_dp", "even_pipeline")
FINE_SEED_SHARE = 0.4


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
    from .refine import refine
    graph = problem.graph
    name = strategy.name

    def say(message: str, best: float = float("inf")) -> None:
        callback(Progress(name, budget.used, budget.elapsed, best, message=message,
                          extra={"model": metered.name}))

    say(f"coarsening {len(graph)} ops to {groups}")
    start = _time.perf_counter()
    coarse_graph = graph.coarsen(groups)
    coarse = problem.replace(coarse_graph)
    coarsening = _time.perf_counter() - start
    say(f"coarsened to {len(coarse_graph)} ops in {coarsening:.1f} s")
    found = _fine_seeds(strategy, problem, metered, budget, seed, say)
    if strategy.initial:
        strategy.initial = [_project(plan, coarse_graph) for plan in strategy.initial]
    say(f"searching the {len(coarse_graph)} coarse ops")
    sub = _share(budget, COARSE_SHARE)
    used, elapsed = budget.used, budget.elapsed

    def inner(event: Progress) -> None:
        # the coarse search counts on its own budget: report on the whole one
        callback(replace(event, evaluations=used + event.evaluations,
                         elapsed=elapsed + event.elapsed, done=False,
                         message=f"{event.message} (coarse)".strip()))
    try:
        result = strategy.search(coarse, sub.meter(metered.inner), sub, seed, inner)
    except SearchInterrupted as exc:
        if exc.plan is not None:
            exc.plan = exc.plan.expand(coarse_graph)
        raise
    finally:
        budget.charge(sub.used)
    expanded = result.expand(coarse_graph)
    found.append((name, expanded, metered.estimate(problem, expanded)))
    origin, plan, report = min(found, key=lambda f: (not f[2].feasible, f[2].objective))
    say(f"refining the best start ({origin}) on the original ops", report.objective)
    final = getattr(strategy, "final", None)
    final = None if final == metered.name else final
    held = _ranking_reserve(problem, [p for _o, p, _r in found], budget) if final else 0.0
    sub = _share(budget, 1.0 - held) if held else budget
    # the whole graph's batches and rankings on the strategy's workers, if any
    with ProblemPool(problem, getattr(strategy, "backend", "local"),
                     pool_workers(getattr(strategy, "workers", 0),
                                  getattr(strategy, "backend", "local"))) as pool:
        try:
            plan, value, kept, first = refine(problem, plan, sub.meter(metered.inner) if held
                                              else metered, sub,
                                              progress=lambda v, msg: say(msg, v), pool=pool)
        finally:
            if held:
                budget.charge(sub.used)
        ranked_by = None
        if final:
            # the strategy ranks its finalists by ``final`` (evolution: the
            # simulator); the starts compete with the refined plan the same way
            from .common import final_ranker, rank
            starts = [plan] + [p for _o, p, _r in found if p is not plan]
            say(f"ranking {len(starts)} plans by the {final}")
            i = rank(final_ranker(final, metered.inner, budget), problem, starts, budget,
                     pool=pool)
            if i:
                ranked_by = final
                plan = starts[i]
                value = metered.estimate(problem, plan).objective
    plan.predicted = {"objective": value, "step_time": value, "model": metered.name,
                      "coarse": dict(result.predicted)}
    plan.extra["search"] = {**plan.extra.get("search", {}),
                            "coarsened": {"ops": len(graph), "to": len(coarse_graph),
                                          "seconds": round(coarsening, 3),
                                          "starts": {o: r.objective for o, _, r in found},
                                          "refined_from": origin,
                                          "expanded_objective": found[-1][2].objective,
                                          "refine_moves": kept,
                                          "ranked_by": ranked_by}}
    say(f"refined: {kept} moves kept", value)
    return plan


def _fine_seeds(strategy, problem, metered, budget: Budget, seed: int, say) -> list:
    """``[(name, plan, report)]`` of :data:`FINE_SEEDS` run on the whole
    graph, each only where predicted (:func:`~placer.search.common.seed_seconds`)
    to finish within :data:`FINE_SEED_SHARE` of the time left, and with a
    :data:`FINE_SEED_SHARE` share of the evaluations left at the start;
    their plans compete with the coarse search's as the start of the
    refinement. On the strategy's workers, if any, they run at once, their
    results taken in order as if they had run one after another."""
    from .common import learn_seed_seconds, seed_seconds
    out = []
    deadline = budget.elapsed + budget.remaining_time * FINE_SEED_SHARE
    evals = budget.remaining_evaluations
    cap = None if math.isinf(evals) else max(1, int(evals * FINE_SEED_SHARE / len(FINE_SEEDS)))
    options = (strategy.microbatches, strategy.schedule)
    backend = getattr(strategy, "backend", "local")
    with ProblemPool(problem, backend, pool_workers(getattr(strategy, "workers", 0),
                                                    backend)) as pool:
        ahead = {}
        if pool.active and not budget.exhausted():
            left = deadline - budget.elapsed
            ahead = {h: pool.submit(seed_held, h, options, left, cap, seed, metered.name)
                     for h in FINE_SEEDS if seed_seconds(h, problem) <= left}
        for heuristic in FINE_SEEDS:
            left = deadline - budget.elapsed
            if budget.exhausted() or (heuristic not in ahead if pool.active else
                                      seed_seconds(heuristic, problem) > left):
                continue
            say(f"{heuristic} on all {problem.n_ops} ops")
            if pool.active:
                plan, used, seconds = ahead[heuristic].result()
            else:
                plan, used, seconds = run_seed(problem, heuristic, options, left, cap, seed,
                                               metered.inner)
            budget.charge(used)
            learn_seed_seconds(heuristic, problem, seconds)
            if plan is not None:
                out.append((heuristic, plan, metered.estimate(problem, plan)))
    return out


def run_seed(problem, heuristic: str, options: tuple, left: float, cap, seed: int, model):
    """``(plan or None, evaluations used, seconds)`` of seeding heuristic
    ``heuristic`` (``options``: microbatches, schedule) on ``problem``
    within ``left`` seconds and ``cap`` evaluations, scored by ``model``."""
    from ..errors import PlacerError
    from .base import get_strategy
    sub = Budget(time=None if math.isinf(left) else max(left, 1e-3), evaluations=cap)
    start = _time.perf_counter()
    try:
        plan = get_strategy(heuristic, microbatches=options[0], schedule=options[1]).search(
            problem, sub.meter(model), sub, seed=seed)
    except PlacerError:
        plan = None
    return plan, sub.used, _time.perf_counter() - start


def seed_held(heuristic: str, options: tuple, left: float, cap, seed: int, model: str):
    """:func:`run_seed` on a worker's held problem (:mod:`placer.search.parallel`),
    ``model`` named."""
    from .parallel import held_model, held_problem
    return run_seed(held_problem(), heuristic, options, left, cap, seed, held_model(model))


#: at most this share of the time left is kept from the refinement for
#: ranking the starts by the strategy's final model
RANK_SHARE = 0.3


def _ranking_reserve(problem, plans: list, budget: Budget) -> float:
    """Share of the time left to keep for ranking the refined plan and
    ``plans`` by the simulator: their predicted simulation times
    (:class:`~placer.search.common.SimulationClock`), at most
    :data:`RANK_SHARE`; 0 without a time limit."""
    from .common import SimulationClock
    left = budget.remaining_time
    if math.isinf(left) or left <= 0:
        return 0.0
    # the refined plan is simulated too: priced as the first start
    need = sum(SimulationClock.predict(problem, p) for p in plans[:1] + plans)
    return min(RANK_SHARE, need / left)


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

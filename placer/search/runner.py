"""``optimize``: build the problem, run a strategy, re-score with the
simulator and bind the plan to its graph and cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..cost import Problem, get_cost_model
from ..errors import StrategyError
from .base import (Budget, SearchInterrupted, Strategy, check_plan, get_strategy,
                   predicted_figures, progress_callback)

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..graph import Graph
    from ..plan import Plan
    from ..cost import Report


def optimize(graph: "Graph", cluster: "Cluster", method: "str | Strategy" = "evolution",
             seed: int = 0, time_budget: float | None = 30.0, **options: Any) -> "Plan":
    """Search a plan for ``graph`` on ``cluster``; the options and an example
    are in :func:`optimize_with_report`, which also returns the final report."""
    return optimize_with_report(graph, cluster, method, seed, time_budget, **options)[0]


def optimize_with_report(graph: "Graph", cluster: "Cluster",
                         method: "str | Strategy" = "evolution",
                         seed: int = 0, time_budget: float | None = 30.0, *,
                         evaluations: int | None = None, cost_model: Any = "analytical",
                         final_cost_model: Any = "simulator",
                         progress: "bool | Callable | None" = None, microbatches=None,
                         schedule: str | None = None, problem_options: dict | None = None,
                         initial=None, coarsen: "str | int | None" = "auto",
                         **strategy_options: Any) -> "tuple[Plan, Report]":
    """Search a plan for ``graph`` on ``cluster`` with strategy ``method``;
    returns the plan and the final cost model's report of it (so callers that
    want its trace or Gantt chart need not simulate again).

    - ``time_budget`` (seconds) and/or ``evaluations`` (plans scored) bound
      the search (None: unbounded);
    - ``cost_model`` scores candidates during the search,
      ``final_cost_model`` (the event simulator) scores the result, whose
      figures fill ``plan.predicted`` (``step_time``, ``feasible``,
      ``peak_memory``, ...; the search model's figures under ``"search"``);
    - ``progress``: None (quiet), True (a line per report on stderr) or a
      callable taking a :class:`placer.search.Progress`;
    - ``microbatches`` (an int or a list of candidates) and ``schedule`` fix
      what the strategy would otherwise choose;
    - ``problem_options`` go to :class:`placer.cost.Problem` (objective,
      recompute, ...); ``initial`` plans warm-start the strategy; other
      keywords are options of the strategy;
    - ``coarsen``: ``"auto"`` (default) searches graphs over
      :data:`~placer.search.multilevel.COARSEN_ABOVE` ops coarsened to
      :data:`~placer.search.multilevel.COARSEN_TO` groups, then refines the
      expanded plan on the original ops within the same budget (see
      :mod:`placer.search.multilevel`); an int coarsens to that many groups
      whatever the size; None hands the whole graph to the strategy.

    The plan is bound to ``graph`` and ``cluster`` (fingerprints) and its
    ``method`` is the strategy's name. It is never one the search model
    scored worse than another plan of this problem it scored (a NaN counts
    as infinitely slow), unless ``final_cost_model`` (of another name) scores
    that other plan worse. The search returns within ``time_budget`` + 10%;
    building the problem, compiling the kernels (first call only) and the
    final scoring come on top (the final model is the search's own where
    simulating the plan is predicted to take over a minute, or over the
    time budget if longer, or over about 1 GB: see
    :data:`FINAL_SIMULATION_SECONDS`). Raises
    :class:`placer.errors.StrategyError` for an unknown method or bad
    options.

    >>> import placer
    >>> g = placer.datasets.layered(40, width=4, seed=0)
    >>> plan, report = optimize_with_report(g, placer.Cluster.preset("two-sites"),
    ...                                     "even_pipeline")
    >>> plan.method, plan.predicted["feasible"], report.step_time == plan.predicted["step_time"]
    ('even_pipeline', True, True)
    """
    problem = Problem(graph, cluster, **(problem_options or {}))
    if isinstance(method, Strategy):
        if strategy_options or microbatches is not None or schedule is not None or initial:
            raise StrategyError("options given with a strategy instance", field="method",
                                fix="pass a strategy name, or set the options on the instance")
        strategy = method
    else:
        strategy = get_strategy(method, microbatches=microbatches, schedule=schedule,
                                initial=initial, **strategy_options)
    search_model = get_cost_model(cost_model)
    final_model = get_cost_model(final_cost_model)
    if time_budget is not None:
        from ..cost.warmup import warm_up
        warm_up()           # compiled kernels load before the clock starts
    budget = Budget(time_budget, evaluations)
    metered = budget.meter(search_model)
    callback = progress_callback(progress)
    from .multilevel import coarsen_target, search_coarsened
    groups = coarsen_target(coarsen, problem.n_ops)
    try:
        if groups is None:
            plan = strategy.search(problem, metered, budget, seed, callback)
        else:
            plan = search_coarsened(strategy, problem, metered, budget, seed, callback, groups)
    except SearchInterrupted as exc:
        if exc.plan is not None:
            check_plan(problem, exc.plan)
            search = dict(exc.plan.predicted)
            exc.plan.predicted = predicted_figures(final_model.estimate(problem, exc.plan))
            exc.plan.predicted["search"] = search
            exc.plan.method = strategy.name
            exc.plan.bind(graph, cluster)
        raise
    check_plan(problem, plan)
    # the swap asks the final model too, where simulating is affordable
    judge, _ = _affordable_final(problem, plan, final_model, search_model, time_budget)
    plan = _no_worse_than_seen(problem, plan, metered, judge)
    if isinstance(microbatches, int) and plan.microbatches != microbatches:
        plan.microbatches = microbatches
    if schedule is not None and plan.schedule != schedule:
        plan.schedule = schedule
    search = dict(plan.predicted)
    search.setdefault("evaluations", budget.used)
    search.setdefault("search_seconds", budget.elapsed)
    final_model, note = _affordable_final(problem, plan, final_model, search_model, time_budget)
    if note:
        search["final_model"] = note
    from .common import SimulationClock
    simulating = getattr(final_model, "name", None) == "simulator"
    # timed, so the bucket choice below knows what three more simulations cost
    report = SimulationClock.estimate(final_model, problem, plan, Budget()) if simulating \
        else final_model.estimate(problem, plan)
    if simulating and 3 * SimulationClock.predict(problem, plan) <= \
            max(FINAL_SIMULATION_SECONDS, time_budget or 0.0):
        # the all-reduce bucket size, where groups span slow links
        from .buckets import choose_buckets
        plan, report = choose_buckets(problem, plan, final_model, report)
    plan.predicted = predicted_figures(report)
    plan.predicted["search"] = search
    if not report.feasible:
        from ..explain import explain_infeasible
        plan.predicted["infeasible"] = explain_infeasible(problem, plan, report, final_model)
    plan.method = strategy.name
    return plan.bind(graph, cluster), report


#: the final simulation of a plan may take this many seconds, or the time
#: budget if longer; a plan predicted slower to simulate (100,000 ops in
#: wide data-parallel groups: minutes, gigabytes) is scored by the search's
#: own model instead, and ``predicted["search"]["final_model"]`` says why
FINAL_SIMULATION_SECONDS = 60.0


def _affordable_final(problem, plan, final_model, search_model, time_budget):
    """``(model, note)``: the final model, or the search's where simulating
    the plan is predicted to take over :data:`FINAL_SIMULATION_SECONDS` or
    to hold over :attr:`SimulationClock.max_tasks` tasks in memory."""
    from .common import SimulationClock
    if getattr(final_model, "name", None) != "simulator" or final_model is search_model:
        return final_model, None
    limit = max(FINAL_SIMULATION_SECONDS, time_budget or 0.0)
    seconds = SimulationClock.predict(problem, plan)
    tasks = SimulationClock.tasks(problem, plan)
    if seconds <= limit and tasks <= SimulationClock.max_tasks:
        return final_model, None
    return search_model, (f"{search_model.name}: simulating this plan was predicted to take "
                          f"{seconds:.0f} s and {tasks:.3g} tasks (limits {limit:.0f} s, "
                          f"{SimulationClock.max_tasks:.3g} tasks, about 1 GB)")


def _no_worse_than_seen(problem: Problem, plan: "Plan", metered, final_model=None) -> "Plan":
    """``plan``, or the best plan the search's own cost model scored (a seed
    heuristic, a warm start) where that scored better: a search disturbed by
    a slow or erratic model (NaN) must not return something worse than what
    it had already seen. The swap is noted in ``predicted["search"]``.
    With a ``final_model`` of another name the swap also needs it to score
    the seen plan no worse: a strategy that ranks its finalists by that model
    (``rl`` and evolution screen and rank with the simulator) chose its plan
    by it, and the search model's favourite can be slower by it (an
    expert-parallel stack: 35.9 ms against the chosen plan's 32.6 ms)."""
    import math
    from ..plan import Plan
    found = metered.best_for(problem)
    if found is None:
        return plan
    seen, report = found
    objective = plan.predicted.get("objective", plan.predicted.get("step_time"))
    feasible = bool(plan.predicted.get("feasible", True))
    if objective is None or not isinstance(objective, (int, float)) or math.isnan(objective):
        objective = float("inf")
    if (not report.feasible, report.objective) >= (not feasible, objective):
        return plan
    try:
        check_plan(problem, seen)
    except Exception:       # a partial plan a strategy scored on its own terms
        return plan
    if final_model is not None and getattr(final_model, "name", None) != metered.name:
        mine, theirs = final_model.estimate(problem, plan), final_model.estimate(problem, seen)
        if math.isnan(theirs.objective) or (not theirs.feasible, theirs.objective) > \
                (not mine.feasible, mine.objective):
            return plan
    better = Plan({k: list(v) for k, v in seen.placement.items()}, seen.microbatches,
                  seen.schedule, plan.method)
    better.predicted = predicted_figures(report)
    better.predicted.update({k: v for k, v in plan.predicted.items()
                             if k in ("evaluations", "search_seconds")})
    better.predicted["kept_seen"] = {"objective": report.objective, "search_objective":
                                     None if math.isinf(objective) else objective}
    better.extra = dict(plan.extra)
    return better

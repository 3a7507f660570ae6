"""Elastic re-planning: a new plan when devices of the cluster are lost.

:func:`replan` takes a plan made for ``graph`` on ``cluster`` and the names
of devices that are gone, and returns a plan for the surviving devices
(``cluster.without(names)``) that moves as little as it can:

1. :func:`repair_plan` keeps every op where it was when its devices
   survive; a data-parallel op that lost some replicas keeps the others; an
   op whose devices are all gone moves to the surviving device nearest to
   the first one it lost (highest bandwidth, then lowest latency, then
   fastest). Colocated ops stay together because they had the same devices.
2. A strategy (``method``) searches the reduced cluster warm-started from
   that repaired plan (``initial=``), so it is never worse than the repair
   under the search's cost model.
3. Both are scored by the event simulator; the search's plan is kept only
   if it is faster than the repaired one by more than ``tolerance`` (a
   fraction): otherwise moving ops is not worth it and the repair wins.

``method="repair"`` skips the search. The result records what happened in
``plan.extra["replan"]`` (lost devices, ops moved, the repaired plan's step
time) and is bound to the graph and the reduced cluster.

>>> import placer
>>> g = placer.datasets.layered(30, width=3, seed=0)
>>> c = placer.Cluster.preset("two-sites")
>>> old = placer.optimize(g, c, "even_pipeline")
>>> lost = sorted(old.devices_used())[:1]
>>> new = replan(g, c, old, lost, method="repair")
>>> lost[0] in new.devices_used(), new.extra["replan"]["without"] == lost
(False, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from .errors import ClusterError, PlacerError, PlanError

if TYPE_CHECKING:
    from .cluster import Cluster
    from .graph import Graph
    from .plan import Plan


def _nearest(cluster: "Cluster", lost: str, alive: list[str]) -> str:
    """The surviving device best linked to ``lost`` (ties: faster, then
    earlier in the cluster's order)."""
    def rank(name: str):
        bandwidth, latency = cluster.link(lost, name)
        return (-bandwidth, latency, -cluster.device(name).flops, cluster.index(name))
    return min(alive, key=rank)


def repair_plan(plan: "Plan", cluster: "Cluster", without: Iterable[str]) -> "Plan":
    """``plan`` with the devices ``without`` removed, moving as few ops as
    possible (see the module doc); ``cluster`` is the full cluster the plan
    was made for. The result is unbound (no fingerprints)."""
    from .plan import Plan
    gone = set(without)
    alive = [d for d in cluster.names if d not in gone]
    if not alive:
        raise PlanError("every device of the cluster would be removed", field="--without",
                        fix="keep at least one device")
    moved_to: dict[str, str] = {}
    placement: dict[str, list[str]] = {}
    for op_id, devices in plan.placement.items():
        kept = [d for d in devices if d not in gone]
        if not kept:
            first = devices[0]
            if first not in moved_to:
                moved_to[first] = _nearest(cluster, first, alive)
            kept = [moved_to[first]]
        placement[op_id] = kept
    return Plan(placement, plan.microbatches, plan.schedule, "repair")


def moved_ops(old: "Plan", new: "Plan") -> int:
    """How many ops run on a different device set in ``new`` than in ``old``."""
    return sum(sorted(old.placement.get(op, [])) != sorted(devs)
               for op, devs in new.placement.items())


def replan(graph: "Graph", cluster: "Cluster", plan: "Plan", without: Iterable[str],
           method: str = "evolution", seed: int = 0, time_budget: float | None = 30.0, *,
           tolerance: float = 0.01, check_fingerprints: bool = True,
           file: str | None = None, **options: Any) -> "Plan":
    """A plan for ``graph`` on ``cluster`` minus the devices ``without``,
    starting from ``plan`` (made for ``graph`` on ``cluster``).

    ``method`` is a strategy name (warm-started from the repaired plan) or
    ``"repair"`` (no search); ``tolerance`` is the fraction of step time a
    search must gain over the repair for its moves to be accepted; other
    ``options`` go to :func:`placer.search.optimize` (``evaluations=``,
    strategy options...). Raises :class:`placer.errors.PlanError` if
    ``plan`` does not fit ``graph``/``cluster`` or a name in ``without`` is
    not a device of ``cluster``; the new plan validates against the reduced
    cluster and uses none of the removed devices.
    """
    from .cost import simulate
    from .search import optimize
    from .search.base import predicted_figures

    plan.validate(graph, cluster, check_fingerprints=check_fingerprints, file=file)
    without = list(dict.fromkeys(without))
    if not without:
        raise PlanError("no device to remove", field="--without",
                        fix="name at least one lost device, e.g. --without gpu1")
    for name in without:
        if name not in cluster:
            raise PlanError(f"unknown device {name!r} in cluster {cluster.name!r}",
                            field="--without",
                            fix=f"use devices of the cluster: {', '.join(cluster.names[:8])}"
                            f"{'…' if len(cluster) > 8 else ''}")
    repaired = repair_plan(plan, cluster, without)
    try:
        reduced = cluster.without(without)
    except ClusterError as exc:  # e.g. links that no longer make sense
        raise PlanError(str(exc), field="--without") from None
    repaired.validate(graph, reduced, check_fingerprints=False)
    repaired_report = simulate(graph, reduced, repaired)
    best = repaired
    best.predicted = predicted_figures(repaired_report)
    if method != "repair":
        try:
            searched = optimize(graph, reduced, method=method, seed=seed,
                                time_budget=time_budget, initial=[repaired], **options)
        except PlacerError:
            raise
        gain = repaired_report.objective - searched.predicted.get("objective",
                                                                  repaired_report.objective)
        if gain > tolerance * abs(repaired_report.objective):
            best = searched
    best.extra = dict(best.extra)
    best.extra["replan"] = {"from_method": plan.method, "without": without,
                            "moved_ops": moved_ops(plan, best),
                            "repair_step_time": float(repaired_report.step_time),
                            "search": method}
    best.method = best.method if method != "repair" else "repair"
    best.validate(graph, reduced, check_fingerprints=False)
    return best.bind(graph, reduced)


__all__ = ["moved_ops", "repair_plan", "replan"]

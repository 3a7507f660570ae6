"""The order the runtimes run a plan's tasks in (:func:`for_plan`): the
simulator's, when a cluster is known, so the ranks run what the prediction
assumes; else the dispatch rule's (:func:`placer.schedule.build`). Above the
cost models and :mod:`placer.schedule`, which stays below both."""

from __future__ import annotations

from ..cost.problem import Problem
from ..cost.simulator import executed_orders
from ..errors import PlacerError
from ..schedule import Schedule, build, from_simulation


def for_plan(routes, plan, training: bool, graph=None, cluster=None,
             options: dict | None = None) -> Schedule:
    """The runtime's schedule of ``plan``: the simulator's order on ``graph``
    and ``cluster`` (:func:`placer.schedule.from_simulation`; ``options`` for
    :class:`placer.cost.Problem`) when both are given, the cluster has the
    plan's devices and the order maps onto the runtime's pieces, else
    :func:`placer.schedule.build`'s. Every rank computes the same from the same plan."""
    if graph is not None and cluster is not None and \
            plan.devices_used() <= set(cluster.names):
        try:
            sim = executed_orders(Problem(graph, cluster, **(options or {})), plan)
        except PlacerError:
            sim = None
        sched = from_simulation(routes, graph, sim, plan.schedule, training) if sim else None
        if sched is not None:
            return sched
    return build(routes, plan.schedule, training)

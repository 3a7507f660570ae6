"""Cost models: what a plan costs on a cluster.

One interface (:class:`CostModel`: ``estimate``, ``estimate_many`` and the
array fast path ``step_times``), two models of placer's own:

- ``"simulator"``: an event simulation of one training step that produces the
  schedule itself (and a Chrome trace / Gantt chart of it);
- ``"analytical"``: closed-form, for inner search loops;

and a peer's, to score plans in its terms: ``"dtfm-paper"``, DT-FM's
communication-only cost (:mod:`placer.cost.dtfm_paper`).

>>> import placer
>>> from placer.cost import Problem, get_cost_model, cost_models
>>> cost_models()
['analytical', 'dtfm-paper', 'simulator']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .analytical import Analytical
from .dtfm_paper import DTFMPaper
from .base import CostModel, cost_models, get_cost_model, register_cost_model
from .options import CostOptions
from .problem import INFEASIBLE, Compiled, Problem
from .report import Event, Report
from .simulator import Simulator

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..graph import Graph
    from ..plan import Plan

__all__ = ["Analytical", "Compiled", "CostModel", "CostOptions", "DTFMPaper", "Event", "INFEASIBLE", "Problem",
           "Report", "Simulator", "cost_models", "get_cost_model", "register_cost_model", "simulate"]


def simulate(graph: "Graph", cluster: "Cluster", plan: "Plan", **problem_options) -> Report:
    """Simulate one step of ``plan`` (checked against ``graph`` and
    ``cluster``, fingerprints not required to match) with the event
    simulator. ``problem_options`` go to :class:`Problem`."""
    plan.validate(graph, cluster, check_fingerprints=False)
    return Simulator().estimate(Problem(graph, cluster, **problem_options), plan)

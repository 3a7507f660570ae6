"""The cost-model interface and its registry of names.

A cost model is one class with a ``name``, registered like an Optuna sampler:

>>> from placer.cost import CostModel, register_cost_model, cost_models
>>> {"analytical", "simulator"} <= set(cost_models())
True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import StrategyError

if TYPE_CHECKING:
    from ..plan import Plan
    from .problem import Problem
    from .report import Report

_REGISTRY: dict[str, type] = {}


class CostModel(ABC):
    """Estimates what a plan costs on a problem.

    - :meth:`estimate` one plan -> :class:`Report`;
    - :meth:`estimate_many` a list of plans -> list of reports (batched
      where the model can);
    - :meth:`step_times`, the fast path for search loops: plans as an int
      array of group ids, shape ``(B, n_ops)`` indexed like
      ``problem.ids`` (ids ``< D`` are devices, ``>= D`` index ``groups``,
      tuples of device indices that hold a data-parallel op), and it
      returns the objective of each plan as a float array of shape ``(B,)``.

    Models are looked up by name; the two shipped ones rank plans alike:

    >>> import placer
    >>> from placer.cost import Problem, get_cost_model, cost_models
    >>> cost_models()
    ['analytical', 'dtfm-paper', 'simulator']
    >>> g = placer.datasets.graph("gpt-125m.module")
    >>> problem = Problem(g, placer.Cluster.preset("two-sites"))
    >>> plans = [placer.optimize(g, problem.cluster, m) for m in ("single", "heft", "pipeline_dp")]
    >>> def order(name):
    ...     reports = get_cost_model(name).estimate_many(problem, plans)
    ...     return sorted(range(3), key=lambda i: reports[i].step_time)
    >>> order("analytical") == order("simulator")
    True
    """

    name: str = ""
    #: whether :meth:`step_times` scores its rows together (vectorised), so
    #: one call of many rows costs far less than many calls of one; a search
    #: scoring under a deadline slices a batch by time then, else row by row
    batched: bool = False

    @abstractmethod
    def estimate(self, problem: "Problem", plan: "Plan") -> "Report":
        """Estimate one plan."""

    def estimate_many(self, problem: "Problem", plans: Sequence["Plan"]) -> list["Report"]:
        """Estimate several plans (the default loops over :meth:`estimate`)."""
        return [self.estimate(problem, plan) for plan in plans]

    def step_times(self, problem: "Problem", assignments, *,
                   groups: Sequence[Sequence[int]] = (), microbatches: int = 1,
                   schedule: str = "1f1b") -> np.ndarray:
        """Objective values of plans given as a ``(B, n_ops)`` array of group
        ids (see the class doc); ``microbatches`` may give one count per
        row, as the analytical model accepts. Default: compile each row and
        estimate it."""
        rows = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        counts = np.broadcast_to(np.asarray(microbatches, dtype=np.int64), (len(rows),))
        out = np.empty(len(rows))
        for i, row in enumerate(rows):
            compiled = problem.compile_array(row, groups, microbatches=int(counts[i]),
                                             schedule=schedule)
            out[i] = self.estimate(problem, problem.to_plan(compiled)).objective
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def register_cost_model(cls: type) -> type:
    """Class decorator: make ``cls`` available by ``cls.name``."""
    if not getattr(cls, "name", ""):
        raise StrategyError(f"cost model {cls.__name__} has no name",
                            fix="set a class attribute name = '...'")
    _REGISTRY[cls.name] = cls
    return cls


def get_cost_model(name: "str | CostModel", **options) -> CostModel:
    """A new cost model by registered name (a model instance passes through).

    >>> get_cost_model("simulator").name
    'simulator'
    """
    if isinstance(name, CostModel):
        return name
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise StrategyError(f"unknown cost model {name!r}",
                            fix=f"use one of: {', '.join(sorted(_REGISTRY))}") from None
    return cls(**options)


def cost_models() -> list[str]:
    """Names of the registered cost models."""
    return sorted(_REGISTRY)

"""A plan as arrays, the form every search works on.

An *assignment* is an int array indexed like ``problem.ids`` (topological
order): a value ``d < D`` places the op on device ``d``, a value ``D + k``
on the data-parallel set ``groups[k]`` (a tuple of device indices).
:class:`PlanArrays` holds one with its microbatches, schedule and where it
came from. The sets are numbered by :class:`GroupTable` and a batch is
renumbered to the sets it uses by :func:`compact_rows` (what a cost
model's ``step_times`` should be given: its work grows with the table);
both live in :mod:`placer.groups`, below the cost models, which number
their sets with them too, and are named here for the searches.

The cost models see a plan as a :class:`placer.cost.Compiled` (the whole
group table, singletons included): :meth:`PlanArrays.compile` builds it
with :meth:`placer.cost.Problem.compile_array`, the one place that table is
made (the cost package sits below the searches, so it does not import this
module).

>>> import numpy as np
>>> c = PlanArrays(np.array([0, 5, 5, 1]), groups=((0, 1), (2, 3)), microbatches=2,
...                schedule="1f1b", origin="layout")
>>> c.compact(4).assign.tolist(), c.compact(4).groups
([0, 4, 4, 1], ((2, 3),))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import StrategyError
from ..groups import GroupTable, compact_rows

if TYPE_CHECKING:
    from ..cost import Compiled, Problem
    from ..plan import Plan

__all__ = ["GroupTable", "PlanArrays", "compact_rows"]


@dataclass(eq=False)
class PlanArrays:
    """One plan as arrays: ``assign`` (see the module doc) over the
    data-parallel sets ``groups``; ``microbatches`` a count, or the counts
    a search may still choose from (None: any); ``schedule`` (None: not
    chosen yet); ``origin`` where it came from (a heuristic, ``"policy"``,
    a seed's name); ``objective`` its score by the search model, when
    scored."""

    assign: np.ndarray
    groups: tuple = ()
    microbatches: "int | Sequence[int] | None" = None
    schedule: "str | None" = None
    origin: str = ""
    objective: float = math.nan

    @property
    def label(self) -> str:
        """``origin`` (the name the heuristics give their candidates)."""
        return self.origin

    @property
    def source(self) -> str:
        """``origin`` (the name the learned strategies give it)."""
        return self.origin

    def replace(self, **changes) -> "PlanArrays":
        """A copy with ``changes`` (fields by name)."""
        return replace(self, **changes)

    def compact(self, D: int) -> "PlanArrays":
        """This plan with only the data-parallel sets it uses, renumbered
        from ``D`` (the device count) in id order."""
        assign, used = compact_rows(self.assign, self.groups, D)
        return self.replace(assign=assign, groups=tuple(used))

    def key(self, D: int) -> tuple:
        """Identity of the plan whatever its group numbering: compact
        assignment bytes, sets, microbatches and schedule."""
        c = self.compact(D)
        m = c.microbatches
        return (np.asarray(c.assign, dtype=np.int64).tobytes(), c.groups,
                m if m is None or np.isscalar(m) else tuple(m), c.schedule)

    def tasks(self, D: int) -> int:
        """Op replicas x microbatches (an op on k devices counts k): what
        one simulation of this plan costs."""
        sizes = np.r_[np.ones(D, dtype=np.int64), [len(g) for g in self.groups]]
        return int(sizes[self.assign].sum()) * max(int(self.count()), 1)

    def count(self) -> int:
        """The microbatch count (the largest allowed when a list)."""
        m = self.microbatches
        if m is None:
            raise StrategyError("this plan has no microbatch count yet", field="microbatches")
        return int(m) if np.isscalar(m) else int(max(m))

    def compile(self, problem: "Problem") -> "Compiled":
        """The cost models' form (:meth:`placer.cost.Problem.compile_array`)."""
        return problem.compile_array(self.assign, self.groups, microbatches=self.count(),
                                     schedule=self.schedule or "1f1b")

    def to_plan(self, problem: "Problem", method: str = "manual", *,
                extra: dict | None = None) -> "Plan":
        """This plan as a :class:`placer.plan.Plan` by ``method`` (``extra``
        its extra fields)."""
        plan = problem.to_plan(self.compile(problem), method)
        if extra:
            plan.extra = dict(plan.extra or {}, **extra)
        return plan

    def placement(self, problem: "Problem") -> dict:
        """``{op id: [device names]}`` of this plan."""
        names, D = problem.devices, problem.n_devices
        sets = [[names[d]] for d in range(D)] + [[names[d] for d in g] for g in self.groups]
        return {op: list(sets[g]) for op, g in zip(problem.ids, self.assign.tolist())}

    @classmethod
    def from_plan(cls, problem: "Problem", plan: "Plan", origin: str = "") -> "PlanArrays":
        """``plan`` (over ``problem``'s ops) as arrays."""
        c = problem.compile(plan)
        return cls(c.op_group, tuple(c.groups[problem.n_devices:]), int(c.microbatches),
                   c.schedule, origin)

"""Genomes of the evolutionary searches and the search space they live in.

Two encodings of a plan, both over ``problem.ids`` (a topological order):

- :class:`OpGenome`, op-level: one *group id* per op (ids ``< D`` are single
  devices, higher ids name data-parallel device sets in a shared
  :class:`GroupTable`), plus microbatches and schedule;
- :class:`LayoutGenome`, stage/replica level: the topological order cut into
  contiguous stages, each stage on a device set (its data-parallel replicas),
  plus microbatches and schedule. It decodes to an :class:`OpGenome`.

:class:`Space` precomputes what operators need from a problem: graph
neighbours, colocation classes, devices ordered by nearness, and per-op work.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from placer.plan import Plan
from .arrays import GroupTable, PlanArrays

if TYPE_CHECKING:
    from placer.cost import Problem


@dataclass
class OpGenome:
    """Op-level placement: ``assign[i]`` is the group of ``problem.ids[i]``."""

    assign: np.ndarray
    microbatches: int = 1
    schedule: str = "1f1b"
    origin: str = ""

    def copy(self) -> "OpGenome":
        return OpGenome(self.assign.copy(), self.microbatches, self.schedule, self.origin)

    def key(self) -> bytes:
        """Identity for caches and de-duplication."""
        h = hashlib.blake2b(np.ascontiguousarray(self.assign, dtype=np.int64).tobytes(),
                            digest_size=16)
        h.update(f"|{self.microbatches}|{self.schedule}".encode())
        return h.digest()

    def arrays(self, space: "Space") -> PlanArrays:
        """This genome as :class:`~placer.space.arrays.PlanArrays` over
        ``space``'s group table."""
        return PlanArrays(self.assign, tuple(space.table.extra()), int(self.microbatches),
                          self.schedule, self.origin)

    def to_plan(self, space: "Space", method: str = "evolution") -> Plan:
        """The :class:`placer.Plan` of this genome."""
        return self.arrays(space).to_plan(space.problem, method)

    @classmethod
    def from_plan(cls, space: "Space", plan: Plan, origin: str = "") -> "OpGenome":
        """Encode ``plan`` (its ops must be those of ``space.problem``)."""
        index = space.problem.device_index
        assign = np.empty(space.n_ops, dtype=np.int64)
        memo: dict = {}
        for i, op_id in enumerate(space.problem.ids):
            devs = tuple(plan.placement[op_id])
            gid = memo.get(devs)
            if gid is None:
                gid = memo[devs] = space.table.id([index[d] for d in devs])
            assign[i] = gid
        return cls(space.repair(assign), int(plan.microbatches), plan.schedule, origin)


@dataclass
class LayoutGenome:
    """Stages over the topological order: stage ``s`` holds ops
    ``cuts[s-1] <= i < cuts[s]`` (``cuts`` has ``S-1`` increasing positions)
    on device set ``stages[s]`` (several devices: data-parallel replicas)."""

    cuts: list[int]
    stages: list[tuple]
    microbatches: int = 1
    schedule: str = "1f1b"
    origin: str = ""

    def copy(self) -> "LayoutGenome":
        return LayoutGenome(list(self.cuts), [tuple(s) for s in self.stages],
                            self.microbatches, self.schedule, self.origin)

    def decode(self, space: "Space") -> OpGenome:
        """The op-level genome (colocation repaired)."""
        bounds = [0] + [int(c) for c in self.cuts] + [space.n_ops]
        assign = np.empty(space.n_ops, dtype=np.int64)
        for s, devs in enumerate(self.stages):
            assign[bounds[s]:bounds[s + 1]] = space.table.id(devs)
        return OpGenome(space.repair(assign), int(self.microbatches), self.schedule,
                        self.origin)

    @classmethod
    def balanced(cls, space: "Space", stages: Sequence[Sequence[int]], microbatches: int = 1,
                 schedule: str = "1f1b", origin: str = "") -> "LayoutGenome":
        """Cut the order so each stage's work is proportional to its speed:
        replicas split the batch evenly, so a stage runs at its slowest
        device's FLOP/s times its number of replicas."""
        rate = space.problem.rate
        speed = np.array([rate[list(s)].min() * len(s) for s in stages], dtype=float)
        return cls(space.cuts_for(speed), [tuple(int(d) for d in s) for s in stages],
                   microbatches, schedule, origin)


class Space:
    """What the operators need to know about one problem, computed once."""

    def __init__(self, problem: "Problem", microbatch_choices: Sequence[int] = (1,),
                 schedule_choices: Sequence[str] = ("1f1b",)):
        self.problem = problem
        self.n_ops = problem.n_ops
        self.n_devices = D = problem.n_devices
        self.table = GroupTable(D)
        self.microbatch_choices = sorted(set(int(m) for m in microbatch_choices)) or [1]
        self.schedule_choices = list(schedule_choices) or ["1f1b"]
        n = self.n_ops
        # graph neighbours (both directions) as CSR arrays
        src, dst = problem.edge_src, problem.edge_dst
        ends = np.r_[src, dst]
        other = np.r_[dst, src]
        order = np.argsort(ends, kind="stable")
        self.nbr = other[order]
        self.nbr_ptr = np.r_[0, np.cumsum(np.bincount(ends, minlength=n))].astype(np.int64)
        # colocation: every op of a class follows its first member (topological order)
        rep = np.arange(n, dtype=np.int64)
        for members in problem.graph.colocation_groups().values():
            idx = sorted(problem.index[m] for m in members)
            rep[idx] = idx[0]
        self.rep = rep
        self.has_colocation = bool((rep != np.arange(n)).any())
        # per-op work (forward + backward FLOPs) and its running total
        work = problem.flops + (problem.bwd_flops if problem.training else 0.0)
        work = work + problem.op_overhead * problem.rate.mean() * (2 if problem.training else 1)
        self.work = work
        # colocation repair moves an op's work to its class's first member,
        # so stages are balanced on the work each position really carries
        self.cum_work = np.cumsum(np.bincount(rep, work, minlength=n) if self.has_colocation
                                  else work)
        # devices nearest first (highest bandwidth, then lowest latency)
        bw = np.where(np.eye(D, dtype=bool), -np.inf, problem.bandwidth)
        self.near = np.array([np.lexsort((problem.latency[d], -bw[d]))[:-1] if D > 1 else
                              np.zeros(0, dtype=np.int64) for d in range(D)], dtype=np.int64) \
            if D > 1 else np.zeros((1, 0), dtype=np.int64)
        self.by_speed = np.argsort(-problem.rate, kind="stable")

    # --- helpers ------------------------------------------------------------
    def repair(self, assign: np.ndarray) -> np.ndarray:
        """Put every colocation class on its first member's group."""
        return assign[self.rep] if self.has_colocation else assign

    def neighbours(self, i: int) -> np.ndarray:
        return self.nbr[self.nbr_ptr[i]:self.nbr_ptr[i + 1]]

    def cuts_for(self, speed: np.ndarray) -> list[int]:
        """S-1 cut positions giving stage s work proportional to ``speed[s]``
        (every stage at least one op while there are enough ops)."""
        S = len(speed)
        n = self.n_ops
        if S <= 1:
            return []
        total = self.cum_work[-1]
        targets = np.cumsum(speed)[:-1] / speed.sum() * total
        cuts = np.searchsorted(self.cum_work, targets, side="left") + 1
        out = []
        prev = 0
        for s, c in enumerate(cuts.tolist()):
            lo = prev + 1
            hi = n - (S - 1 - s)
            c = min(max(int(c), lo), hi)
            out.append(c)
            prev = c
        return out

    def stages_of(self, assign: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Runs of equal groups along the order: (start positions, group ids)."""
        starts = np.flatnonzero(np.r_[True, assign[1:] != assign[:-1]])
        return starts, assign[starts]

    def plan_of(self, genome, method: str = "evolution") -> Plan:
        """A :class:`Plan` for an :class:`OpGenome` or :class:`LayoutGenome`."""
        if isinstance(genome, LayoutGenome):
            genome = genome.decode(self)
        return genome.to_plan(self, method)


def compact(A: np.ndarray, space: Space) -> tuple[np.ndarray, list[tuple]]:
    """Renumber the data-parallel group ids used in ``A`` to ``D, D+1, ...``
    so the cost model sees only the groups this batch uses."""
    return space.table.compact(A)


__all__ = ["GroupTable", "LayoutGenome", "OpGenome", "Space", "compact"]

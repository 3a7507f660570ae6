"""``"dtfm-paper"``: the communication-only cost model of Yuan et al.,
"Decentralized Training of Foundation Models in Heterogeneous
Environments" (NeurIPS 2022), so a plan can be scored in the peer's own
terms.

A plan is read as the paper's layout: its ops, in topological order, form
runs on data-parallel groups of devices (the pipeline stages, each group
one stage's replicas). The cost of one training step is

    data-parallel cost + 2 x pipeline cost

- data-parallel cost: the slowest group's slowest device, which exchanges
  its share of the stage's gradients with every peer of its group, each
  exchange twice (reduce, then gather): ``max_i sum_{j != i} 2 (delay_ij +
  g / (k bandwidth_ij))`` for a group of ``k`` devices and ``g`` gradient
  bytes;
- pipeline cost: over the stages in the plan's order, the time to send one
  replica's activations to the next stage; replicas are matched one to one
  between neighbouring stages so that the slowest pair is as fast as it can
  be (a bottleneck assignment), that pair's ``delay + a / bandwidth``
  counts; forward and backward each pay it, hence the factor 2.

Compute, memory and the microbatch count are not part of it (the paper's
model is communication only); a plan it cannot read (groups sharing
devices, replicas of unequal count, idle devices when ``all_devices``,
another ``shape``) is infeasible, ranked by how far it is off. Sizes come
from the graph (``sizes="graph"``: a stage's parameter bytes as its
gradients, the bytes crossing a stage boundary as its activations) or are
the paper's GPT-3 XL figures (``sizes="paper"``, :data:`PAPER_SIZES`: every
stage holds an equal share of the gradients, and a run of only ops that
share weights, such as a head tied to the embedding, that only detours to
a group with other stages is no stage of its own, as the paper's GPT ties
no weights).

The even 8 x 8 allocation of GPT-3 XL on the paper's worldwide scenario
costs 75.29 s, as DT-FM's own scheduler code gives:

>>> import placer
>>> from placer.cost import Problem
>>> from placer.graph import scale_batch
>>> from placer.space import even_allocation
>>> g = scale_batch(placer.datasets.graph("gpt-1.3b.module"), 122)
>>> problem = Problem(g, placer.Cluster.preset("dtfm-worldwide"))
>>> plan = even_allocation(problem, 8, 8)
>>> round(DTFMPaper(sizes="paper").estimate(problem, plan).step_time, 2)
75.29
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import StrategyError
from .base import CostModel, register_cost_model
from .problem import INFEASIBLE
from .report import Report

if TYPE_CHECKING:
    from ..plan import Plan
    from .problem import Problem

#: The paper's GPT-3 XL sizes, as its scheduler states them: 1.3e9 fp32
#: parameters (gradients of the whole model, bytes), and the activations of
#: the whole batch (about 1e6 tokens: 488.3 sequences of 2048) at a stage
#: boundary, 2024 x 2048 fp16 values per sequence, counted in GiB and sent
#: over links in decimal Gbit/s (so 2**30 bytes are priced as 1e9).
PAPER_SIZES = {"gradient_bytes": 1.3e9 * 4,
               "activation_bytes": 2024 * 2048 * 2 * (1e6 / 2048) / 2 ** 30 * 1e9}


@register_cost_model
class DTFMPaper(CostModel):
    """DT-FM's communication-only cost (see the module doc).

    Options: ``sizes`` (``"graph"`` or ``"paper"``), ``gradient_bytes``
    (the whole model's gradients; a stage gets its share of the graph's
    parameter bytes) and ``activation_bytes`` (one stage boundary's
    activations for the whole batch) override them; ``all_devices`` (True:
    the paper's layout uses every device), ``shape`` (``(D_pp, D_dp)`` the
    plan must have, or None)."""

    name = "dtfm-paper"

    def __init__(self, *, sizes: str = "graph", gradient_bytes: float | None = None,
                 activation_bytes: float | None = None, all_devices: bool = True,
                 shape: Sequence[int] | None = None):
        if sizes not in ("graph", "paper"):
            raise StrategyError(f"unknown sizes {sizes!r}", field="sizes",
                                fix="use 'graph' or 'paper'")
        base = PAPER_SIZES if sizes == "paper" else {}
        self.sizes = sizes
        self.gradient_bytes = gradient_bytes if gradient_bytes is not None \
            else base.get("gradient_bytes")
        self.activation_bytes = activation_bytes if activation_bytes is not None \
            else base.get("activation_bytes")
        self.all_devices = bool(all_devices)
        self.shape = None if shape is None else (int(shape[0]), int(shape[1]))
        self._links: dict = {}

    def estimate(self, problem: "Problem", plan: "Plan") -> Report:
        """DT-FM's step cost of ``plan`` (``extra``: its data-parallel and
        pipeline parts, the stages' groups; or why it cannot be read)."""
        compiled = problem.compile(plan)
        return self._report(problem, compiled.op_group, compiled.groups, plan)

    def layout(self, problem: "Problem", op_group: np.ndarray, table: list):
        """``(stages, starts, problems)``: the device tuple of each run of
        consecutive ops on one group (topological order), the op position
        where each run starts, and what keeps it from being the paper's
        layout (empty when it is)."""
        op_group = np.asarray(op_group)
        starts = np.r_[0, np.flatnonzero(op_group[1:] != op_group[:-1]) + 1]
        stages = [tuple(table[int(op_group[s])]) for s in starts]
        if self.sizes == "paper":
            # the paper's GPT ties no weights (its embedding is on the first
            # stage, its head on the last): a run of only tied ops (the head
            # and embedding placer's graph keeps together) is no stage there
            tied = self._tied(problem)
            ends = np.r_[starts[1:], len(op_group)]
            only = [bool(tied[a:b].all()) for a, b in zip(starts, ends)]
            n = len(stages)
            # between two runs of one group, or at an end on a group that
            # has another stage: the tie's doing, not a stage
            keep = [i for i in range(n) if not (only[i] and 0 < i < n - 1
                                                and stages[i - 1] == stages[i + 1])]
            real = {stages[i] for i in keep if not only[i]}
            keep = [i for i in keep if not (only[i] and i in (keep[0], keep[-1])
                                            and stages[i] in real and len(keep) > 1)]
            stages, starts = [stages[i] for i in keep], starts[keep]
            # neighbours on one group after a dropped run are one stage
            merged = [0] + [j for j in range(1, len(stages)) if stages[j] != stages[j - 1]]
            stages, starts = [stages[j] for j in merged], starts[merged]
        groups = list(dict.fromkeys(stages))
        used = [d for g in groups for d in g]
        wrong = []
        if len(used) != len(set(used)):
            wrong.append("data-parallel groups share devices")
        if len({len(g) for g in groups}) > 1:
            wrong.append("stages have unequal replica counts")
        if self.all_devices and len(set(used)) < problem.n_devices:
            wrong.append(f"{problem.n_devices - len(set(used))} of {problem.n_devices} "
                         f"devices unused")
        if self.shape is not None and (len(stages), len(groups[0])) != self.shape:
            wrong.append(f"shape {len(stages)}x{len(groups[0])}, not "
                         f"{self.shape[0]}x{self.shape[1]}")
        return stages, starts, wrong

    def _report(self, problem: "Problem", op_group, table, plan=None) -> Report:
        stages, starts, wrong = self.layout(problem, op_group, table)
        groups = list(dict.fromkeys(stages))
        grads = self._gradients(problem, np.asarray(op_group), table, groups)
        dp = max((self.dp_cost(problem, g, b) for g, b in zip(groups, grads)), default=0.0)
        acts = self._activations(problem, starts[1:])
        pp = sum(self.link_cost(problem, a, b, x)
                 for a, b, x in zip(stages[:-1], stages[1:], acts))
        phases = 2.0 if problem.training else 1.0
        cost = dp + phases * pp
        extra = {"data_parallel": dp, "pipeline": phases * pp,
                 "stages": [list(s) for s in stages]}
        if wrong:
            extra["not_paper_layout"] = "; ".join(wrong)
            # ranked by how far off, then by cost, behind every readable plan
            objective = INFEASIBLE * (1.0 + len(wrong)) + min(cost, 0.5 * INFEASIBLE)
            return Report(step_time=cost, feasible=False, objective=objective,
                          model=self.name, extra=extra,
                          microbatches=getattr(plan, "microbatches", None),
                          schedule=getattr(plan, "schedule", None))
        return Report(step_time=cost, feasible=True, objective=cost, model=self.name,
                      extra=extra, microbatches=getattr(plan, "microbatches", None),
                      schedule=getattr(plan, "schedule", None),
                      bottleneck="data-parallel" if dp >= phases * pp else "pipeline")

    def step_times(self, problem: "Problem", assignments, *, groups=(), microbatches=1,
                   schedule="1f1b") -> np.ndarray:
        """Objectives of plans given as group-id rows (see :class:`CostModel`)."""
        rows = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        table = [(i,) for i in range(problem.n_devices)] + [tuple(sorted(g)) for g in groups]
        return np.array([self._report(problem, row, table).objective for row in rows])

    # --- the paper's pieces ---------------------------------------------------
    @staticmethod
    def _tied(problem) -> np.ndarray:
        graph = problem.graph
        return np.array([graph.op(i).colocate is not None for i in problem.ids], dtype=bool)

    def _gradients(self, problem, op_group, table, groups) -> list[float]:
        if self.sizes == "paper" and self.gradient_bytes is not None:
            # the paper's stages are equal: each holds its share of the layers
            return [self.gradient_bytes / len(groups)] * len(groups)
        params = problem.param_bytes * problem.gradient_bytes_per_param
        index = {g: i for i, g in enumerate(groups)}
        per = np.zeros(len(groups))
        for gid in np.unique(op_group).tolist():
            per[index[tuple(table[gid])]] += params[op_group == gid].sum()
        if self.gradient_bytes is not None:
            total = per.sum()
            per = per / total * self.gradient_bytes if total > 0 else per
        return per.tolist()

    def _activations(self, problem, cuts) -> list[float]:
        """Whole-batch bytes crossing each cut (op position)."""
        if self.activation_bytes is not None:
            return [float(self.activation_bytes)] * len(cuts)
        if not problem.n_edges:
            return [0.0] * len(cuts)
        lo = np.minimum(problem.edge_src, problem.edge_dst)
        hi = np.maximum(problem.edge_src, problem.edge_dst)
        return [float(problem.edge_bytes[(lo < c) & (hi >= c)].sum()) for c in cuts]

    @staticmethod
    def dp_cost(problem: "Problem", group: tuple, nbytes: float) -> float:
        """Seconds for ``group`` to exchange ``nbytes`` of gradients: its
        slowest device's sum over peers of ``2 (delay + nbytes / (k bw))``."""
        k = len(group)
        if k < 2:
            return 0.0
        g = np.asarray(group)
        lat = problem.latency[np.ix_(g, g)]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = 2.0 * (lat + nbytes / (k * problem.bandwidth[np.ix_(g, g)]))
        np.fill_diagonal(t, 0.0)
        return float(t.sum(axis=1).max())

    def link_cost(self, problem: "Problem", a: tuple, b: tuple, nbytes: float) -> float:
        """Seconds to send one replica's share of ``nbytes`` (the whole
        batch's activations) from stage ``a`` to stage ``b``: the slowest
        pair of the best one-to-one matching of their replicas."""
        key = (problem, a, b, nbytes)
        hit = self._links.get(key)
        if hit is None:
            if len(self._links) > 100_000:
                self._links.clear()
            ia, ib = np.asarray(a), np.asarray(b)
            share = nbytes / max(len(a), 1)
            C = problem.latency[np.ix_(ia, ib)] + share / problem.bandwidth[np.ix_(ia, ib)]
            C = np.where(ia[:, None] == ib[None, :], 0.0, C)
            hit = self._links[key] = bottleneck_assignment(C)
        return hit


def bottleneck_assignment(C: np.ndarray) -> float:
    """The least possible largest entry of ``C`` picked by a one-to-one
    matching of its rows to its columns (every row matched; ``C`` has at
    least as many columns as rows)."""
    C = np.asarray(C, dtype=float)
    if C.size == 0:
        return 0.0
    values = np.unique(C)
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _perfect(C <= values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


def _perfect(ok: np.ndarray) -> bool:
    """Whether every row of the boolean matrix ``ok`` can be matched to its
    own column (augmenting paths, Kuhn's algorithm)."""
    n_rows, n_cols = ok.shape
    owner = [-1] * n_cols
    adj = [np.flatnonzero(r).tolist() for r in ok]

    def augment(i: int, seen: list) -> bool:
        for j in adj[i]:
            if not seen[j]:
                seen[j] = True
                if owner[j] < 0 or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False
    return all(augment(i, [False] * n_cols) for i in range(n_rows))


__all__ = ["DTFMPaper", "PAPER_SIZES", "bottleneck_assignment"]

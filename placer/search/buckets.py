"""The data-parallel all-reduce bucket size as a plan choice.

Gradients of a data-parallel group are all-reduced in buckets (PyTorch
DDP's default is 25 MB). Each bucket's ring pays the link latency in every
one of its ``2 (k - 1)`` steps, so over slow, far links many small buckets
cost far more than a few large ones (GPT-1.3B's 8x8 plan on dtfm-worldwide:
163 s of all-reduce at 25 MB, 53 s in one bucket). :func:`choose_buckets`
scores a plan at a few bucket sizes with the final cost model where its
groups span slow links and keeps the best in ``plan.allreduce``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..cost import CostModel, Problem, Report
    from ..plan import Plan

#: a group whose links have at least this latency (seconds) is "slow": its
#: bucket size is searched
SLOW_LATENCY = 1e-3
#: bucket sizes tried beside the problem's default and one bucket per group
SIZES = (1e8, 4e8)


def group_gradient_bytes(problem: "Problem", plan: "Plan") -> list[tuple[tuple, float]]:
    """``[(devices, gradient bytes)]`` of the plan's data-parallel groups."""
    c = problem.compile(plan)
    grads = problem.param_bytes * problem.gradient_bytes_per_param
    out = []
    for gid in np.unique(c.op_group).tolist():
        members = tuple(c.groups[gid])
        if len(members) > 1:
            out.append((members, float(grads[c.op_group == gid].sum())))
    return out


def choose_buckets(problem: "Problem", plan: "Plan", cost_model: "CostModel",
                   report: "Report | None" = None) -> tuple["Plan", "Report"]:
    """``plan`` with the all-reduce bucket size (of the problem's default,
    :data:`SIZES` and one bucket per group) that ``cost_model`` prices best,
    and its report; unchanged when it trains no data-parallel group over
    links slower than :data:`SLOW_LATENCY` or already fixes a size."""
    if report is None:
        report = cost_model.estimate(problem, plan)
    if not problem.training or (plan.allreduce or {}).get("bucket_bytes") is not None:
        return plan, report
    groups = [(g, b) for g, b in group_gradient_bytes(problem, plan) if b > 0]
    slow = [b for g, b in groups
            if problem.latency[np.ix_(g, g)].max() >= SLOW_LATENCY]
    if not slow:
        return plan, report
    one = float(np.ceil(max(b for _, b in groups)))
    best = (report.objective, plan, report)
    for size in sorted({s for s in SIZES if s < one} | {one}):
        if size == problem.bucket_bytes:
            continue
        trial = _with_buckets(plan, size)
        r = cost_model.estimate(problem, trial)
        if r.objective < best[0] * (1 - 1e-6):
            best = (r.objective, trial, r)
    return best[1], best[2]


def _with_buckets(plan: "Plan", size: float) -> "Plan":
    import copy
    out = copy.copy(plan)
    out.placement = dict(plan.placement)
    out.predicted, out.extra = dict(plan.predicted), dict(plan.extra)
    out.allreduce = dict(plan.allreduce or {}, bucket_bytes=size)
    return out


__all__ = ["SIZES", "SLOW_LATENCY", "choose_buckets", "group_gradient_bytes"]

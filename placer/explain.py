"""Why a plan does not fit in memory, and what would make it fit.

Used by :func:`placer.search.optimize` when even the best plan found is over
some device's memory: the answer names the device that overflows first and
by how much, then tries the cheap remedies on the same placement with the
simulator (more microbatches, activation recomputation) and says what the
remaining ones would need (more devices, a smaller batch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cost import Problem, Report
    from .plan import Plan


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def explain_infeasible(problem: "Problem", plan: "Plan", report: "Report",
                       cost_model=None) -> list[str]:
    """Lines explaining an over-memory ``plan`` (empty when it fits).

    >>> import placer
    >>> from placer.cost import Problem, get_cost_model
    >>> g = placer.Graph("big", [placer.Op("w", flops=1e9, param_bytes=5e9)])
    >>> c = placer.Cluster.from_rules("small", [placer.Device("d", 1e12, 8e9)],
    ...                               default=(1e9, 0.0))
    >>> p = placer.Plan({"w": ["d"]})
    >>> r = get_cost_model("simulator").estimate(Problem(g, c), p)
    >>> lines = explain_infeasible(Problem(g, c), p, r)
    >>> lines[0].startswith("d runs out of memory first")
    True
    """
    from .cost import Problem, get_cost_model
    from .plan import Plan

    if report.feasible or not report.memory_excess:
        return []
    model = cost_model or get_cost_model("simulator")
    cluster, graph = problem.cluster, problem.graph
    worst = max(report.memory_excess,
                key=lambda d: report.memory_excess[d] / cluster.device(d).memory)
    capacity = cluster.device(worst).memory
    lines = [f"{worst} runs out of memory first: needs {_gb(capacity + report.memory_excess[worst])}"
             f" of {_gb(capacity)} (over by {_gb(report.memory_excess[worst])}); "
             f"{len(report.memory_excess)} device(s) over in all"]

    def fits(candidate: Plan, prob: Problem) -> bool:
        return model.estimate(prob, candidate).feasible

    remedies = []
    for m in (plan.microbatches * 2, plan.microbatches * 4, plan.microbatches * 8):
        trial = Plan(plan.placement, m, "1f1b", plan.method)
        if fits(trial, problem):
            remedies.append(f"{m} microbatches with the 1f1b schedule make this placement fit")
            break
    if not problem.recompute:
        if fits(plan, problem.replace(recompute=True)):
            remedies.append("activation recomputation (problem option recompute=True) "
                            "makes this placement fit")
    state = graph.total_param_bytes() * (1 + problem.gradient_bytes_per_param
                                         + problem.optimizer_bytes_per_param) \
        if graph.training else graph.total_param_bytes()
    total = cluster.total_memory()
    if state > total:
        need = state - total
        biggest = max(d.memory for d in cluster.devices)
        remedies.append(f"more devices: weights, gradients and optimizer state alone need "
                        f"{_gb(state)} but the cluster has {_gb(total)}; at least "
                        f"{int(need // biggest) + 1} more device(s) of {_gb(biggest)}")
    else:
        remedies.append(f"more devices or a placement spreading the {_gb(state)} of model "
                        f"state over more of the cluster's {_gb(total)}")
    activations = graph.total_output_bytes()
    if activations > 0.2 * state:
        remedies.append(f"a smaller batch: activations of the traced batch are "
                        f"{_gb(activations)}, and shrink with the batch")
    lines.append("what would make it fit: " + "; ".join(remedies))
    return lines

"""Memory per device, shared by the simulator and the analytical model so
both call the same plans infeasible."""

from __future__ import annotations

import numpy as np

from .problem import Problem


def inflight(problem: Problem, first_op: np.ndarray, used: np.ndarray, microbatches: int,
             schedule: str) -> np.ndarray:
    """Microbatches whose activations a device keeps at once, shape like
    ``first_op`` (``(..., D)``): GPipe keeps all of them; 1F1B lets the
    device whose first op is r-th earliest among the S used devices hold at
    most ``S - r``. ``first_op`` is the topological index of a device's
    first op (large where ``used`` is False)."""
    m = microbatches
    if not problem.training:
        return np.zeros(first_op.shape)
    if schedule == "gpipe":
        return np.where(used, m * 1.0, 0.0)
    # rank of each device by first op (ties by device index): stable argsort twice
    order = np.argsort(first_op, axis=-1, kind="stable")
    rank = np.argsort(order, axis=-1, kind="stable")
    stages = used.sum(axis=-1, keepdims=True)
    return np.where(used, np.minimum(m, np.maximum(stages - rank, 1)), 0.0).astype(float)


def peak_memory(problem: Problem, params, acts, recv, workspace, held,
                microbatches: int) -> np.ndarray:
    """Peak bytes per device: parameters (+ gradients and optimizer state when
    training), activations stashed for backward (``held`` microbatches of
    ``acts + recv`` bytes, or only ``recv`` with recomputation) and the
    largest op's workspace. ``acts`` and ``recv`` are for the whole batch."""
    m = microbatches
    if problem.training:
        state = params * (1.0 + problem.gradient_bytes_per_param
                          + problem.optimizer_bytes_per_param)
        kept = recv if problem.recompute else acts + recv
        return state + held * kept / m + workspace
    return params + workspace

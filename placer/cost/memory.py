"""Memory per device, shared by the simulator and the analytical model so
both call the same plans infeasible."""

from __future__ import annotations

import numpy as np

from ..schedule import inflight_cap
from .problem import Problem


def inflight(problem: Problem, run_first: np.ndarray, runs, used: np.ndarray,
             microbatches, schedule: str) -> np.ndarray:
    """Microbatches whose activations a device keeps at once, shape like
    ``run_first`` (``(..., D)``).

    The topological order of a plan is cut into *runs* of consecutive ops on
    the same devices (pipeline stages, plus extra runs where an op sits
    apart). GPipe keeps every microbatch. 1F1B lets a device start a new
    microbatch only while fewer than ``runs - run_first`` are between forward
    and backward on it, where ``run_first`` is the run of its first op: the
    stages from it to the end, as in the classic ``S - r`` warm-up (counting
    runs rather than devices gives data-parallel replicas the cap of their
    stage, and a device that also holds a late stage its longer round trip).
    The cap is :func:`placer.schedule.inflight_cap`, the one the runtime's
    schedule applies to its pieces.
    """
    m = microbatches
    if not problem.training:
        return np.zeros(np.shape(run_first))
    if schedule == "gpipe":
        return np.where(used, m * 1.0, 0.0)
    return np.where(used, inflight_cap(run_first, runs, m), 0.0).astype(float)


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

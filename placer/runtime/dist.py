"""Several processes, one or many hosts: ``torch.distributed`` ranks.

Rank ``r`` hosts the ``r``-th device of the plan, in this order: the
cluster's device order when a cluster is given, else the order in which the
plan's placement first names each device. ``WORLD_SIZE`` must equal the
number of devices the plan uses. Every rank traces and splits the whole
model the same way (cheap: shapes are probed on meta tensors) but copies
only the weights of its own pieces to its device. A model built on the meta
device (a zoo model above :data:`placer.zoo.META_THRESHOLD_BYTES`, or any
model whose modules can ``reset_parameters``) is never allocated whole: each
rank builds its own pieces' weights, as :func:`placer.zoo.materialize` would. Activations and gradients
travel as point-to-point ``isend``/``irecv`` that both ends of a pair post
in one sequence fixed by the plan (:mod:`placer.schedule`), so they match
by order, as NCCL matches them, and never need their tags
(``PLACER_P2P_TAG0=1`` sends every one with tag 0); replicated parameters
are summed with ``all_reduce`` on one process group per set of holders.
Backend (:func:`launch_backend`): NCCL when every rank's device is CUDA
(GPU tensors sent as they are; the communication runs on NCCL's streams,
ordered after the compute stream and before it by events), else gloo (a
CUDA rank among CPU ranks stages its messages through host memory).

One host::

    placer launch plan.json --model gpt-125m --tiny --batch 8 --nproc 4

Ranks of one host run on cores of their own when there are enough
(``--pin auto``, :func:`pin_cores`): ranks sharing cores preempt each
other at every message they exchange. Pinned CPU ranks then busy-poll
their collectives and keep their cores awake with an idle-priority spinner
(:mod:`placer.runtime.waiting`): on a virtual machine a halted core takes
up to a scheduler tick to wake.

Several hosts (the same command on every host; torchrun's c10d rendezvous
assigns ranks, host 0's address as the endpoint)::

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HOST0:29400 --rdzv-id placer-job \\
        -m placer.runtime.dist plan.json --model gpt-125m --tiny --batch 8

Faults (:func:`launch`): every rank records its stage (``build``, ``step
2``, ``step 2: waiting for rank 0``, ``gather``...) in a small status file.
The parent stops the run with one :class:`placer.errors.PlacerError` line
naming the rank, its device and its stage as soon as a rank dies (exits
without finishing, e.g. killed or ``os._exit``) or fails, or when no rank
has made progress for ``fault_timeout`` seconds once all have started
(interpreter start-up is bounded by ``timeout`` only) (a hang: it names the rank
the others wait for, or the one that is not waiting); every child process is
killed and reaped before the error propagates. ``fault_timeout`` must exceed
the longest single op's compute time.

The code lives in one module per concern; this module gathers their
public names and is the torchrun entry point:

- :mod:`placer.runtime.ranks`: which rank hosts which device, backend, cores;
- :mod:`placer.runtime.transport`: :class:`DistTransport`, the step barrier;
- :mod:`placer.runtime.rank_loop`: :func:`run_rank`, one rank's steps;
- :mod:`placer.runtime.calibration`: what ``calibrate=True`` measures;
- :mod:`placer.runtime.launch`: :func:`launch`, its ranks and watchdog;
- :mod:`placer.runtime.status`: each rank's stage, for the watchdogs;
- :mod:`placer.cli_runtime`: the command lines (``placer launch``, this
  module run as ``python -m placer.runtime.dist``).
"""

from __future__ import annotations

import importlib

from .calibration import (CALIBRATION_ROUNDS, REFERENCE_FACTOR_BOUNDS, SPEED_DRIFT_BOUNDS,
                          Reference, calibrated_options, calibration_line, link_fits,
                          reference_factor, reference_plan, speed_drift)
from .launch import LauncherStopped, diagnose, free_port, init_group, launch
from .rank_loop import run_rank
from .ranks import (RankError, auto_pin, launch_backend, pin_cores, pinned_cores, rank_devices,
                    rank_torch_device, this_rank)
from .transport import P2P_PREPOST_ENV, P2P_TAG0_ENV, DistTransport, p2p_tag0_default, start_step

__all__ = ["RankError", "launch", "run_rank", "rank_devices", "pin_cores", "launch_backend",
           "this_rank", "rank_torch_device", "DistTransport", "calibrated_options",
           "reference_plan", "reference_factor", "Reference", "link_fits", "speed_drift",
           "calibration_line", "LauncherStopped", "init_group", "free_port", "diagnose",
           "auto_pin", "pinned_cores", "start_step", "p2p_tag0_default", "P2P_TAG0_ENV",
           "P2P_PREPOST_ENV", "CALIBRATION_ROUNDS", "SPEED_DRIFT_BOUNDS",
           "REFERENCE_FACTOR_BOUNDS"]


if __name__ == "__main__":
    # the torchrun entry point; its command line lives with the others
    # (imported by name: the runtime does not depend on the CLI)
    raise SystemExit(importlib.import_module("placer.cli_runtime").rank_main())

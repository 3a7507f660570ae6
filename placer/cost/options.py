"""The cost-model options of a :class:`~placer.cost.Problem`, as one frozen
dataclass validated in one place.

A :class:`CostOptions` reads like a mapping of its fields, so
``Problem(graph, cluster, **options)`` and ``dict(options)`` work on it as
they did on the keyword dict it replaces.

>>> options = CostOptions(recompute=True)
>>> options.recompute, options["objective"], options.replace(merge=0).merge
(True, 'step_time', 0.0)
>>> CostOptions(objective="speed")
Traceback (most recent call last):
...
placer.errors.StrategyError: unknown objective 'speed' (fix: use one of: step_time, throughput, memory)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import StrategyError

OBJECTIVES = ("step_time", "throughput", "memory")
#: what the simulator's tasks are (see :attr:`CostOptions.granularity`)
GRANULARITIES = ("op", "piece")
NIC_MODES = ("max_link", "none")
#: options that must be >= 0
_NON_NEGATIVE = ("optimizer_bytes_per_param", "gradient_bytes_per_param", "op_overhead",
                 "task_overhead", "message_overhead", "resume_overhead", "link_burst")
#: how a field's value is stored, by its annotation
_COERCE = {"float": float, "bool": bool}


@dataclass(frozen=True, eq=False)
class CostOptions(Mapping):
    """What the cost models assume beyond the graph and the cluster; the
    defaults model DDP-style training with Adam. Numbers are stored as
    floats, flags as bools; a bad value is a :class:`StrategyError` naming
    the field. Equal to another CostOptions or dict with the same items.

    What the models take from the graph rather than from here:

    - the training loss: the runtime computes it, forward and backward, on
      the first device of the group holding the model's output, in that
      device's forward task, for the whole microbatch. A graph node's
      ``loss_flops`` (``[forward, backward]``, written by ``placer profile``)
      says how much of its FLOPs are the loss's; the simulator and the
      analytical model charge that part there rather than spreading it over
      the replicas (other cost models see it as the op's own). The
      simulator also makes the loss wait for every replica's rows of the
      output and each replica's backward for the gradient of its rows.
      ``loss_fixed`` (``[forward, backward]`` FLOPs, part of ``loss_flops``)
      is what the loss costs whatever a microbatch's rows (its launches, the
      runtime's loss task): both models charge it whole to every microbatch
      instead of scaling it by the rows.
    - an op's fixed cost: a graph node's ``fixed_flops`` (``[forward,
      backward]``, part of its FLOPs; ``placer profile`` and ``launch(...,
      calibrate=True)`` write it from the op's times at several row counts)
      is what the op costs whatever its rows (dispatch, small fixed work
      beyond ``op_overhead``): both models charge it whole to every
      microbatch and replica and scale only the rest by their rows. Without
      it (uncalibrated graphs) all of an op's FLOPs scale.
    - measured op times: where an op carries ``extra["measured"]`` (as
      ``placer profile`` writes it), both models use those seconds instead
      of its FLOPs (see :func:`placer.cost.problem.measured_times`).
    """

    #: ``"step_time"`` (seconds), ``"throughput"`` (minus samples/s of the
    #: traced batch, so lower is better) or ``"memory"`` (largest fraction
    #: of a device's memory used)
    objective: str = "step_time"
    #: optimizer state as a multiple of the parameter bytes (Adam keeps two
    #: fp32 states: 2.0)
    optimizer_bytes_per_param: float = 2.0
    #: gradient bytes as a multiple of the parameter bytes
    gradient_bytes_per_param: float = 1.0
    #: activation recomputation: only each device's inputs are kept for
    #: backward, and backward re-runs the forward
    recompute: bool = False
    #: fraction of peak FLOP/s for devices whose ``efficiency`` is None, in (0, 1]
    default_efficiency: float = 0.5
    #: seconds per op launch (forward and backward), so ops with zero
    #: counted FLOPs (elementwise) are not free
    op_overhead: float = 5e-6
    #: ``"max_link"`` gives a device without ``nic_bandwidth`` a network
    #: interface as fast as its fastest link, so fan-out from one device to
    #: many is serialised; ``"none"`` leaves such devices uncapped
    nic: str = "max_link"
    #: gradients of a data-parallel group are all-reduced in buckets of about
    #: this many bytes, as soon as each is ready (PyTorch DDP's default: 25 MB)
    bucket_bytes: float = 25e6
    #: the simulator may start a run of ops on a device only when the inputs
    #: of a later op in it arrived, if the run so far takes at most this
    #: fraction of the device's time (0: never; fewer tasks, faster)
    merge: float = 0.02
    #: seconds per run of consecutive ops on one device group, per
    #: microbatch and phase (a runtime runs each such run as one piece: a
    #: module call, one autograd call and its own bookkeeping; see
    #: :mod:`placer.runtime.profile`); 0: plans are costed by their ops alone
    task_overhead: float = 0.0
    #: seconds of a device's own time each message between devices costs it,
    #: at the sender and again at the receiver, per microbatch and phase (a
    #: runtime posts the receive, hands the message to its transport, wakes
    #: for it; ``placer launch --calibrate`` measures it); 0: a message
    #: costs only its link's time
    message_overhead: float = 0.0
    #: the ring model's all-reduce time over the real one, > 0 (1: the ring's
    #: bytes move at link speed and each of its steps pays the link's
    #: latency; gloo on CPUs reduces and copies too, and a runtime flattens
    #: the gradients first: ``placer launch --calibrate`` measures it).
    #: All-reduce times are divided by it. Above 1 where the cluster's
    #: latencies include delays that lone messages pay and a collective does not
    collective_efficiency: float = 1.0
    #: bytes per second of a device's own time a message's payload costs at
    #: each end, beside ``message_overhead`` (a transport that copies it
    #: through the CPU: TCP over loopback or a local bridge runs the
    #: receiver's network stack in the sender's time); inf: only
    #: ``message_overhead``
    message_copy_rate: float = float("inf")
    #: True: a bucket's all-reduce starts as soon as every replica finished
    #: the backward holding its last byte, so it overlaps the rest of the
    #: backward (as DDP does); False: a device's all-reduces start only once
    #: it has run every task of the step, as placer's runtime does (it
    #: reduces after the last backward; on CPU ranks gloo's socket threads,
    #: at idle priority, would not move the data while the rank computes
    #: anyway). The simulator honours it; the analytical model always overlaps
    allreduce_overlap: bool = True
    #: seconds a device loses when it starts a task that does not follow its
    #: previous one at once (it waited for an input, or the task is its first
    #: of the step): a CPU core's caches hold other work by then (the tiny
    #: GPT's forward ran 15-22% slower right after a 5 ms wait). Simulator only
    resume_overhead: float = 0.0
    #: ``"op"``: the simulator runs a device's ops in segments cut where an
    #: op receives from another device, so a run of ops may start on part of
    #: its inputs, and each tensor leaves when the op producing it ends;
    #: ``"piece"``: as placer's runtime runs a plan, the runtime's pieces
    #: (runs of one group, merged while acyclic, see :mod:`placer.pieces`),
    #: each started once all its inputs arrived and sending its outputs when
    #: it ends, forward and backward (one task each, as ``task_overhead``
    #: counts them)
    granularity: str = "op"
    #: bytes every link between devices lets through at once before its
    #: bandwidth applies, refilled at that bandwidth (a token bucket, as
    #: ``tc tbf`` shapes a link; ``placer launch --calibrate`` fits it from
    #: the ping-pong's sizes). Simulator only; 0: every byte takes the link's
    #: time
    link_burst: float = 0.0

    def __post_init__(self):
        validate(self)
        for f in dataclasses.fields(self):
            coerce = _COERCE.get(f.type)
            if coerce is not None:
                object.__setattr__(self, f.name, coerce(getattr(self, f.name)))

    def replace(self, **changes) -> "CostOptions":
        """These options with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes) if changes else self

    # --- read like the keyword dict it replaces ----------------------------
    def __getitem__(self, name: str):
        if name not in _NAMES:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, name) for name in _NAMES))


_NAMES = tuple(f.name for f in dataclasses.fields(CostOptions))


def validate(options: CostOptions) -> None:
    """Raise a :class:`StrategyError` naming the first bad field of
    ``options`` and its fix."""
    o = options
    if o.objective not in OBJECTIVES:
        raise StrategyError(f"unknown objective {o.objective!r}",
                            fix=f"use one of: {', '.join(OBJECTIVES)}")
    if not 0 < o.default_efficiency <= 1:
        raise StrategyError(f"default_efficiency must be in (0, 1], got {o.default_efficiency!r}")
    for label in _NON_NEGATIVE:
        value = getattr(o, label)
        if not value >= 0:
            raise StrategyError(f"{label} must be >= 0, got {value!r}")
    if not 0 < o.collective_efficiency < float("inf"):
        raise StrategyError(f"collective_efficiency must be > 0 and finite, got "
                            f"{o.collective_efficiency!r}")
    if o.granularity not in GRANULARITIES:
        raise StrategyError(f"unknown granularity {o.granularity!r}",
                            fix=f"use one of: {', '.join(GRANULARITIES)}")
    if o.nic not in NIC_MODES:
        raise StrategyError(f"unknown nic mode {o.nic!r}", fix="use 'max_link' or 'none'")
    if not o.message_copy_rate > 0:
        raise StrategyError(f"message_copy_rate must be > 0 (inf: free), got "
                            f"{o.message_copy_rate!r}")

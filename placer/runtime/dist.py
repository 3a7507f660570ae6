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
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import socket
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..errors import PlacerError, PlanError
from ..schedule import build as build_schedule
from ..schedule import for_plan
from ..schedule import from_orders as schedule_from_orders
from ..schedule import plain as schedule_plain
from .devices import choose_backend, cpu_fallback_line, gpu_named, torch_device
from .engine import Engine, Routes
from .run import (RUNTIME_OPTIONS, MeasuredReport, _as_device, build_optimizer, default_loss,
                  join_outputs, predict, prepare, sink_device)
from .waiting import (TRANSPORT_THREADS, KeepAwake, Watcher, busy_poll_default, demote_threads,
                      handover, quick_handover, wait_work)

_DEBUG = bool(os.environ.get("PLACER_DEBUG_COMM"))

__all__ = ["RankError", "launch", "run_rank", "rank_devices", "launch_main", "rank_main",
           "pin_cores"]


def rank_torch_device(name: str, backend: str | None = None, cluster=None,
                      device=None) -> torch.device:
    """The torch device of the rank hosting plan device ``name``: ``device``
    when given, a usable torch device name as itself, a device named as a
    GPU (:func:`placer.runtime.devices.gpu_named`) or any NCCL rank on
    CUDA device ``LOCAL_RANK`` (modulo this host's count), else the CPU."""
    if device is not None:
        return torch.device(device)
    local = int(os.environ.get("LOCAL_RANK", 0))
    tdev = torch_device(name, local, cluster)
    if tdev.type == "cpu" and backend == "nccl" and torch.cuda.is_available() \
            and _as_device(name) is None:
        tdev = torch.device("cuda", local % torch.cuda.device_count())
    return tdev


def this_rank(devs: list[str], cluster=None, device=None) -> tuple[str, str, torch.device]:
    """``(plan device, backend, torch device)`` of this rank, ``devs`` being
    the plan's devices in rank order; the process group must be up and
    have one rank per device. The backend is ``"nccl"`` when the group's
    names NCCL (``"cpu:gloo,cuda:nccl"`` names both), else ``"gloo"``."""
    world = dist.get_world_size()
    if len(devs) != world:
        raise PlanError(f"the plan uses {len(devs)} devices but WORLD_SIZE is {world}",
                        fix=f"start {len(devs)} processes (one per device)")
    me = devs[dist.get_rank()]
    backend = "nccl" if "nccl" in str(dist.get_backend()) else "gloo"
    return me, backend, rank_torch_device(me, backend, cluster, device)


def launch_backend(plan, cluster=None, device=None) -> str:
    """The backend :func:`launch` uses when none is named: NCCL when every
    rank's device (:func:`rank_torch_device`) is CUDA, else gloo."""
    devs = rank_devices(plan, cluster)
    return choose_backend([rank_torch_device(d, None, cluster, device)
                           if device is not None else torch_device(d, r, cluster)
                           for r, d in enumerate(devs)])


def rank_devices(plan, cluster=None) -> list[str]:
    """The plan's devices in rank order (see the module doc)."""
    used = plan.devices_used()
    if cluster is not None:
        return [d for d in cluster.names if d in used]
    seen: list[str] = []
    for devices in plan.placement.values():
        for d in devices:
            if d not in seen:
                seen.append(d)
    return seen


class RankError(PlacerError):
    """A rank of a distributed run died, failed or hung."""


class _Status:
    """This rank's stage in a small file the launcher polls (one fixed-size
    record rewritten in place: cheap enough for every blocking call)."""

    SIZE = 512

    def __init__(self, path: str | None, rank: int):
        self.rank = rank
        self.stage = "start"
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600) if path else None
        self.count = 0

    def set(self, stage: str, state: str = "running", error: str = "") -> None:
        self.stage = stage
        self.count += 1
        if self.fd is None:
            return
        record = json.dumps({"rank": self.rank, "stage": stage, "state": state,
                             "count": self.count, "time": time.time(),
                             "error": error[:200]})
        data = record.encode()[:self.SIZE - 1].ljust(self.SIZE - 1) + b"\n"
        os.pwrite(self.fd, data, 0)

    def wait(self, peer: int | None, what: str = ""):
        """Context manager: mark this rank as waiting for ``peer`` (None: a
        collective) during a blocking call."""
        status = self

        class _Waiting:
            def __enter__(self_inner):
                status._outer = status.stage
                status.set(f"{status.stage}: waiting for "
                           + (f"rank {peer}" if peer is not None else (what or "a collective")))

            def __exit__(self_inner, exc_type, *exc):
                if exc_type is None:      # a failed wait keeps its stage for the error
                    status.set(status._outer)
        return _Waiting()


_STATUS = _Status(None, 0)   # replaced by the launcher's children


def _read_status(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode().strip() or "null")
    except (OSError, ValueError):
        return None


def _maybe_inject_fault(rank: int, step: int) -> None:
    """Test hook: ``PLACER_TEST_FAULT="RANK:STEP:exit"`` makes that rank
    ``os._exit(3)`` at the start of that step; ``...:hang`` makes it sleep."""
    spec = os.environ.get("PLACER_TEST_FAULT")
    if not spec:
        return
    r, st, kind = spec.split(":")
    if int(r) == rank and int(st) == step:
        if kind == "exit":
            os._exit(3)
        time.sleep(10 ** 6)


#: environment switch: every point-to-point message travels with tag 0 (as
#: NCCL matches them, in posting order); the runs must stay correct
P2P_TAG0_ENV = "PLACER_P2P_TAG0"


def p2p_tag0_default() -> bool:
    """Whether :data:`P2P_TAG0_ENV` asks for tag 0 on every message."""
    return os.environ.get(P2P_TAG0_ENV, "").strip().lower() in ("1", "true", "yes", "on")


#: environment switch: ``0`` posts a gloo rank's receives as NCCL ranks post
#: theirs (when the sequence reaches them), not all before the step
P2P_PREPOST_ENV = "PLACER_P2P_PREPOST"


class DistTransport:
    """Messages between ranks, matched by the order both ends post them.

    The engine gives the transport each step's sequence of messages with
    every peer (:meth:`begin`, from :mod:`placer.schedule`): both ends of a
    pair post their sends and receives in that one sequence, so a message
    never depends on its tag to find its receive (NCCL ignores tags and
    matches a pair's messages in posting order, pytorch/pytorch#94819).
    ``tag0``: every message goes with tag 0 (the check that nothing relies
    on tags; what NCCL does anyway). Receives are posted ahead:

    - gloo: every receive of the step before the step (:meth:`post`), in
      the sequence's order per peer: gloo matches a (peer, tag) pair's
      messages in order and moves data only once its receive is posted;
    - NCCL (and gloo with ``PLACER_P2P_PREPOST=0``): a receive is posted
      only when the sequence reaches it (a send
      after it, or the receive itself, is due): a pair's operations run on
      one NCCL stream in posting order, so a receive posted before a send
      the peer waits for would deadlock. A wait on a receive then only
      orders the compute stream after the communication stream (an event),
      and GPU tensors go without host staging.

    A message outside the sequence (the calibration's) is posted when asked
    for, tagged unless ``tag0``. A send or receive the sequence does not
    allow next raises :class:`PlanError` (the engine left the schedule)."""

    def __init__(self, rank_of: dict[str, int], me: str, device: torch.device, backend: str,
                 spin: bool = False, tag0: bool | None = None):
        self.rank_of = rank_of
        self.me = me
        self.device = device
        self.backend = backend
        self.nccl = backend == "nccl"
        #: post every receive of a step before it (gloo; see :meth:`post`)
        self.prepost = not self.nccl and os.environ.get(P2P_PREPOST_ENV, "1").strip() != "0"
        self.stage = backend == "gloo" and device.type != "cpu"
        self.spin = spin          # busy-poll instead of blocking (see .waiting)
        self.tag0 = p2p_tag0_default() if tag0 is None else bool(tag0)
        self.watcher = Watcher()
        self.box: dict = {}
        self.pending: list = []
        self.posted: dict = {}
        self.groups: dict[tuple, Any] = {}
        self.comm_time = defaultdict(float)
        self.seq: dict = {}       # peer device -> [(tag, is_send, shape, dtype)]
        self.where: dict = {}     # (tag, is_send) -> (peer, index)
        self.cursor: dict = {}    # peer -> index of its first entry not posted
        self.done_at: dict = {}   # peer -> set of indices posted out of turn (gloo)
        #: (peer, tag, "send"|"recv") in the order this rank posted them
        self.log: list = []

    def hosts(self, device: str) -> bool:
        return device == self.me

    def _wire(self, tag: int) -> int:
        return 0 if self.tag0 else tag

    def begin(self, sequence: dict) -> None:
        """The coming step's messages with each peer device, in order:
        ``{peer: [(tag, is_send, shape, dtype)]}``."""
        self.seq = sequence
        self.where = {(row[0], row[1]): (peer, i) for peer, rows in sequence.items()
                      for i, row in enumerate(rows)}
        self.cursor = {peer: 0 for peer in sequence}
        self.done_at = {peer: set() for peer in sequence}
        self.log = []

    def _buffer(self, shape, dtype):
        return torch.empty(tuple(shape), dtype=dtype,
                           device="cpu" if self.stage else self.device)

    def _irecv(self, tag: int, shape, dtype, src: str) -> None:
        buf = self._buffer(shape, dtype)
        work = dist.irecv(buf, src=self.rank_of[src], tag=self._wire(tag))
        # NCCL: the work is waited on by the rank (a stream wait); gloo: a
        # watcher thread blocks in it so the rank can poll
        self.posted[tag] = (work if self.nccl else self.watcher.watch(work), buf)
        self.log.append((src, tag, "recv"))

    def _advance(self, peer: str, upto: int, what: str) -> None:
        """Post ``peer``'s receives before entry ``upto`` of the sequence;
        every send before it must be posted already."""
        rows, skip = self.seq[peer], self.done_at[peer]
        k = self.cursor[peer]
        while k < upto:
            if k not in skip:
                tag, is_send, shape, dtype = rows[k]
                if is_send:
                    raise PlanError(f"{self.me}: {what} before message {tag} to {peer} was "
                                    "sent, out of the schedule's order (a bug)",
                                    fix="report the plan; run with schedule='gpipe' meanwhile")
                self._irecv(tag, shape, dtype, peer)
            k += 1
        self.cursor[peer] = k

    def send(self, tensor, src: str, dst: str, tag: int) -> None:
        if dst == self.me:
            self.box[tag] = tensor.detach()
            return
        start = time.perf_counter()
        at = self.where.get((tag, True))
        if at is not None:
            peer, i = at
            if i < self.cursor[peer]:
                raise PlanError(f"{self.me}: message {tag} to {peer} sent twice or out of "
                                "the schedule's order (a bug)", fix="report the plan")
            self._advance(peer, i, f"message {tag} sent")
            self.cursor[peer] = i + 1
        data = tensor.detach().to("cpu") if self.stage else tensor.detach()
        self.pending.append((dist.isend(data, dst=self.rank_of[dst], tag=self._wire(tag)),
                             data))
        self.log.append((dst, tag, "send"))
        if _DEBUG:
            print(f"[{self.me}] send tag {tag} to {dst} {tuple(data.shape)} at "
                  f"{time.perf_counter():.6f}", flush=True)
        if self.spin:
            handover()
        self.comm_time[self.me] += time.perf_counter() - start

    def post(self, incoming: list[tuple]) -> None:
        """Post the coming step's receives ahead (gloo; NCCL posts them as
        the sequence reaches them, see the class doc). gloo sends a message
        only once its receiver has asked for it, so a receive posted when
        it is needed costs a round trip (and, on a busy host, the wake-ups
        of both ranks) before the data moves; posted early, the data is
        there when the consumer looks. Per peer in the sequence's order."""
        if not self.prepost:
            return
        order = {}
        for row in incoming:
            at = self.where.get((row[0], False))
            order[row[0]] = (at[0], at[1]) if at is not None else ("", row[0])
        # every receive first, then the watchers: a watcher that wakes while
        # receives are still being posted takes the GIL from the poster
        # (measured: 14 receives posted in 1.46 ms interleaved, 0.85 ms so)
        works = []
        for tag, shape, dtype, src, _dst in sorted(incoming, key=lambda r: order[r[0]]):
            buf = self._buffer(shape, dtype)
            works.append((tag, dist.irecv(buf, src=self.rank_of[src], tag=self._wire(tag)),
                          buf))
            self.log.append((src, tag, "recv"))
            at = self.where.get((tag, False))
            if at is not None:
                self.done_at[at[0]].add(at[1])
        for tag, work, buf in works:
            self.posted[tag] = (self.watcher.watch(work), buf)

    def recv(self, shape, dtype, src: str, dst: str, tag: int):
        if src == self.me:
            return self.box.pop(tag)
        start = time.perf_counter()
        if tag not in self.posted:
            at = self.where.get((tag, False))
            if at is not None:
                peer, i = at
                self._advance(peer, i + 1, f"message {tag} received")
            else:
                self._irecv(tag, shape, dtype, src)
        handle, buf = self.posted.pop(tag)
        with _STATUS.wait(self.rank_of[src]):
            handle.wait()
        self.comm_time[self.me] += time.perf_counter() - start
        if _DEBUG:
            print(f"[{self.me}] recv tag {tag} from {src} {tuple(shape)} "
                  f"{(time.perf_counter() - start) * 1e3:.2f} ms at {time.perf_counter():.6f}",
                  flush=True)
        return buf.to(self.device) if self.stage else buf

    def finish(self) -> None:
        with _STATUS.wait(None, "sends to complete"):
            for work, _ in self.pending:
                work.wait()
            # every posted receive is consumed by a correct step; wait out any
            # left so the next step's receives cannot match stale ones
            for handle, _ in self.posted.values():
                handle.wait()
        self.pending.clear()
        self.posted.clear()
        self.box.clear()
        self.seq, self.where, self.cursor, self.done_at = {}, {}, {}, {}

    def make_groups(self, holder_sets) -> None:
        """Every rank creates the same groups in the same order."""
        for devs in sorted(set(holder_sets)):
            if len(devs) > 1:
                ranks = sorted(self.rank_of[d] for d in devs)
                self.groups[devs] = dist.new_group(ranks)

    def allreduce(self, tensors: dict, holders: tuple) -> None:
        start = time.perf_counter()
        flat = tensors[self.me]
        data = flat.to("cpu") if self.stage else flat
        with _STATUS.wait(None, f"all-reduce over {', '.join(holders)}"):
            wait_work(dist.all_reduce(data, op=dist.ReduceOp.SUM, group=self.groups[holders],
                                      async_op=True), self.spin)
        if self.stage:
            flat.copy_(data)
        self.comm_time[self.me] += time.perf_counter() - start


def run_rank(model: torch.nn.Module, plan, example_inputs, *, steps: int = 3, warmup: int = 1,
             optimizer=None, loss_fn: Callable | None = None, targets=None, graph=None,
             cluster=None, device: str | torch.device | None = None, training: bool = True,
             loss_reduction: str = "mean", problem_options: dict | None = None,
             seed: int = 0, calibrate: bool = False,
             busy_poll: bool | None = None, engine: str = "builtin",
             p2p_tag0: bool | None = None) -> dict | None:
    """Run this rank's share of the plan; the process group must be up.

    Returns, on rank 0, a dict with ``loss``, ``losses``, ``outputs``,
    ``gradients``, ``parameters`` (merged over ranks) and ``report`` (a dict
    of the :class:`MeasuredReport` figures); None on the other ranks.

    ``calibrate``: before the steps, the ranks measure what the prediction
    needs, independently of the plan's steps: every op's time on each
    rank's device (:func:`placer.runtime.profile.profile`, averaged over the
    ranks) and the links between the ranks (ping-pong at several sizes,
    :func:`placer.runtime.profile.measure_links`); the prediction is then
    made on that calibrated graph and cluster (``calibration`` in the
    result says what was measured). The first calibration round runs
    before the schedule is made, so the ranks run the order the
    prediction's simulator assumes on those measurements (``schedule_source``
    in the result: ``"simulator"``); the others are interleaved with
    the steps, and before every measured step the ranks sample their share
    of the cores and (several CPU ranks, training) run one step of a
    :class:`Reference` pipeline, whose measured over predicted step scales
    the prediction; the plan's own steps never enter it.

    ``busy_poll``: poll the collectives (step barrier, all-reduces) and
    keep this rank's cores awake (:mod:`placer.runtime.waiting`),
    calibration included; point-to-point receives block either way. None:
    when this process was pinned to cores of its own (:func:`pin_cores`)
    and is a CPU rank over gloo.

    ``p2p_tag0``: send every point-to-point message with tag 0 (messages
    match by their order alone, as under NCCL; see :class:`DistTransport`);
    None: the environment variable :data:`P2P_TAG0_ENV` decides. The result
    also has, per device, the tasks its rank ran in the last step
    (``executed``: ``(kind, microbatch, piece, replica)``) and the messages
    it posted (``posted``: ``(peer, tag, "send"|"recv")``).
    ``engine="pipelining"``: run on torch.distributed.pipelining instead
    (:func:`placer.runtime.pipelining.run_rank`)."""
    if engine != "builtin":
        from . import pipelining
        pipelining.check_engine(engine)
        return pipelining.run_rank(model, plan, example_inputs, steps=steps, warmup=warmup,
                                   optimizer=optimizer, loss_fn=loss_fn, targets=targets,
                                   graph=graph, cluster=cluster, device=device,
                                   training=training, loss_reduction=loss_reduction,
                                   problem_options=problem_options, seed=seed,
                                   calibrate=calibrate)
    torch.manual_seed(seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    graph, plan, sp, inputs, mb_rows = prepare(model, plan, example_inputs, graph=graph,
                                               training=training)
    devs = rank_devices(plan, cluster)
    me, backend, tdev = this_rank(devs, cluster, device)
    if tdev.type == "cuda":
        torch.cuda.set_device(tdev)      # NCCL's collectives run on this device
    fallback = tdev.type == "cpu" and gpu_named(me, cluster)
    routes = Routes(sp, mb_rows, sink_device(sp))
    spin = busy_poll if busy_poll is not None else busy_poll_default(
        _PINNED is not None, tdev.type, backend)
    transport = DistTransport({d: i for i, d in enumerate(devs)}, me, tdev, backend, spin=spin,
                              tag0=p2p_tag0)
    rounds, shares, between = [], [], []
    # how much the ranks slow each other down is timed on the model's own ops
    from .profile import model_work
    probe = model_work(model, example_inputs, tdev) if calibrate else None
    agreed = torch.tensor([0.0 if probe is None else 1.0])
    if calibrate:
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)   # every rank times the same kind
        probe = probe if float(agreed) > 0 else None

    def calibration_round():
        _STATUS.set("calibrating")
        rng = torch.get_rng_state()   # the steps draw the same numbers as without it
        with _STATUS.wait(None, "calibration"):
            # a loss of (outputs, targets) is not timed: the profile runs
            # rows without their targets
            rounds.append(_calibration_round(model, example_inputs, graph, tdev,
                                             loss_fn=loss_fn if targets is None else False,
                                             spin=spin, work=probe, transport=transport,
                                             devs=devs))
        torch.set_rng_state(rng)

    order_on = (graph, cluster, {**RUNTIME_OPTIONS, **(problem_options or {})})
    if calibrate:
        # the first round before the schedule: the ranks then run the order
        # the prediction's simulator assumes on what they measured, not the
        # dispatch rule's (no cluster is known before)
        calibration_round()
        early = _combine_calibration(rounds, graph, devs, tdev)
        if early is not None:
            order_on = (early["graph"], early["cluster"],
                        {**calibrated_options(early), **(problem_options or {})})
    # the order the prediction assumes when a cluster is given (see
    # placer.schedule.for_plan): rank 0's, sent to all (every rank would
    # compute the same, but a simulation on a host of another CPU could
    # break a near tie the other way)
    sched = for_plan(routes, plan, training, *order_on) if rank == 0 else None
    if world > 1:
        shared = [schedule_plain(sched) if sched is not None else None]
        dist.broadcast_object_list(shared, src=0)
        sched = schedule_from_orders(routes, shared[0], training)
    used = sched.name
    batch = sum(mb_rows)
    weights = [(n / batch if loss_reduction == "mean" else 1.0) for n in mb_rows]
    offsets = [sum(mb_rows[:m]) for m in range(len(mb_rows))]
    order = [(me, t) for t in sched.orders.get(me, [])]
    engine = Engine(sp, routes, {d: tdev for d in devs}, [me], transport, training=training,
                    loss_fn=loss_fn or default_loss, loss_weights=weights, order=order,
                    model=model, seed=seed, schedule=sched)
    engine.bucket_bytes = (getattr(plan, "allreduce", None) or {}).get("bucket_bytes")
    transport.make_groups(engine.holders.values())
    if spin:
        # gloo's socket threads must not take the core from the rank while the
        # rank holds a pair's lock (see waiting.demote_threads)
        demote_threads(TRANSPORT_THREADS)
    opt = build_optimizer(optimizer, engine.parameters()) if training else None
    params = engine.parameters()
    calibration = None
    reference = (Reference.build(model, example_inputs, graph, plan, devs, me, tdev, transport,
                                 loss_fn=loss_fn or default_loss,
                                 loss_reduction=loss_reduction, seed=seed)
                 if calibrate and training and world > 1 and tdev.type == "cpu" else None)
    # the other calibration rounds interleaved with the measured steps, so
    # both sample the same load of a shared machine (the first ran above)
    chunk = -(-steps // min(CALIBRATION_ROUNDS, steps))
    cal_before = {warmup + k for k in range(0, steps, chunk)} - {warmup} if calibrate else set()
    times, losses, last, grads, timeline = [], [], None, {}, []
    executed, posted = [], []
    compute = comm = cpu_time = 0.0
    peak_act = 0.0
    cores = sorted(os.sched_getaffinity(0)) if spin and hasattr(os, "sched_getaffinity") \
        else []
    with KeepAwake(cores), quick_handover():
        for step in range(steps + warmup):
            if step in cal_before:
                calibration_round()
            if calibrate and step >= warmup:
                # the load of a shared host changes from second to second: the
                # shares are sampled before every measured step, too
                with _STATUS.wait(None, "calibration"):
                    shares.append(_shares(tdev, 0.05, probe))
                    if reference is not None:
                        # a reference step beside each measured one: both
                        # see the host's speed of the moment
                        between.append(reference.run(1, spin, targets))
            _STATUS.set(f"step {step}")
            _maybe_inject_fault(rank, step)
            for p in params:
                p.grad = None
            transport.comm_time.clear()
            if tdev.type == "cuda":
                torch.cuda.synchronize(tdev)
                torch.cuda.reset_peak_memory_stats(tdev)
            start, cpu_start = _start_step(engine, spin)
            last, kept = engine.train_step(inputs, targets, offsets, training=training,
                                           optimizer=opt,
                                           keep_gradients=step == steps + warmup - 1)
            grads = kept if kept is not None else grads
            if tdev.type == "cuda":
                torch.cuda.synchronize(tdev)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            cpu_used = time.process_time() - cpu_start
            with _STATUS.wait(None, "the step's end"):
                wait_work(dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, async_op=True), spin)
            if step >= warmup:
                if not times or float(elapsed) <= statistics.median(times):
                    timeline = [dataclasses.astuple(e) for e in engine.events]   # a typical step
                times.append(float(elapsed))
                losses.append(last["loss"])
                compute += last["stats"].compute.get(me, 0.0) / steps
                cpu_time += cpu_used / steps
                comm += transport.comm_time.get(me, 0.0) / steps
                peak_act = max(peak_act, last["stats"].peak_act.get(me, 0.0))
                executed = [(k, m, i.piece, i.replica) for _d, (k, m, i) in engine.executed]
                posted = list(transport.log)
    if tdev.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(tdev))
    else:
        state = 0.0
        if opt is not None:
            for p in params:
                for v in opt.state.get(p, {}).values():
                    if isinstance(v, torch.Tensor):
                        state += v.numel() * v.element_size()
        pbytes = engine.param_bytes().get(me, 0.0)
        peak = pbytes * (2 if training else 1) + state + peak_act
    mine = {"device": me, "loss": last["loss"], "losses": losses,
            "outputs": (join_outputs(sp, last["outputs"]) if last["outputs"] else None),
            "gradients": grads, "parameters": engine.state(), "compute": compute,
            "comm": comm, "peak": peak, "cpu_time": cpu_time, "events": timeline,
            "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None, "executed": executed, "posted": posted, "cpu_fallback": fallback}
    if calibrate:
        with _STATUS.wait(None, "the calibration gather"):
            calibration = _combine_calibration(rounds, graph, devs, tdev, shares, between)
    gathered = [None] * world if rank == 0 else None
    _STATUS.set("gather results")
    with _STATUS.wait(None, "the results gather"):
        dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return None
    merged = {"loss": None, "losses": [], "outputs": None, "gradients": {}, "parameters": {}}
    for part in gathered:
        if part["loss"] is not None:
            merged["loss"], merged["losses"] = part["loss"], part["losses"]
        if part["outputs"] is not None:
            merged["outputs"] = part["outputs"]
        for key in ("gradients", "parameters"):
            for k, v in part[key].items():
                merged[key].setdefault(k, v)
    step_time = statistics.median(times)
    busy = {p["device"]: p["compute"] + p["comm"] for p in gathered}
    if calibration is not None:
        from .contention import predict_shared
        cg, cc = calibration["graph"], calibration["cluster"]
        options = {**calibrated_options(calibration), **(problem_options or {})}
        factor = (reference_factor(calibration, reference.plan, options)
                  if reference is not None else 1.0)
        prediction = predict_shared(cg, cc, plan, **options)
        calibration["predicted_model"] = prediction.step_time   # before the factor
        prediction.step_time *= factor
        calibration["cpu_shares"] = prediction.extra["cpu_shares"]
        merged["calibration"] = {**calibration, "graph": cg.to_dict(), "cluster": cc.to_dict()}
    elif cluster is not None:
        prediction = predict(graph, cluster, plan, problem_options)
    else:
        prediction = None
    report = MeasuredReport(step_time=step_time, peak_memory={p["device"]: p["peak"]
                                                              for p in gathered},
                            busy=busy, compute={p["device"]: p["compute"] for p in gathered},
                            comm={p["device"]: p["comm"] for p in gathered},
                            idle={d: max(0.0, step_time - b) for d, b in busy.items()},
                            model="measured", microbatches=len(mb_rows), schedule=used,
                            predicted=prediction.step_time if prediction else None,
                            step_times=times)
    merged["report"] = report.to_dict() | {"predicted": report.predicted,
                                           "step_times": times}
    # CPU time of each rank's process per step (all its threads): against
    # ``busy``, how much of a step a rank spent preempted on a shared host
    merged["cpu_time"] = {p["device"]: p["cpu_time"] for p in gathered}
    # the cores each rank's process could run on (see pin_cores)
    merged["cores"] = {p["device"]: p["cores"] for p in gathered}
    # each rank's timeline of a typical measured step (Event fields as tuples;
    # rank clocks differ, so starts are relative to each rank's step start)
    merged["events"] = [e for p in gathered for e in p["events"]]
    merged["schedule"] = used
    # whether the ranks ran the simulator's order ("simulator") or the
    # dispatch rule's ("rule"; see placer.schedule.for_plan)
    merged["schedule_source"] = sched.source
    merged["executed"] = {p["device"]: p["executed"] for p in gathered}
    merged["posted"] = {p["device"]: p["posted"] for p in gathered}
    merged["p2p_tag0"] = transport.tag0
    merged["backend"] = backend
    fell_back = [p["device"] for p in gathered if p["cpu_fallback"]]
    if fell_back:
        # one line for the whole run; a GPU's prediction says nothing of a CPU's step
        print(cpu_fallback_line(fell_back), file=sys.stderr, flush=True)
        merged["report"]["predicted"] = None
        merged["report"]["cpu_fallback"] = fell_back
        merged["report"]["prediction_compared"] = False
    merged["cpu_fallback"] = fell_back
    merged["notes"] = list(sp.notes)
    return merged


#: seconds a busy-polling rank sleeps after the step barrier so that its
#: transport threads (idle priority) handle the receive notices of the
#: step's messages before it starts (see Engine.post_receives)
NOTICE_WAIT = 0.0003


def _start_step(engine: Engine, spin: bool) -> tuple[float, float]:
    """Collective: post the step's receives, pass the step barrier and
    return the step's start (wall clock, process CPU time), set back by
    what posting took: that counts in the step, the barrier's wait does
    not."""
    cpu_post = time.process_time()
    posted = engine.post_receives()
    cpu_post = time.process_time() - cpu_post
    with _STATUS.wait(None, "the step barrier"):
        wait_work(dist.barrier(async_op=True), spin)
    if spin and posted:
        # the socket threads handle the peers' receive notices (see
        # Engine.post_receives) while this rank sleeps, not in the step
        time.sleep(NOTICE_WAIT)
    return time.perf_counter() - posted, time.process_time() - cpu_post


#: calibration rounds a ``calibrate=True`` run interleaves with its steps
CALIBRATION_ROUNDS = 3


def _calibration_round(model, example_inputs, graph, tdev, loss_fn=None,
                       spin: bool = False, work=None, transport=None, devs=()) -> dict:
    """Collective: one round of microbenchmarks on every rank: the links
    between ranks, the share of a core each rank gets while all compute,
    every op's time on this rank's device (one rank at a time), how much
    slower the same ops ran with every rank timing them at once
    (``ops_together``), what a message costs each end (fixed and per byte,
    :func:`_message_costs`) and what a chunk of the model loses after a
    wait (:func:`placer.runtime.profile.resume_cost`)."""
    from ..cluster import Cluster, Device
    from .profile import allreduce_sizes, measure_links, profile, resume_cost
    links = measure_links(dist.get_world_size(), dist.get_rank(), repeats=5, spin=spin,
                          allreduce_sizes=allreduce_sizes(sum(op.param_bytes for op in graph)))
    sync = _sync_delays(links["pairs"], transport, list(devs))
    messages, copy_rate = (_message_costs(transport, list(devs)) if transport is not None
                           else (0.0, float("inf")))
    name = str(tdev)
    here = Cluster.from_rules("here", [Device(name, 1e11, 1e10)], default=(1e9, 1e-4))
    share_one, share_all, rate_before = _shares(tdev, 0.1, work)
    resume = resume_cost(work)
    # op times one rank at a time (the median repeat: an op's typical speed
    # at a whole core; the time slices it loses are the shares')
    for turn in range(dist.get_world_size()):
        dist.barrier()
        if turn == dist.get_rank():
            timed, cal = profile(model, example_inputs, graph=graph, cluster=here,
                                 devices=[name], repeats=3, warmup=1, loss_fn=loss_fn,
                                 share=1.0)
    dist.barrier()
    # and every rank at once: how much slower the same ops run while the
    # others compute too (caches, memory, a virtual machine's siblings)
    _, cal_all = profile(model, example_inputs, graph=graph, cluster=here, devices=[name],
                         repeats=3, warmup=1, loss_fn=loss_fn, share=1.0, tasks=False)
    dist.barrier()
    # the work's rate after the op times too: the host's speed drifts within
    # a round (see speed_drift)
    rate_after = _shares(tdev, 0.05, work)[2]
    dev = cal.device(name)
    together = cal_all.device(name).extra["measured_step"] / max(
        dev.extra["measured_step"], 1e-12)
    return {"ops": {op.id: op.extra["measured"][name] for op in timed
                    if name in op.extra.get("measured", {})},
            "op_overhead": dev.extra["op_overhead"], "efficiency": dev.efficiency,
            "task_overhead": dev.extra["task_overhead"],
            "cpu_share": share_one, "cpu_share_all": share_all,
            "points": {pair: link["points"] for pair, link in links["pairs"].items()},
            "sync_delay": sync, "allreduce": links["allreduce"],
            "message_overhead": messages, "message_copy_rate": copy_rate,
            "resume_overhead": resume, "ops_together": together,
            "probe_rate": (rate_before + rate_after) / 2}


#: payload sizes (float32 elements) :func:`_message_costs` times messages at
MESSAGE_SIZES = (64, 64 << 10)


def _message_costs(transport: "DistTransport", devs: list[str], count: int = 16,
                   repeats: int = 5) -> tuple[float, float]:
    """Collective: ``(seconds, bytes per second)``: what a message costs a
    rank's own time at each end, fixed and per byte of payload, measured on
    the runtime's transport between ranks 0 and 1 at two sizes
    (:data:`MESSAGE_SIZES`): rank 1 posts ``count`` receives and, once they
    arrived, takes them; rank 0 sends them. The mean of a message's
    receiving (posting, watching and taking) and sending costs, median over
    ``repeats`` (``Problem(message_overhead=..., message_copy_rate=...)``;
    ``(0, inf)`` with one rank). Costs are the process's CPU time (all its
    threads, and the kernel's work on its behalf): a receive's watcher
    thread wakes, takes the GIL and parks while the rank computes; a send
    over loopback TCP runs the receiver's network stack in the sender's
    time (timing the calls alone read 50-134 us per message; sends of the
    tiny model's 32-128 KB activations took 0.11 ms median, 0.21 ms mean,
    in its 2-rank steps)."""
    if len(devs) < 2:
        return 0.0, float("inf")
    costs = [_message_cpu(transport, devs, n, count, repeats) for n in MESSAGE_SIZES]
    extra = (MESSAGE_SIZES[1] - MESSAGE_SIZES[0]) * 4
    grow = costs[1] - costs[0]
    rate = extra / grow if grow > 0 else float("inf")
    return max(0.0, costs[0] - MESSAGE_SIZES[0] * 4 / rate), rate


def _message_cpu(transport: "DistTransport", devs: list[str], numel: int, count: int,
                 repeats: int) -> float:
    """Collective: the mean CPU seconds per message per end of ``count``
    messages of ``numel`` floats from rank 0 to rank 1 (see
    :func:`_message_costs`), median over ``repeats``."""
    rank = dist.get_rank()
    src, dst = devs[0], devs[1]
    tags = [1_000_000 + i for i in range(count)]
    data = torch.zeros(numel, device=transport.device)
    samples = []
    for _ in range(repeats):
        wait_work(dist.barrier(async_op=True), transport.spin)
        spent = 0.0
        if rank == 1:
            start = time.process_time()
            transport.post([(t, (numel,), torch.float32, src, dst) for t in tags])
            time.sleep(0.003)            # the messages arrive; sleeping costs no CPU
            for t in tags:
                transport.recv((numel,), torch.float32, src, dst, t)
            spent = time.process_time() - start
            transport.finish()
        elif rank == 0:
            time.sleep(0.001)            # the receives are posted
            start = time.process_time()
            for t in tags:
                transport.send(data, src, dst, t)
            transport.finish()
            spent = time.process_time() - start
        both = torch.tensor([spent if rank < 2 else 0.0], dtype=torch.float64)
        dist.all_reduce(both, op=dist.ReduceOp.SUM)
        samples.append(float(both) / (2 * count))
    transport.comm_time.clear()
    return statistics.median(samples)


def _sync_delays(pairs: dict, transport: "DistTransport | None" = None,
                 devs: list[str] = ()) -> dict:
    """Collective: :func:`placer.runtime.profile.sync_delay` of every pair of
    ranks, one pair at a time (the others wait), its messages through
    ``transport`` when given (``devs``: the ranks' device names)."""
    from .profile import sync_delay
    rank, out = dist.get_rank(), {}
    for (i, j), link in pairs.items():
        dist.barrier()
        peer = j if rank == i else i
        via = dict(transport=transport, names=(devs[rank], devs[peer])) \
            if transport is not None else {}
        delay = sync_delay(peer, link["latency"], **via) if rank in (i, j) else 0.0
        shared = torch.tensor([delay], dtype=torch.float64)
        dist.all_reduce(shared, op=dist.ReduceOp.MAX)
        out[(i, j)] = float(shared)
    return out


def _shares(tdev, seconds: float, work=None) -> tuple[float, float, float]:
    """Collective: the share of a core this rank gets while it computes
    alone (the others wait) and while every rank computes at once (ranks on
    one host share its cores and its other work; see
    :mod:`placer.runtime.contention`), and the rate (chunks a second) of
    ``work`` alone. The second is an effective share:
    when the work rate drops more than the share while all compute (ranks
    on cores of their own that slow each other down through what the cores
    share), the rate's ratio counts. ``work``: the chunk of work timed
    (:func:`placer.runtime.profile.model_work`; default small matrix
    products)."""
    from .profile import cpu_speed
    dist.barrier()
    share_all, rate_all = cpu_speed(tdev, seconds, work)
    for turn in range(dist.get_world_size()):
        dist.barrier()
        if turn == dist.get_rank():
            share_one, rate_one = cpu_speed(tdev, seconds, work)
    dist.barrier()
    if rate_one > 0:
        share_all = min(share_all, share_one * rate_all / rate_one)
    return share_one, share_all, rate_one


def link_fits(rounds: list[dict]) -> dict:
    """Each rank pair's link from this rank's calibration rounds (their
    ``points``, bytes -> seconds, and ``sync_delay``): the medians over the
    rounds of every size some round measured, fitted by
    :func:`placer.runtime.profile.fit_link`. A round on a loaded host may
    stop after its first size (see :func:`~placer.runtime.profile.measure_links`):
    only sizes common to all rounds could leave one, whose fit is an
    infinite bandwidth that the cluster file cannot hold; with one size
    left, its whole time counts as transfer (a lower bound)."""
    from .profile import fit_link
    med = statistics.median
    pairs = {}
    for pair in rounds[0]["points"]:
        sizes = set.union(*(set(r["points"][pair]) for r in rounds))
        points = {n: med(r["points"][pair][n] for r in rounds if n in r["points"][pair])
                  for n in sizes}
        bw, lat = fit_link(points)
        if not math.isfinite(bw):
            n = max(points)
            bw = n / max(points[n], 1e-12)
        pairs[pair] = {"bandwidth": bw, "latency": lat, "points": points,
                       "sync_delay": med(r["sync_delay"][pair] for r in rounds)}
    return pairs


def _combine_calibration(rounds: list[dict], graph, devs: list[str], tdev,
                         shares: list = (), between: list = ()) -> dict | None:
    """Collective: rank 0 gets the calibrated graph and cluster (medians over
    every round of every rank: the ranks' devices are alike); None elsewhere."""
    from ..cluster import Device
    from .profile import (allreduce_sizes, calibrated_graph, collective_efficiency,
                          ranks_cluster)
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((rounds, list(shares), list(between)), gathered, dst=0)
    if gathered is None:
        return None
    every = [r for part, _, _ in gathered for r in part]
    samples = [(r["cpu_share"], r["cpu_share_all"]) for r in every] + \
        [s[:2] for _, part, _ in gathered for s in part]
    med = statistics.median
    name = str(tdev)
    timed = type(graph).from_dict(graph.to_dict())
    for op in timed:
        rows = [r["ops"][op.id] for r in every if op.id in r["ops"]]
        if rows:
            op.extra.setdefault("measured", {})[name] = {k: med(row[k] for row in rows)
                                                         for k in rows[0]}
    ovh = med(r["op_overhead"] for r in every)
    task = med(r["task_overhead"] for r in every)
    messages = med(r.get("message_overhead", 0.0) for r in every)
    copy_rate = med(r.get("message_copy_rate", float("inf")) for r in every)
    copy_rate = None if math.isinf(copy_rate) else copy_rate   # JSON has no inf
    resume = med(r.get("resume_overhead", 0.0) for r in every)
    drift = speed_drift([r.get("probe_rate", 0.0) for r in every],
                        [s[2] for _, part, _ in gathered for s in part if len(s) > 2])
    share = med(s[0] for s in samples)
    share_all = med(s[1] for s in samples)
    # the model's ops timed while every rank computes, against one rank at a
    # time: where that slows them more than the probes say, it counts
    together = med(r.get("ops_together", 1.0) for r in every)
    if together > 1.0:
        share_all = min(share_all, share / together)
    # op times at a whole core; the shares stay in the ranks' devices
    dev = Device(name, 1e11, 1e10, efficiency=med(r["efficiency"] for r in every),
                 extra={"op_overhead": ovh, "cpu_share": 1.0, "task_overhead": task})
    shared = Device(name, 1e11, 1e10, efficiency=dev.efficiency,
                    extra={"op_overhead": ovh, "cpu_share": share, "cpu_share_all": share_all,
                           "task_overhead": task})
    pairs = link_fits(rounds)
    allreduce = {n: med(r["allreduce"][n] for r in rounds) for n in rounds[0]["allreduce"]}
    reference: dict = defaultdict(list)
    for _, _, part in gathered:
        for r in part:
            reference[r["device"]].append(r)
    # the ring runs at the speed of its slowest link and its worst latency,
    # as the cluster below states them (synchronisation delay included)
    efficiency = collective_efficiency(
        allreduce, min((v["bandwidth"] for v in pairs.values()), default=float("inf")),
        max((v["latency"] + v["sync_delay"] for v in pairs.values()), default=0.0), len(devs),
        sizes=allreduce_sizes(sum(op.param_bytes for op in graph)))
    from ..cluster import Cluster
    one = Cluster("here", [dev], [[float("inf")]], [[0.0]])
    return {"graph": calibrated_graph(timed, one, name, overhead=ovh),
            "cluster": ranks_cluster(devs, shared, {"pairs": pairs}), "op_overhead": ovh,
            "task_overhead": task, "collective_efficiency": efficiency,
            "message_overhead": messages, "message_copy_rate": copy_rate,
            "resume_overhead": resume, "speed_drift": drift,
            "efficiency": dev.efficiency, "cpu_share": share, "cpu_share_all": share_all,
            "ops_together": together,
            "reference_compute": {d: med(x for r in v for x in r["compute"])
                                  for d, v in reference.items()},
            "reference_step": max((med(x for r in v for x in r["step"])
                                   for v in reference.values()), default=None),
            "rounds": len(every),
            "links": {f"{devs[i]}-{devs[j]}": v for (i, j), v in pairs.items()},
            "allreduce": allreduce}


#: bounds of :func:`speed_drift` (a ratio outside them is a broken measurement)
SPEED_DRIFT_BOUNDS = (0.67, 1.5)


def speed_drift(calibration_rates: list[float], step_rates: list[float]) -> float:
    """How much slower the host ran the ranks' work around the measured
    steps than around the op timings: the median rate (chunks a second of
    :func:`placer.runtime.profile.model_work`, one rank at a time) in the
    calibration rounds over the median rate sampled before each measured
    step, within :data:`SPEED_DRIFT_BOUNDS`; 1.0 without samples. A
    diagnostic (``calibration["speed_drift"]``), not applied to the
    prediction: on this project's 2-core VM plain PyTorch steps of the tiny
    GPT ran 16-18 ms for half a second, then 25-30 ms for the next, and the
    model's forward timed beside each step tracked them (step / forward
    3.0-3.7x, 10th to 90th percentile of 80 pairs), but multiplying the runtime's predictions
    by it made the accuracy bench's median error worse in 3 of 5 runs (the
    samples' own noise is as large as the drift they measure)."""
    cal = [r for r in calibration_rates if r > 0]
    steps = [r for r in step_rates if r > 0]
    if not cal or not steps:
        return 1.0
    lo, hi = SPEED_DRIFT_BOUNDS
    return min(hi, max(lo, statistics.median(cal) / statistics.median(steps)))


def reference_plan(graph, devs: list[str], microbatches: int, schedule: str = "1f1b"):
    """A contiguous pipeline of ``graph`` over ``devs`` in topological order
    (equal op counts; colocated ops follow the first of their group): the
    workload on which :class:`Reference` times ops inside the runtime."""
    from ..plan import Plan
    order = graph.topological_order()
    k = len(devs)
    placement = {op: [devs[min(k - 1, i * k // max(len(order), 1))]]
                 for i, op in enumerate(order)}
    for members in graph.colocation_groups().values():
        for op in members[1:]:
            placement[op] = list(placement[members[0]])
    return Plan(placement, microbatches=max(1, int(microbatches)), schedule=schedule)


class Reference:
    """Steps of :func:`reference_plan`, one before each of the plan's
    measured steps, beside the plan's own engine (its own weight copies, no
    optimizer), run as the plan's steps are (receives posted before the
    barrier). Beside the measured steps, not in the calibration rounds: the
    host's speed changes from second to second (see :func:`speed_drift`),
    and the factor must see the speed the plan's steps saw. In two accuracy
    runs measuring both at once, the median error was 11.6% and 11.5% with
    the factor from steps beside the measured ones, 10.0% and 20.2% with
    it from 10 steps in each of the three calibration rounds.

    Why: on this project's 2-core VM the simulator, calibrated by
    microbenchmarks, predicted 2-rank steps 6-46% short while the ranks'
    compute in those steps was within 3-18% of its (plans 0 and 4 of the
    accuracy bench): what it misses is spread thin (a task run after a
    wait starts with cold caches, which ``resume_overhead`` now charges in
    part; a message's transport calls cost 0.1-0.4 ms where the
    microbenchmark reads 0.09; waits end late). The reference
    pipeline's measured step over its prediction (:func:`reference_factor`)
    says how much of a multi-rank step this host adds, measured in the
    same run on a plan other than the one predicted. CPU ranks only: it
    holds a second copy of the rank's share of the weights, which a GPU
    filled by the plan may not have room for (GPU ranks predict with the
    simulator alone)."""

    def __init__(self, engine: Engine, plan, inputs, offsets, me: str):
        self.engine, self.plan, self.inputs, self.offsets, self.me = \
            engine, plan, inputs, offsets, me
        self.warm = False

    @classmethod
    def build(cls, model, example_inputs, graph, plan, devs, me, tdev, transport, *,
              loss_fn, loss_reduction: str, seed: int) -> "Reference | None":
        """The reference engine on this rank, or None (every rank agrees) when
        the pipeline would need a collective the transport has no group for."""
        ref = reference_plan(graph, devs, plan.microbatches, plan.schedule)
        _g, ref, sp, inputs, mb_rows = prepare(model, ref, example_inputs, graph=graph)
        routes = Routes(sp, mb_rows, sink_device(sp))
        sched = build_schedule(routes, ref.schedule, True)
        batch = sum(mb_rows)
        weights = [(n / batch if loss_reduction == "mean" else 1.0) for n in mb_rows]
        engine = Engine(sp, routes, {d: tdev for d in devs}, [me], transport, training=True,
                        loss_fn=loss_fn, loss_weights=weights,
                        order=[(me, t) for t in sched.orders.get(me, [])], model=model,
                        seed=seed, schedule=sched)
        ok = torch.tensor([0.0 if any(len(h) > 1 for h in engine.holders.values()) else 1.0])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if float(ok) == 0:
            return None
        offsets = [sum(mb_rows[:m]) for m in range(len(mb_rows))]
        return cls(engine, ref, inputs, offsets, me)

    def run(self, steps: int, spin: bool, targets=None) -> dict:
        """Collective: ``steps`` reference steps (one more the first time, to
        warm up); returns this rank's compute and step seconds per step."""
        compute, elapsed = [], []
        for k in range(steps + (0 if self.warm else 1)):
            for p in self.engine.parameters():
                p.grad = None
            start, _cpu = _start_step(self.engine, spin)
            last, _ = self.engine.train_step(self.inputs, targets, self.offsets, training=True)
            if self.warm or k > 0:
                elapsed.append(time.perf_counter() - start)
                compute.append(last["stats"].compute.get(self.me, 0.0))
        self.warm = True
        return {"device": self.me, "compute": compute, "step": elapsed}


#: bounds of :func:`reference_factor` (one outside them is a broken measurement)
REFERENCE_FACTOR_BOUNDS = (0.67, 1.5)


def reference_factor(calibration: dict, ref_plan, options: dict) -> float:
    """The :class:`Reference` pipeline's measured step (the slowest rank's
    median) over the simulator's prediction for it, within
    :data:`REFERENCE_FACTOR_BOUNDS`: the factor a multi-rank prediction is
    multiplied by. Records it (``reference_factor``, the raw ratio, the
    predicted step and each rank's compute, predicted) in
    ``calibration``."""
    from .contention import predict_shared
    measured = calibration.get("reference_step")
    report = predict_shared(calibration["graph"], calibration["cluster"], ref_plan, **options)
    predicted: dict = defaultdict(float)
    for e in report.events():
        if e.category in ("forward", "backward"):
            predicted[e.lane] += e.duration
    raw = measured / report.step_time if measured and report.step_time > 0 else 1.0
    lo, hi = REFERENCE_FACTOR_BOUNDS
    factor = min(hi, max(lo, raw))
    calibration.update(reference_factor=factor, reference_factor_raw=raw,
                       reference_predicted=report.step_time,
                       reference_compute_predicted=dict(predicted))
    return factor


def calibrated_options(calibration: dict) -> dict:
    """The cost model's options for a runtime prediction
    (:data:`placer.runtime.run.RUNTIME_OPTIONS`) and those a
    ``calibrate=True`` run measured (launch, task, message and resume
    overheads, message copy rate, all-reduce efficiency), for
    :func:`placer.runtime.contention.predict_shared`, and the links' burst
    (:func:`placer.runtime.profile.fit_burst`, the smallest of the pairs')."""
    from .profile import fit_burst
    options = {**RUNTIME_OPTIONS, **{key: calibration[key]
                                     for key in ("op_overhead", "task_overhead",
                                                 "collective_efficiency", "message_overhead",
                                                 "message_copy_rate", "resume_overhead")
                                     if calibration.get(key) is not None}}
    bursts = [fit_burst({int(n): t for n, t in link["points"].items()})
              for link in calibration.get("links", {}).values() if link.get("points")]
    if bursts:
        options["link_burst"] = min(bursts)
    return options


# --------------------------------------------------------------------------
# process start-up
# --------------------------------------------------------------------------
def _free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the store binds it a moment later)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LauncherStopped(KeyboardInterrupt):
    """The launcher got SIGTERM or SIGHUP (SIGINT stays KeyboardInterrupt);
    its ranks were stopped. A KeyboardInterrupt, so the CLI reports it as
    an interruption."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _StopOnSignals:
    """Within the block, SIGTERM/SIGHUP (and SIGINT) raise in the launcher so
    its ``finally`` stops the ranks (their default would end it at once and
    leave them running). Until :meth:`arm` a signal is only remembered: the
    ranks being started must all exist before it is raised. Only in the
    main thread (the only one that can handle signals)."""

    SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")

    def __init__(self):
        self.armed = False
        self.pending: int | None = None
        self.previous: dict = {}

    def _handle(self, signum, frame):
        if self.armed:
            raise KeyboardInterrupt if signum == signal.SIGINT else LauncherStopped(signum)
        self.pending = signum if self.pending is None else self.pending

    def arm(self) -> None:
        """From now on raise at once; raise a signal that came before."""
        self.armed = True
        if self.pending is not None:
            self._handle(self.pending, None)

    def __enter__(self) -> "_StopOnSignals":
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name, None)
                if number is not None:
                    self.previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


def _init(backend: str, timeout: float, store_host: str | None = None) -> None:
    """Join the process group. ``store_host``: rank 0 serves the rendezvous
    store on that address only (``launch`` gives loopback, so nothing off
    this machine can reach it; torch's own store listens on every
    interface); None: the environment's (torchrun's) rendezvous."""
    delta = datetime.timedelta(seconds=timeout)
    # NCCL for CUDA tensors, gloo for the CPU tensors of the small
    # collectives (step times, results) that NCCL cannot carry
    backend = "cpu:gloo,cuda:nccl" if backend == "nccl" else backend
    if store_host is None:
        dist.init_process_group(backend=backend, timeout=delta)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = int(os.environ["MASTER_PORT"])
    listen = None
    if rank == 0:
        family = socket.AF_INET6 if ":" in store_host else socket.AF_INET
        listen = socket.socket(family, socket.SOCK_STREAM)
        listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listen.bind((store_host, port))
        listen.listen(max(128, world))
    store = dist.TCPStore(store_host, port, world, rank == 0, timeout=delta,
                          master_listen_fd=None if listen is None else listen.fileno())
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world,
                            timeout=delta)


def pin_cores(local_rank: int, local_world: int) -> list[int] | None:
    """Give this process its own share of the cores it may use: the usable
    cores cut into ``local_world`` equal runs, run ``local_rank`` for this
    rank (``os.sched_setaffinity``; threads started later inherit it).
    Ranks on one host then stop preempting each other at their every
    synchronisation. Returns the cores, or None (nothing changed) when
    there are fewer usable cores than ranks or the OS cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    usable = sorted(os.sched_getaffinity(0))
    per = len(usable) // max(1, local_world)
    if per < 1 or not 0 <= local_rank < local_world:
        return None
    cores = usable[local_rank * per:(local_rank + 1) * per]
    os.sched_setaffinity(0, cores)
    global _PINNED
    _PINNED = cores
    return cores


#: the cores :func:`pin_cores` gave this process (None: not pinned)
_PINNED: list[int] | None = None


def _auto_pin(pin: bool | None, world: int) -> bool:
    """``pin=None``: pin when every rank can have a core of its own."""
    if pin is not None:
        return pin
    return hasattr(os, "sched_getaffinity") and world <= len(os.sched_getaffinity(0))


def _die_with(parent: int | None) -> None:
    """End this process when ``parent`` (its launcher) ends, however it
    ends (SIGKILL included): Linux's parent-death signal, armed first, then
    a check that the launcher did not already die while this rank started."""
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)      # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)


def _child(index: int, world: int, port: int, backend: str, timeout: float, build,
           plan_dict: dict, kwargs: dict, out_path: str, cluster_dict,
           threads: int | None = None, pin: bool = False, parent: int | None = None,
           host: str = "127.0.0.1") -> None:
    global _STATUS
    _die_with(parent)
    os.environ.update({"MASTER_ADDR": host, "MASTER_PORT": str(port),
                       "RANK": str(index), "WORLD_SIZE": str(world),
                       "LOCAL_RANK": str(index)})
    _STATUS = _Status(_status_path(out_path, index), index)
    _STATUS.set("start-up")
    cores = pin_cores(index, world) if pin else None
    torch.set_num_threads(threads or (len(cores) if cores else
                                      max(1, (os.cpu_count() or 1) // world)))
    from ..cluster import Cluster
    from ..plan import Plan
    _STATUS.set("joining the process group")
    _init(backend, timeout, store_host=host)
    try:
        _STATUS.set("building the model")
        model, inputs = build()
        cluster = Cluster.from_dict(cluster_dict) if cluster_dict else None
        _STATUS.set("preparing the plan")
        result = run_rank(model, Plan.from_dict(plan_dict), inputs, cluster=cluster, **kwargs)
        if result is not None:
            _STATUS.set("saving results")
            torch.save(result, out_path + ".tmp")
            os.replace(out_path + ".tmp", out_path)
        # every rank past its last message before any tears its group down:
        # a teardown race is the likely cause of one rank aborting in gloo
        # ("terminate called without an active exception") at exit in CI
        _STATUS.set("finishing")
        dist.barrier()
        _STATUS.set("done", "done")
    except BaseException as exc:
        text = str(exc).strip().splitlines()
        _STATUS.set(_STATUS.stage, "failed", f"{type(exc).__name__}: {text[-1] if text else ''}")
        dist.destroy_process_group()
        raise
    # every rank is past the barrier and its result is saved: leave without
    # running the process group's and its threads' destructors, where a
    # gloo teardown race aborts a rank now and then ("terminate called
    # without an active exception", seen once in a full test run)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _status_path(out_path: str, rank: int) -> str:
    return os.path.join(os.path.dirname(out_path), f"rank{rank}.status")


def _diagnose(statuses: list, codes: list, devs: list[str], hung_for: float | None) -> str:
    """One line naming the faulty rank, its device and stage."""
    def where(r: int) -> str:
        st = statuses[r] or {}
        return f"rank {r} (device {devs[r]}) in stage {st.get('stage', 'start-up')!r}"
    if hung_for is None:
        # a rank that died without reporting a failure is the cause; else the
        # first to fail (the others fail after it, losing their peer)
        dead = [r for r, c in enumerate(codes)
                if c not in (None, 0) and (statuses[r] or {}).get("state") != "failed"]
        if dead:
            r = dead[0]
            code = codes[r]
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            return f"{where(r)} died ({how})"
        failed = [r for r, s in enumerate(statuses) if s and s.get("state") == "failed"]
        if failed:
            r = min(failed, key=lambda i: statuses[i]["time"])
            return f"{where(r)} failed: {statuses[r].get('error', '')}"
        r = next(r for r, c in enumerate(codes) if c not in (None, 0))
        return f"{where(r)} exited with code {codes[r]}"
    # a hang: the rank others wait for, else a rank that is not waiting
    waited: dict[int, int] = defaultdict(int)
    for s in statuses:
        stage = (s or {}).get("stage", "")
        if ": waiting for rank " in stage:
            waited[int(stage.rsplit(" ", 1)[1])] += 1
    busy = [r for r, s in enumerate(statuses)
            if (s or {}).get("state") == "running" and "waiting for" not in s.get("stage", "")]
    for r in sorted(waited, key=lambda r: (-waited[r], r)):
        if r in busy or (statuses[r] or {}).get("state") != "done":
            return f"{where(r)} made no progress for {hung_for:.0f} s (hung)"
    r = busy[0] if busy else 0
    return f"{where(r)} made no progress for {hung_for:.0f} s (hung)"


def _stop(processes) -> None:
    """Kill and reap every child still alive."""
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(10)


def launch(plan, build: Callable[[], tuple], *, nproc: int | None = None,
           backend: str | None = None,
           timeout: float = 300.0, cluster=None, fault_timeout: float = 60.0,
           threads: int | None = None, pin: bool | None = None, host: str = "127.0.0.1",
           **kwargs) -> dict:
    """Start one local process per plan device (torch.multiprocessing, spawn),
    run :func:`run_rank` in each and return rank 0's result.

    The ranks die with the launcher whatever stops it (SIGTERM, SIGHUP,
    SIGINT: it stops them, then raises :class:`LauncherStopped` or
    KeyboardInterrupt; SIGKILL: Linux's parent-death signal), also while they
    start. Their rendezvous store listens on ``host`` only (loopback unless
    another address is given).

    ``build()`` returns ``(model, example_inputs)`` and must be picklable
    (a module-level function or ``functools.partial``) and deterministic,
    since every rank builds the model itself. ``kwargs`` go to
    :func:`run_rank`. Processes that have not finished after ``timeout``
    seconds are killed and :class:`PlanError` is raised. A rank that dies or
    fails, or a run in which no rank progresses for ``fault_timeout``
    seconds, stops every process and raises :class:`RankError` naming the
    rank, its device and its stage (see the module doc). ``threads``: torch
    threads per rank (default: this machine's cores shared out evenly).
    ``pin``: each rank runs on its own cores (:func:`pin_cores`; calibration
    included, so op times are measured as the steps run); None pins when
    there are at least as many usable cores as ranks. ``backend``: None
    picks NCCL when every rank's device is CUDA, else gloo
    (:func:`launch_backend`)."""
    import torch.multiprocessing as mp
    backend = backend or launch_backend(plan, cluster, kwargs.get("device"))
    devs = rank_devices(plan, cluster)
    if kwargs.get("engine") == "pipelining":
        from .pipelining import rank_order
        devs = rank_order(plan) or devs    # that engine's ranks, for the error lines
    nproc = nproc or len(devs)
    if nproc != len(devs):
        raise PlanError(f"--nproc {nproc} but the plan uses {len(devs)} devices",
                        fix=f"use --nproc {len(devs)}")
    with tempfile.TemporaryDirectory(prefix="placer-launch-") as tmp, \
            _StopOnSignals() as signals:
        out = os.path.join(tmp, "result.pt")
        ctx = mp.start_processes(
            _child, args=(nproc, _free_port(host), backend, timeout, build, plan.to_dict(),
                          kwargs, out, cluster.to_dict() if cluster is not None else None,
                          threads, _auto_pin(pin, nproc), os.getpid(), host),
            nprocs=nproc, join=False, start_method="spawn")
        try:
            signals.arm()       # a signal during start-up is raised here, once all exist
            _watch(ctx.processes, [_status_path(out, r) for r in range(nproc)], devs,
                   timeout, fault_timeout)
        finally:
            _stop(ctx.processes)
        if not os.path.exists(out):
            raise RankError("rank 0 finished without writing its results",
                            fix="check the plan and the model")
        return torch.load(out, weights_only=True)


_START_UP = ("step 0", "step 0: waiting for the step barrier")


def _past_start_up(status: dict | None) -> bool:
    """Whether a rank's status shows it stepping (not building, calibrating
    or meeting the others at the first step barrier)."""
    stage = (status or {}).get("stage", "")
    return stage.startswith("step ") and stage not in _START_UP and "calibrat" not in stage


def _watch(processes, status_paths: list[str], devs: list[str], timeout: float,
           fault_timeout: float) -> None:
    """Poll the children until all exit 0; raise on a death, failure or hang."""
    deadline = time.monotonic() + timeout + 30
    last_change, seen = time.monotonic(), None
    poll = min(0.05, fault_timeout / 10)
    while True:
        codes = [p.exitcode for p in processes]
        if all(c == 0 for c in codes):
            return
        if any(c not in (None, 0) for c in codes):
            time.sleep(0.2)   # let the other ranks record their state
            codes = [p.exitcode for p in processes]
            statuses = [_read_status(p) for p in status_paths]
            raise RankError(_diagnose(statuses, codes, devs, None),
                            fix="see the rank's log above; rerun once the device is back, "
                            "or replan without it (placer replan --without)")
        statuses = [_read_status(p) for p in status_paths]
        now = time.monotonic()
        marks = [(s or {}).get("count") for s in statuses]
        # the clock starts once every rank is past start-up (building the model
        # takes as long as it takes on a busy host; --timeout bounds it)
        if marks != seen or None in marks or not all(_past_start_up(s) for s in statuses):
            seen, last_change = marks, now
        elif now - last_change > fault_timeout:
            _stop(processes)
            raise RankError(_diagnose(statuses, [p.exitcode for p in processes], devs,
                                      now - last_change),
                            fix="check that device and its links; raise --fault-timeout "
                            "if one op legitimately takes longer")
        if now > deadline:
            raise PlanError(f"ranks did not finish within {timeout:.0f} s",
                            fix="raise the timeout or check the plan")
        time.sleep(poll)


# --------------------------------------------------------------------------
# command lines
# --------------------------------------------------------------------------
_EXAMPLES = {
    "placer run": ("placer plan gpt-125m --tiny --cluster local -o plan.json",
                   "placer run plan.json --model gpt-125m --tiny --steps 3 --cluster local",
                   "placer run plan.json --model mymodel:make --input-shape 32,64"),
    "placer launch": ("placer plan gpt-125m --tiny --cluster hetero-lab --method even_pipeline "
                      "-o plan.json",
                      "placer launch plan.json --model gpt-125m --tiny -o measured.json",
                      "placer launch plan.json --model mymodel:make --input-shape 32,64 "
                      "--trace launch.trace.json"),
}


def _parser(prog: str, with_nproc: bool, pictures: bool = False) -> argparse.ArgumentParser:
    from .._cli import add_json, add_model_options, add_seed, command_parser, note_atomic_outputs
    description = ("Run a plan on torch.distributed ranks, one per device, and measure it."
                   if with_nproc else "Run a plan on this machine's devices and measure it.")
    ap = command_parser(prog, description, *_EXAMPLES.get(
        prog, ("torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d "
               "--rdzv-endpoint HOST:29500 -m placer.runtime.dist plan.json --model gpt-125m",)))
    ap.add_argument("plan", help="the placer.plan/v1 file to run")
    ap.add_argument("--model", required=True, metavar="MODEL",
                    help="MODULE:FACTORY (as placer trace) or a zoo model name "
                         "(placer datasets)")
    add_model_options(ap)
    ap.add_argument("--config", default=None,
                    help='keyword arguments of the factory (zoo: config overrides) as JSON, '
                         'e.g. \'{"n_layer": 2}\'')
    ap.add_argument("-c", "--cluster", default=None,
                    help="the cluster the plan was made for: a cluster file or preset name "
                         "(rank order, prediction)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lr", type=float, default=None, help="SGD learning rate (default: no step)")
    ap.add_argument("--inference", action="store_true")
    ap.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                    help="the torch.distributed backend (not the search --backend of "
                         "placer plan/train/bench); default: NCCL when every rank's device "
                         "is a CUDA GPU, else gloo")
    ap.add_argument("--engine", default="builtin", choices=["builtin", "pipelining"],
                    help="pipelining: run a stage-contiguous plan on "
                         "torch.distributed.pipelining")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--calibrate", action="store_true",
                    help="measure op times (and, for ranks, the links between them) before "
                         "the steps and predict from those measurements")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (per rank; default: torch's, or the cores shared "
                         "out over the ranks); 1 is steadiest on a busy host")
    if prog != "placer run":
        ap.add_argument("--pin", default="auto", choices=["auto", "on", "off"],
                        help="give each rank of this host its own cores (auto: when there "
                             "are at least as many usable cores as ranks); ranks sharing "
                             "cores preempt each other at every message")
    ap.set_defaults(_prog=prog)
    if with_nproc:
        ap.add_argument("--fault-timeout", type=float, default=60.0,
                        help="seconds without progress on any rank before the run is "
                             "stopped as hung")
    add_seed(ap, "model's weights and example inputs")
    ap.add_argument("-o", "--output", default=None, help="write the measured report (JSON) here")
    if pictures:
        ap.add_argument("--trace", metavar="JSON",
                        help="write a Chrome/Perfetto trace of a measured step (a row per "
                             "device" + ("; the prediction's, when there is one, as "
                                         "PATH.predicted.json)" if prog == "placer run" else
                                         "; placer simulate --trace draws the prediction's)"))
        ap.add_argument("--gantt", metavar="PNG", help="write a Gantt chart of a measured step")
    add_json(ap)
    if with_nproc:
        ap.add_argument("--nproc", type=int, default=None,
                        help="processes to start (default: the plan's devices)")
    return note_atomic_outputs(ap)


def model_builder(ns) -> Callable[[], tuple]:
    """``--model`` and its options -> a picklable ``build()`` returning
    ``(model, example_inputs)``, the same in every rank (the loader of
    ``placer trace``). A model that cannot be found is a one-line error
    here, before any process starts."""
    from ..cli import check_model, load_model
    config = None
    if ns.config:
        try:
            config = json.loads(ns.config)
        except json.JSONDecodeError as exc:
            raise PlacerError(f"--config is not JSON: {exc}", field="--config",
                              fix='write an object, e.g. \'{"n_layer": 2}\'') from None
        if not isinstance(config, dict):
            raise PlacerError("--config must be a JSON object", field="--config",
                              fix='write an object, e.g. \'{"n_layer": 2}\'')
    check_model(ns.model, ns.input_shape, ns.input_dtype)
    return functools.partial(load_model, ns.model, ns.input_shape, ns.input_dtype, ns.batch,
                             ns.seq, ns.tiny, ns.seed, config)


def _cluster(arg):
    from ..cli import load_cluster
    return None if arg is None else load_cluster(arg)


def _common(ns) -> tuple:
    from ..plan import Plan
    plan = Plan.load(ns.plan)
    build = model_builder(ns)
    kwargs = {"steps": ns.steps, "warmup": ns.warmup, "training": not ns.inference}
    if ns.engine != "builtin":
        kwargs["engine"] = ns.engine
    if ns.lr is not None:
        kwargs["optimizer"] = functools.partial(torch.optim.SGD, lr=ns.lr)
    if ns.threads and ns._prog == "placer launch":
        kwargs["threads"] = ns.threads
    elif ns.threads:
        torch.set_num_threads(ns.threads)
    cluster = _cluster(ns.cluster)
    ns._calibrated = ns.calibrate or (cluster is not None and any(
        "op_overhead" in d.extra for d in cluster.devices))
    if ns.calibrate and ns._prog == "placer run":
        kwargs, cluster = _calibrate_here(plan, build, kwargs, cluster)
    elif ns.calibrate:
        kwargs["calibrate"] = True
    return plan, build, kwargs, cluster


def _calibrate_here(plan, build, kwargs: dict, cluster):
    """``placer run --calibrate``: profile the plan's graph on this machine's
    devices; the run then predicts from the measured op times."""
    from ..cluster import Cluster
    from .profile import calibrated_graph, profile
    from .run import resolve_graph
    model, inputs = build()
    graph, _ = resolve_graph(model, inputs, plan)
    timed, cal = profile(model, inputs, graph=graph, cluster=cluster or Cluster.local(),
                         repeats=7, warmup=3)
    name = next(d.name for d in cal.devices if "op_overhead" in d.extra)
    ovh = cal.device(name).extra["op_overhead"]
    task = cal.device(name).extra.get("task_overhead", 0.0)
    return {**kwargs, "graph": calibrated_graph(timed, cal, name, overhead=ovh),
            "problem_options": {"op_overhead": ovh, "task_overhead": task}}, cal


#: slowest over fastest measured step from which a run is called unsteady
UNSTEADY = 2.0


def _print(result: dict, ns) -> None:
    """Print the measured report (text, or JSON with ``--json``); write it to ``-o``."""
    from .._io import atomic_write_text, dump_json
    rep = result["report"]
    path = ns.output
    if ns.json:
        print(dump_json({**rep, "loss": result.get("loss")}).rstrip())
        if path:
            atomic_write_text(path, dump_json({**rep, "calibration": result.get("calibration")}))
        return
    from ..cost.report import _time, gap, spread
    pred = rep.get("predicted")
    times = rep.get("step_times") or []
    line = f"step {_time(rep['step_time'])} measured"
    if len(times) > 1:
        line += f" (median; {spread(times)})"
    if pred:
        said = f"{_time(pred)} predicted"
        how = gap(rep["step_time"], pred, than=f"the {said}")
        line += f", {said} ({how})" if how.endswith("%") else f", {how}"
    if result.get("loss") is not None:
        line += f", loss {result['loss']:.6g}"
    print(line)
    if len(times) > 1 and min(times) > 0 and max(times) / min(times) >= UNSTEADY:
        print(f"note: the slowest step took {max(times) / min(times):.3g}x as long as the "
              "fastest: other work on this host, or caches and allocators still warming "
              "up; the median is the figure to compare (more --warmup and --steps, "
              "--threads 1 or fewer ranks per core steady it)")
    cal = result.get("calibration") or {}
    if pred and cal.get("predicted_model"):
        print(calibration_line(cal))
    if pred and not getattr(ns, "_calibrated", True):
        print("note: the prediction is uncalibrated (nominal FLOP rates); add --calibrate, or "
              "measure once with `placer profile --model ... -o g.json --cluster-out c.yaml` "
              "and pass --cluster c.yaml")
    if path:
        atomic_write_text(path, dump_json({**rep, "calibration": result.get("calibration")}))


def calibration_line(calibration: dict) -> str:
    """One line on how a calibrated prediction was made: the simulator's
    step, the reference pipeline's factor, and how much slower the host ran
    around the steps than around the op timings (``speed_drift``, not
    applied)."""
    line = (f"calibrated: simulator {calibration['predicted_model'] * 1e3:.2f} ms"
            f" x reference factor {calibration.get('reference_factor', 1.0):.2f}")
    drift = calibration.get("speed_drift")
    if drift is not None:
        line += (f"; the model's work took {drift:.2f}x as long around the steps as in the "
                 "calibration rounds (speed_drift, not applied)")
    return line


def _pin_arg(value: str) -> bool | None:
    return {"auto": None, "on": True, "off": False}[value]


def measured_report(result: dict):
    """The :class:`MeasuredReport` of a :func:`launch` result (rank 0's
    figures and every rank's timeline of a typical step)."""
    from ..cost.report import Event, _Frozen
    from .run import MeasuredReport
    rep = result["report"]
    fields = {k: rep[k] for k in ("step_time", "feasible", "peak_memory", "busy", "compute",
                                  "comm", "idle", "microbatches", "schedule") if k in rep}
    events = [Event(*e) for e in result.get("events") or []]
    return MeasuredReport(**fields, model="measured", predicted=rep.get("predicted"),
                          step_times=list(rep.get("step_times") or []),
                          timeline=_Frozen(events))


def write_pictures(report, ns) -> None:
    """``--trace``/``--gantt`` of ``placer run`` and ``placer launch``: the
    measured step's timeline (and the prediction's trace beside it when the
    report carries the whole prediction)."""
    from ..cli import _outputs_next_to
    if ns.trace:
        report.to_chrome_trace(ns.trace)
        if report.prediction is not None:
            report.prediction.to_chrome_trace(_outputs_next_to(ns.trace) + ".predicted.json")
    if ns.gantt:
        report.plot_gantt(ns.gantt, title=f"measured step: {report.step_time * 1e3:.3g} ms"
                          + (f" (predicted {report.predicted * 1e3:.3g} ms)"
                             if report.predicted else ""))


def launch_main(argv: list[str] | None = None) -> int:
    """``placer launch PLAN --model MODEL [--nproc N] ...``: local ranks."""
    from .._cli import slow_stage
    from .._io import check_outputs
    ns = _parser("placer launch", True, pictures=True).parse_args(argv)
    check_outputs([(flag, getattr(ns, key, None)) for flag, key in
                   (("--output", "output"), ("--trace", "trace"), ("--gantt", "gantt"))],
                  [getattr(ns, k, None) for k in ("plan", "cluster", "model")])
    plan, build, kwargs, cluster = _common(ns)
    if ":" in ns.model:
        # a user's factory is built once here, so that its mistakes (no
        # --input-shape, a factory that raises) are one line, not a rank's death
        with slow_stage("placer launch", f"building {ns.model} to check it"):
            build()
    with slow_stage("placer launch", f"{len(rank_devices(plan, cluster))} ranks building "
                    f"{ns.model} and running {ns.warmup} warm-up and {ns.steps} measured steps"):
        result = launch(plan, build, nproc=ns.nproc, backend=ns.backend, timeout=ns.timeout,
                        cluster=cluster, fault_timeout=ns.fault_timeout, pin=_pin_arg(ns.pin),
                        **kwargs)
    write_pictures(measured_report(result), ns)
    _print(result, ns)
    return 0


def rank_main(argv: list[str] | None = None) -> int:
    """One rank under torchrun (reads RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    A rank that fails, or that makes no progress for ``--fault-timeout``
    seconds once its steps have begun, exits with status 1 and one line
    naming its rank, device and stage (a waiting rank: whom it waits for);
    torchrun then stops the other ranks."""
    global _STATUS
    ap = _parser("python -m placer.runtime.dist", False)
    ap.add_argument("--fault-timeout", type=float, default=60.0,
                    help="seconds without progress, once the steps have begun, before this "
                         "rank stops as hung (start-up is bounded by --timeout)")
    ns = ap.parse_args(argv)
    # torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE: this host's ranks
    local = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if _auto_pin(_pin_arg(ns.pin), local_world):
        cores = pin_cores(local, local_world)
        if cores and not ns.threads:
            torch.set_num_threads(len(cores))
    plan, build, kwargs, cluster = _common(ns)
    _init(ns.backend or launch_backend(plan, cluster, kwargs.get("device")), ns.timeout)
    rank = dist.get_rank()
    devs = rank_devices(plan, cluster)
    where = f"rank {rank}" + (f" (device {devs[rank]})" if rank < len(devs) else "")
    _STATUS = _Status(None, rank)
    stop = _watch_self(where, ns.fault_timeout)
    try:
        _STATUS.set("building the model")
        model, inputs = build()
        result = run_rank(model, plan, inputs, cluster=cluster, **kwargs)
        if result is not None:
            _print(result, ns)
    except (PlacerError, RuntimeError) as exc:   # gloo reports lost peers as RuntimeError
        text = str(exc).strip().splitlines()
        print(f"placer.runtime.dist: error: {where} in stage {_STATUS.stage!r} failed: "
              f"{type(exc).__name__}: {text[-1] if text else ''}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop.set()
        dist.destroy_process_group()
    return 0


def _watch_self(where: str, fault_timeout: float) -> threading.Event:
    """Under torchrun, where no launcher watches the ranks: a thread that
    ends this process with one line when its stage has not changed for
    ``fault_timeout`` seconds once start-up is over (calibration excepted).
    Start-up ends after the first step barrier, where ranks that built the
    model at different speeds meet. Set the returned event to stop it."""
    stop = threading.Event()
    start_up = _START_UP

    def watch():
        count, since, started = _STATUS.count, time.monotonic(), False
        while not stop.wait(min(1.0, fault_timeout / 10)):
            started = started or (_STATUS.stage.startswith("step ")
                                  and _STATUS.stage not in start_up)
            if _STATUS.count != count or not started or "calibrat" in _STATUS.stage:
                count, since = _STATUS.count, time.monotonic()
            elif time.monotonic() - since > fault_timeout:
                print(f"placer.runtime.dist: error: {where} in stage {_STATUS.stage!r} made no "
                      f"progress for {fault_timeout:g} s (fix: check that device and its links; "
                      f"raise --fault-timeout if one op takes longer)",
                      file=sys.stderr, flush=True)
                os._exit(1)
    threading.Thread(target=watch, name="placer-fault-watch", daemon=True).start()
    return stop


if __name__ == "__main__":
    raise SystemExit(rank_main())

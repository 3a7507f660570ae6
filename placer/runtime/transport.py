"""Messages between ranks (:class:`DistTransport`: point-to-point sends and
receives matched by the order both ends post them, all-reduces on one
group per set of holders) and the barrier that starts every step
(:func:`start_step`)."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from ..errors import PlanError
from .status import STATUS
from .waiting import Watcher, handover, wait_work

_DEBUG = bool(os.environ.get("PLACER_DEBUG_COMM"))


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
        with STATUS.wait(self.rank_of[src]):
            handle.wait()
        self.comm_time[self.me] += time.perf_counter() - start
        if _DEBUG:
            print(f"[{self.me}] recv tag {tag} from {src} {tuple(shape)} "
                  f"{(time.perf_counter() - start) * 1e3:.2f} ms at {time.perf_counter():.6f}",
                  flush=True)
        return buf.to(self.device) if self.stage else buf

    def finish(self) -> None:
        with STATUS.wait(None, "sends to complete"):
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

    def close(self) -> None:
        """Stop the receive watchers' threads. Why: one process often runs
        many plans (the fidelity bench, the contract tests, a service), and
        each left its watcher threads (one per receive in flight) behind:
        on gnmt over two gloo ranks, 150 threads a plan, 8,061 after 54
        plans, and the same plans' steps 1.3-2x slower in the third round
        than in the first (6 threads throughout with them stopped). The
        all-reduce groups stay: a first try that destroyed them, without
        joining the threads, aborted at exit ("terminate called without an
        active exception"); not destroying them alone did too, joining
        fixed it, and destroying them with the join was not tried."""
        self.watcher.close()

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
        with STATUS.wait(None, f"all-reduce over {', '.join(holders)}"):
            wait_work(dist.all_reduce(data, op=dist.ReduceOp.SUM, group=self.groups[holders],
                                      async_op=True), self.spin)
        if self.stage:
            flat.copy_(data)
        self.comm_time[self.me] += time.perf_counter() - start


#: seconds a busy-polling rank sleeps after the step barrier so that its
#: transport threads (idle priority) handle the receive notices of the
#: step's messages before it starts (see Engine.post_receives)
NOTICE_WAIT = 0.0003


def start_step(engine, spin: bool) -> tuple[float, float]:
    """Collective: post the step's receives, pass the step barrier and
    return the step's start (wall clock, process CPU time), set back by
    what posting took: that counts in the step, the barrier's wait does
    not."""
    cpu_post = time.process_time()
    posted = engine.post_receives()
    cpu_post = time.process_time() - cpu_post
    with STATUS.wait(None, "the step barrier"):
        wait_work(dist.barrier(async_op=True), spin)
    if spin and posted:
        # the socket threads handle the peers' receive notices (see
        # Engine.post_receives) while this rank sleeps, not in the step
        time.sleep(NOTICE_WAIT)
    return time.perf_counter() - posted, time.process_time() - cpu_post


def gather_to_first(mine: Any) -> "list | None":
    """Every rank's ``mine``, gathered on rank 0 (a list by rank); None on
    the other ranks. The wait is reported as the results gather."""
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    STATUS.set("gather results")
    with STATUS.wait(None, "the results gather"):
        dist.gather_object(mine, gathered, dst=0)
    return gathered

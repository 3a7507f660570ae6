"""The pipeline engine: routes, schedules, and the execution of one step.

Each piece runs as one *instance* per device of its group when it is sharded
(replica ``r`` gets the ``r``-th of ``k`` near-equal row ranges of the
microbatch), else as one instance on the group's first device. A *sink* on
the device of the last output computes the loss.

A value crossing pieces travels as *messages*: for each consumer instance,
one message per producer instance whose rows overlap the rows it needs (the
whole value from replica 0 when the value is not batched). On the receiving
device the parts are joined into one leaf tensor, shared by every local
consumer that needs the same rows. In backward the leaf's gradient is cut
back into the same parts and returned, so every producer receives exactly
the gradient of what it sent.

The loss of a microbatch is computed once, on its whole rows, and weighted
by its share of the batch (``loss_reduction="mean"``) or by 1 (``"sum"``).
The gradient of a parameter is then the *sum* over the devices that hold a
copy of it (replicas, or pieces that share a weight): the engine all-reduces
with SUM, not the mean DDP uses, because DDP's replicas each take the mean
over their own shard while here nothing is averaged twice.

Every process runs its tasks in the order :mod:`placer.schedule` fixes from
the plan alone (one process hosting every device runs the schedule's global
order; a rank its device's order). A task's sends leave at its end in tag
order, so every rank computes the same tables and the same sequence of
messages with each peer, and messages match without negotiation, by their
order (see :class:`placer.runtime.transport.DistTransport`).
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..cost.report import Event
from ..errors import PlanError
# Inst and interleave are the schedule's; importable from here as before
from ..schedule import Inst, Schedule, interleave  # noqa: F401
from ..schedule import build as build_schedule
from .split import Split


@dataclass
class Msg:
    key: tuple                       # (value key, src Inst, dst device, rows)
    value: tuple
    src: Inst
    dst: str
    rows: tuple | None               # absolute rows within the microbatch, None: whole
    grad: bool
    slots: list = field(default_factory=list)
    tag: int = 0


@dataclass
class Slot:
    key: tuple                       # (value key, device, rows)
    value: tuple
    device: str
    rows: tuple | None
    parts: list = field(default_factory=list)      # Msg keys, in row order
    consumers: list = field(default_factory=list)  # Inst


class Routes:
    """Static tables for one microbatch layout, identical on every rank."""

    def __init__(self, split: Split, mb_rows: list[int], sink_device: str):
        self.split = split
        self.mb_rows = mb_rows
        self.sink = Inst(len(split.pieces), 0)
        self.sink_device = sink_device
        self.instances: dict[int, list[Inst]] = {}
        self.device_of: dict[Inst, str] = {self.sink: sink_device}
        for p in split.pieces:
            if p.sharded and min(mb_rows) < len(p.group):
                p.sharded = False
                split.notes.append(f"piece {p.index} on {list(p.group)}: a microbatch of "
                                   f"{min(mb_rows)} rows cannot be split {len(p.group)} ways; "
                                   f"it runs unsharded on {p.group[0]}")
        for p in split.pieces:
            devices = p.group if p.sharded else p.group[:1]
            self.instances[p.index] = [Inst(p.index, r) for r in range(len(devices))]
            for r, d in enumerate(devices):
                self.device_of[Inst(p.index, r)] = d
        # per microbatch tables
        self.msgs: list[dict[tuple, Msg]] = []
        self.slots: list[dict[tuple, Slot]] = []
        self.input_slot: list[dict[tuple, tuple]] = []   # (Inst, input index) -> slot key
        self.outgoing: list[dict[Inst, list[tuple]]] = []
        self.inst_rows: list[dict[Inst, tuple]] = []
        tag = 0
        for m, n in enumerate(mb_rows):
            rows = {}
            for p in split.pieces:
                insts = self.instances[p.index]
                if p.sharded:
                    if n < len(insts):
                        raise PlanError(f"a microbatch of {n} rows cannot be split over "
                                        f"{len(insts)} replicas of piece {p.index}",
                                        field="microbatches",
                                        fix="use fewer microbatches or a larger batch")
                    bounds = row_bounds(n, len(insts))
                    for i, inst in enumerate(insts):
                        rows[inst] = bounds[i]
                else:
                    rows[insts[0]] = (0, n)
            rows[self.sink] = (0, n)
            msgs: dict[tuple, Msg] = {}
            slots: dict[tuple, Slot] = {}
            input_slot: dict[tuple, tuple] = {}
            consumers = [(inst, split.pieces[inst.piece].inputs,
                          split.pieces[inst.piece].shape_only)
                         for p in split.pieces for inst in self.instances[p.index]]
            consumers.append((self.sink, split.output_sources, [False] * len(split.output_sources)))
            for inst, sources, shape_only in consumers:
                dev = self.device_of[inst]
                for j, src in enumerate(sources):
                    if src.kind != "piece" or shape_only[j]:
                        continue
                    info = split.values[src.key]
                    want = rows[inst] if info.batched else None
                    skey = (src.key, dev, want)
                    input_slot[(inst, j)] = skey
                    if skey in slots:
                        if inst not in slots[skey].consumers:
                            slots[skey].consumers.append(inst)
                        continue
                    slot = Slot(skey, src.key, dev, want, consumers=[inst])
                    slots[skey] = slot
                    producers = self.instances[src.index]
                    parts = []
                    if info.batched:
                        for pinst in producers:
                            lo = max(want[0], rows[pinst][0])
                            hi = min(want[1], rows[pinst][1])
                            if lo < hi:
                                parts.append((pinst, (lo, hi)))
                    else:
                        parts.append((producers[0], None))
                    for pinst, prow in parts:
                        mkey = (src.key, pinst, dev, prow)
                        if mkey not in msgs:
                            grad = bool(info.requires_grad and info.dtype is not None
                                        and info.dtype.is_floating_point)
                            msgs[mkey] = Msg(mkey, src.key, pinst, dev, prow, grad, tag=tag)
                            tag += 2
                        msgs[mkey].slots.append(skey)
                        slot.parts.append(mkey)
            outgoing: dict[Inst, list[tuple]] = defaultdict(list)
            for mkey, msg in msgs.items():
                outgoing[msg.src].append(mkey)
            self.msgs.append(msgs)
            self.slots.append(slots)
            self.input_slot.append(input_slot)
            self.outgoing.append(dict(outgoing))
            self.inst_rows.append(rows)

    def all_instances(self) -> list[Inst]:
        out = [i for p in self.split.pieces for i in self.instances[p.index]]
        return out + [self.sink]

    def devices(self) -> list[str]:
        seen = []
        for inst in self.all_instances():
            d = self.device_of[inst]
            if d not in seen:
                seen.append(d)
        return seen


def row_bounds(n: int, k: int) -> list[tuple]:
    """``n`` rows cut into ``k`` runs as equal as can be (the first ones one
    longer): ``[(start, end)]``."""
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    out, start = [], 0
    for s in sizes:
        out.append((start, start + s))
        start += s
    return out


def _buckets(flats: dict, bucket_bytes: float | None) -> list[dict]:
    """``flats`` (device -> flat tensor) cut into views of about
    ``bucket_bytes`` each (all of it in one when None)."""
    first = next(iter(flats.values()))
    n = first.numel()
    if not bucket_bytes or n == 0:
        return [flats]
    step = max(1, int(bucket_bytes // first.element_size()))
    return [{d: t[a:a + step] for d, t in flats.items()} for a in range(0, n, step)]


def microbatch_rows(batch: int, microbatches: int) -> list[int]:
    """Rows of each microbatch: near-equal, larger ones first (like tensor_split)."""
    if microbatches > batch:
        raise PlanError(f"{microbatches} microbatches for a batch of {batch}",
                        field="microbatches", fix=f"use at most {batch} microbatches")
    return [b - a for a, b in row_bounds(batch, microbatches)]


# --------------------------------------------------------------------------
# schedules
# --------------------------------------------------------------------------
def device_orders(routes: Routes, schedule: str, training: bool) -> tuple[dict, str]:
    """Per device, its tasks ("F"|"B", microbatch, Inst) in the order it runs
    them, and the schedule used (:func:`placer.schedule.build`)."""
    sched = build_schedule(routes, schedule, training)
    return sched.orders, sched.name




# --------------------------------------------------------------------------
# transports
# --------------------------------------------------------------------------
class LocalTransport:
    """All devices in this process: a mailbox, copies between devices (on a
    side stream per destination GPU, so copies overlap compute)."""

    def __init__(self, torch_devices: dict[str, torch.device]):
        self.tdev = torch_devices
        self.box: dict = {}
        self.streams: dict = {}
        self.comm_time = defaultdict(float)

    def hosts(self, device: str) -> bool:
        return True

    def _stream(self, dev: torch.device):
        if dev not in self.streams:
            self.streams[dev] = torch.cuda.Stream(device=dev)
        return self.streams[dev]

    def send(self, tensor: torch.Tensor, src: str, dst: str, tag: int) -> None:
        start = time.perf_counter()
        target = self.tdev[dst]
        event = None
        if tensor.device == target:
            out = tensor.detach()
        elif target.type == "cuda" or tensor.device.type == "cuda":
            side = target if target.type == "cuda" else tensor.device
            stream = self._stream(side)
            if tensor.device.type == "cuda":
                stream.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(stream):
                out = tensor.detach().to(target, non_blocking=True)
                if tensor.device.type == "cuda":
                    tensor.record_stream(stream)
                event = torch.cuda.Event()
                event.record(stream)
            if target.type == "cpu":
                event.synchronize()
                event = None
        else:
            out = tensor.detach().to(target)
        self.box[tag] = (out, event)
        self.comm_time[src] += time.perf_counter() - start

    def recv(self, shape, dtype, src: str, dst: str, tag: int) -> torch.Tensor:
        out, event = self.box.pop(tag)
        if event is not None:
            torch.cuda.current_stream(self.tdev[dst]).wait_event(event)
            out.record_stream(torch.cuda.current_stream(self.tdev[dst]))
        return out

    def finish(self) -> None:
        self.box.clear()

    def allreduce(self, tensors: dict[str, torch.Tensor], holders: tuple) -> None:
        """Sum ``tensors`` (device -> flat tensor) in place on every holder."""
        start = time.perf_counter()
        devs = list(tensors)
        total = tensors[devs[0]].clone()
        for d in devs[1:]:
            total += tensors[d].to(total.device)
        for d in devs:
            tensors[d].copy_(total.to(tensors[d].device))
        spent = time.perf_counter() - start
        for d in devs:
            self.comm_time[d] += spent


# --------------------------------------------------------------------------
# the executor
# --------------------------------------------------------------------------
@dataclass
class StepStats:
    compute: dict = field(default_factory=lambda: defaultdict(float))
    act_bytes: dict = field(default_factory=lambda: defaultdict(float))
    peak_act: dict = field(default_factory=lambda: defaultdict(float))


class Engine:
    """Runs steps of a split model on the devices this process hosts.

    ``transport`` moves messages; ``local`` lists the plan devices hosted
    here (all of them in one process, one per rank otherwise). Weights left
    on the meta device in ``model`` are built here, only for the local
    pieces, as :func:`placer.zoo.materialize` with ``seed`` would build them."""

    def __init__(self, split: Split, routes: Routes, torch_devices: dict[str, torch.device],
                 local: list[str], transport, *, training: bool, loss_fn: Callable | None,
                 loss_weights: list[float], order: list, model: torch.nn.Module | None = None,
                 seed: int = 0, schedule: "Schedule | str | None" = None):
        self.split = split
        self.routes = routes
        self.tdev = torch_devices
        self.local = list(local)
        self.transport = transport
        self.training = training
        self.loss_fn = loss_fn
        self.loss_weights = loss_weights
        self.order = order                 # [(device, task)] for the local devices
        #: the :class:`placer.schedule.Schedule` the order comes from (its
        #: per-pair message sequences go to a transport with ``begin``), or
        #: its name
        self.schedule = schedule
        #: the (device, task) pairs the last step ran, in order
        self.executed: list = []
        self.model = model
        self.seed = seed
        #: the plan's all-reduce bucket size (bytes): each group's flat
        #: gradient goes in pieces of about this size; None: in one piece
        self.bucket_bytes: float | None = None
        #: count the bytes autograd saves (CPU peak memory); costs a Python
        #: call per saved tensor, so it is off when every device is CUDA and
        #: done in the first step only (every step saves the same tensors)
        self.count_saved = any(torch_devices[d].type != "cuda" for d in local)
        self._peak_act: dict | None = None
        #: the last step's timeline (placer.cost.Event, seconds from its start):
        #: one bar per task on its device, and the all-reduce
        self.events: list = []
        self.modules: dict[Inst, torch.nn.Module] = {}
        self.copies: dict[str, dict[str, torch.Tensor]] = {}   # device -> name -> tensor
        self._owners: dict[str, dict] = {}     # device -> owner name -> materialised copy
        self._build()
        self._owners.clear()
        self.holders = self._holders()
        self._posted: float | None = None   # seconds post_receives took, until the step

    # --- building -------------------------------------------------------
    def _build(self) -> None:
        names = self.split.param_names
        for inst in self.routes.all_instances():
            dev = self.routes.device_of[inst]
            if dev not in self.local or inst == self.routes.sink:
                continue
            piece = self.split.pieces[inst.piece]
            target = self.tdev[dev]
            table = self.copies.setdefault(dev, {})
            owners = self._owners.setdefault(dev, {})
            memo = {}
            for t in list(piece.module.parameters()) + list(piece.module.buffers()):
                name = names.get(id(t), f"#{id(t)}")
                if name not in table:
                    if t.is_meta:
                        data = self._materialize(name, target, owners)
                    else:
                        data = t.detach().to(target, copy=True)
                    table[name] = (torch.nn.Parameter(data, requires_grad=t.requires_grad)
                                   if isinstance(t, torch.nn.Parameter) else data)
                memo[id(t)] = table[name]
            module = copy.deepcopy(piece.module, memo)
            _no_inplace(module)
            self.modules[inst] = module

    def _materialize(self, name: str, target: torch.device, owners: dict) -> torch.Tensor:
        """A meta weight built on ``target`` (its owning module's copies
        shared through ``owners``)."""
        from ..zoo import materialize_tensor
        if self.model is None or name.startswith("#"):
            raise PlanError(f"parameter {name!r} is on the meta device",
                            fix="materialise the model's weights before running it "
                            "(e.g. placer.zoo.materialize)")
        # the owner's copy is dropped after building, so its storage is ours
        return materialize_tensor(self.model, name, target, self.seed,
                                  cache=owners).detach()

    def _holders(self) -> dict[str, tuple]:
        """Parameter name -> the devices holding a copy (every rank agrees)."""
        names = self.split.param_names
        holders: dict[str, list] = {}
        for inst in self.routes.all_instances():
            if inst == self.routes.sink:
                continue
            piece = self.split.pieces[inst.piece]
            dev = self.routes.device_of[inst]
            for t in piece.module.parameters():
                name = names.get(id(t), f"#{id(t)}")
                lst = holders.setdefault(name, [])
                if dev not in lst:
                    lst.append(dev)
        return {k: tuple(v) for k, v in holders.items()}

    def parameters(self) -> list[torch.Tensor]:
        """The distinct local parameter copies (for the optimizer)."""
        out = []
        for table in self.copies.values():
            out.extend(t for t in table.values() if isinstance(t, torch.nn.Parameter))
        return out

    # --- one step -------------------------------------------------------
    def incoming(self) -> list[tuple]:
        """Every message this process receives in one step, as
        ``(tag, shape, dtype, src device, dst device)``: activations sent to a
        local device and gradients returned to one, from devices hosted
        elsewhere. The same for every step, so a transport can post its
        receives before the step starts."""
        if hasattr(self, "_incoming"):
            return self._incoming
        out = []
        for m, msgs in enumerate(self.routes.msgs):
            for msg in msgs.values():
                info = self.split.values[msg.value]
                src = self.routes.device_of[msg.src]
                shape = self._msg_shape(msg, m, info)
                if msg.dst in self.local and not self.transport.hosts(src):
                    out.append((msg.tag, shape, info.dtype, src, msg.dst))
                if self.training and msg.grad and src in self.local \
                        and not self.transport.hosts(msg.dst):
                    out.append((msg.tag + 1, shape, info.dtype, msg.dst, src))
        self._incoming = sorted(out, key=lambda x: x[0])
        return self._incoming

    def sequence(self) -> dict:
        """Peer device -> ``[(tag, is_send, shape, dtype)]``: the step's
        messages between the (one) local device and each device hosted
        elsewhere, in the order both post them (see
        :attr:`placer.schedule.Schedule.pairs`)."""
        if hasattr(self, "_sequence"):
            return self._sequence
        out: dict = {}
        if isinstance(self.schedule, Schedule) and len(self.local) == 1:
            for peer, msgs in self.schedule.peer_sequence(self.local[0]).items():
                rows = []
                for x, is_send in msgs:
                    msg = self._by_tag[x.tag - (x.tag % 2)]
                    info = self.split.values[msg.value]
                    rows.append((x.tag, is_send, self._msg_shape(msg, x.microbatch, info),
                                 info.dtype))
                out[peer] = rows
        self._sequence = out
        return out

    @property
    def _by_tag(self) -> dict:
        if not hasattr(self, "_tag_table"):
            self._tag_table = {msg.tag: msg for msgs in self.routes.msgs
                               for msg in msgs.values()}
        return self._tag_table

    def _begin(self) -> None:
        """Tell a transport with ``begin`` the step's message sequences."""
        begin = getattr(self.transport, "begin", None)
        if begin is not None:
            begin(self.sequence())

    def _flush(self, st) -> None:
        """A task's sends leave at its end in tag order (the order
        :mod:`placer.schedule` gives every pair)."""
        if st.outbox:
            for tag, tensor, src, dst in sorted(st.outbox, key=lambda x: x[0]):
                self.transport.send(tensor, src, dst, tag)
            st.outbox.clear()

    def post_receives(self) -> float:
        """Post the next step's receives now (a transport with ``post``);
        returns the seconds it took, which the caller counts in the step's
        time. Why before the step: gloo sends a message at once only if
        the sender's socket thread has already handled the receiver's
        notice that the receive is posted; that thread runs at idle
        priority on a busy-polling rank (see
        :func:`placer.runtime.waiting.demote_threads`), so notices that
        arrive while the sender computes wait for its next wait, and so do
        its sends. Posted before the step's barrier, the notices are handled
        while the ranks wait there (measured on a 2-rank plan, receiver
        already waiting: send-to-arrival mean 0.50-0.53 ms, 90th
        percentile 1.3-1.7 ms, posted at the step's start; 0.16-0.29 and
        0.27-0.79 ms posted before the barrier)."""
        post = getattr(self.transport, "post", None)
        if post is None:
            return 0.0
        start = time.perf_counter()
        self._begin()
        post(self.incoming())
        self._posted = time.perf_counter() - start
        return self._posted

    def step(self, inputs: list, targets: Any, batch_offsets: list[int]) -> dict:
        """Forward (and backward) every microbatch; returns the sink's outputs
        per microbatch and the weighted loss (on the sink's process)."""
        st = _StepState()
        stats = StepStats()
        self._t0 = t0 = time.perf_counter()
        events = self.events = []
        post = getattr(self.transport, "post", None)
        if self._posted is not None:
            # posted before the step (see post_receives): shown before its start
            events += [Event(d, "post receives", "messaging", -self._posted, self._posted)
                       for d in self.local]
            self._posted = None
        elif post is not None:
            self._begin()
            post(self.incoming())
            # posting every receive of the step is part of the step's time
            events += [Event(d, "post receives", "messaging", 0.0, time.perf_counter() - t0)
                       for d in self.local]
        self._inputs = inputs
        self._targets = targets
        self._offsets = batch_offsets
        count = self.count_saved and self._peak_act is None
        self.executed = executed = []
        for dev, task in self._tasks():
            executed.append((dev, task))
            kind, m, inst = task
            start = time.perf_counter()
            comm_before = sum(self.transport.comm_time.values())
            before = stats.act_bytes[dev]
            with (_SavedBytes(stats, dev) if count else _NoCount()):
                if kind == "F":
                    if inst == self.routes.sink:
                        self._sink(m, st)
                    else:
                        self._forward(m, inst, st)
                else:
                    self._backward(m, inst, st, stats, dev)
                self._flush(st)
            if kind == "F" and inst != self.routes.sink:
                st.saved[(m, inst)] = stats.act_bytes[dev] - before
            else:
                # the sink frees its graph at once; a backward frees its forward's
                stats.act_bytes[dev] = before - st.saved.pop((m, inst), 0.0)
            # time spent sending or waiting for messages is not compute
            waited = sum(self.transport.comm_time.values()) - comm_before
            end = time.perf_counter()
            stats.compute[dev] += end - start - waited
            events.append(_task_event(dev, kind, m, inst, self.routes.sink, start - t0,
                                      end - start, waited))
        start = time.perf_counter()
        self.transport.finish()
        if post is not None:
            events += [Event(d, "sends complete", "messaging", start - t0,
                             time.perf_counter() - start) for d in self.local]
        if count:
            self._peak_act = dict(stats.peak_act)
        elif self._peak_act is not None:
            stats.peak_act.update(self._peak_act)
        return {"outputs": st.outputs, "loss": st.loss, "stats": stats}

    def _tasks(self):
        """This process's tasks: exactly the schedule's order (see
        :mod:`placer.schedule`), whatever arrives first, so that every pair
        of processes posts its messages in the same sequence."""
        yield from self.order

    def _input_value(self, m: int, j: int, dev: str, rows: tuple | None, shape_only: bool):
        split = self.split
        info = split.values[("input", j, 0)]
        x = self._inputs[j]
        n = self.routes.mb_rows[m]
        lo, hi = rows if rows is not None else (0, n)
        if not info.is_tensor:
            return x
        if shape_only:
            return torch.empty(info.shape(hi - lo), dtype=info.dtype, device="meta")
        if info.batched:
            off = self._offsets[m]
            x = x[off + lo: off + hi]
        return x.to(self.tdev[dev])

    def _gather(self, m: int, inst: Inst, sources: list, shape_only: list, st) -> list:
        dev = self.routes.device_of[inst]
        rows = self.routes.inst_rows[m][inst]
        args = []
        for j, src in enumerate(sources):
            if src.kind == "const":
                args.append(src.value)
            elif src.kind == "input":
                info = self.split.values[src.key]
                sharded = inst != self.routes.sink and self.split.pieces[inst.piece].sharded
                args.append(self._input_value(m, src.index, dev,
                                              rows if (sharded and info.batched) else None,
                                              shape_only[j]))
            elif shape_only[j]:
                info = self.split.values[src.key]
                sharded = self.split.pieces[inst.piece].sharded
                lo, hi = rows if (sharded and info.batched) else (0, self.routes.mb_rows[m])
                args.append(torch.empty(info.shape(hi - lo), dtype=info.dtype, device="meta"))
            else:
                skey = self.routes.input_slot[m][(inst, j)]
                args.append(self._slot(m, skey, st))
        return args

    def _slot(self, m: int, skey: tuple, st) -> torch.Tensor:
        if (m, skey) in st.leaves:
            return st.leaves[(m, skey)]
        slot = self.routes.slots[m][skey]
        info = self.split.values[slot.value]
        parts = []
        for mkey in slot.parts:
            msg = self.routes.msgs[m][mkey]
            if (m, mkey) not in st.received:
                shape = self._msg_shape(msg, m, info)
                st.received[(m, mkey)] = self.transport.recv(
                    shape, info.dtype, self.routes.device_of[msg.src], slot.device, msg.tag)
            parts.append(st.received[(m, mkey)])
        value = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
        value = value.detach()
        if self.training and info.requires_grad and value.is_floating_point():
            value.requires_grad_(True)
        st.leaves[(m, skey)] = value
        return value

    def _msg_shape(self, msg: Msg, m: int, info) -> tuple:
        if msg.rows is None:
            return info.shape(self.routes.mb_rows[m])
        return info.shape(msg.rows[1] - msg.rows[0])

    def _forward(self, m: int, inst: Inst, st) -> None:
        piece = self.split.pieces[inst.piece]
        args = self._gather(m, inst, piece.inputs, piece.shape_only, st)
        module = self.modules[inst]
        with torch.set_grad_enabled(self.training):
            out = module(*args)
        outs = tuple(out) if piece.multi else (out,)
        if self.training:
            st.outputs_of[(m, inst)] = outs
        self._send_outputs(m, inst, outs, st)

    def _send_outputs(self, m: int, inst: Inst, outs: tuple, st) -> None:
        src_dev = self.routes.device_of[inst]
        start_row = self.routes.inst_rows[m][inst][0]
        for mkey in self.routes.outgoing[m].get(inst, []):
            msg = self.routes.msgs[m][mkey]
            value = outs[msg.value[2]]
            info = self.split.values[msg.value]
            if msg.rows is not None:
                f = info.factor
                value = value[(msg.rows[0] - start_row) * f:(msg.rows[1] - start_row) * f]
            st.outbox.append((msg.tag, value.detach().contiguous(), src_dev, msg.dst))

    def _sink(self, m: int, st) -> None:
        sink = self.routes.sink
        srcs = self.split.output_sources
        leaves = self._gather(m, sink, srcs, [False] * len(srcs), st)
        out = pytree.tree_unflatten(leaves, self.split.output_spec)
        st.outputs[m] = pytree.tree_map_only(torch.Tensor, lambda t: t.detach(), out)
        if not self.training:
            return
        dev = self.tdev[self.routes.sink_device]
        if self._targets is None:
            loss = self.loss_fn(out)
        else:
            tgt = pytree.tree_map_only(
                torch.Tensor, lambda t: t[self._offsets[m]:self._offsets[m]
                                          + self.routes.mb_rows[m]].to(dev), self._targets)
            loss = self.loss_fn(out, tgt)
        weighted = loss * self.loss_weights[m]
        st.loss = (st.loss or 0.0) + float(weighted.detach())
        if weighted.requires_grad:
            weighted.backward()
        self._release_inputs(m, sink, st)

    def _backward(self, m: int, inst: Inst, st, stats, dev) -> None:
        outs = st.outputs_of.pop((m, inst))
        grads: dict[int, torch.Tensor] = {}
        start_row = self.routes.inst_rows[m][inst][0]
        for mkey in self.routes.outgoing[m].get(inst, []):
            msg = self.routes.msgs[m][mkey]
            if not msg.grad:
                continue
            k = msg.value[2]
            info = self.split.values[msg.value]
            shape = self._msg_shape(msg, m, info)
            g = self.transport.recv(shape, info.dtype, msg.dst, dev, msg.tag + 1)
            if k not in grads:
                grads[k] = torch.zeros_like(outs[k])
            if msg.rows is None:
                grads[k] += g
            else:
                f = info.factor
                grads[k][(msg.rows[0] - start_row) * f:(msg.rows[1] - start_row) * f] += g
        tensors, grad_tensors = [], []
        for k, g in grads.items():
            if outs[k].requires_grad:
                tensors.append(outs[k])
                grad_tensors.append(g)
        if tensors:
            torch.autograd.backward(tensors, grad_tensors)
        del outs
        self._release_inputs(m, inst, st)

    def _release_inputs(self, m: int, inst: Inst, st) -> None:
        """This consumer is done with its inputs: return gradients of slots
        whose every local consumer is done."""
        piece_inputs = (self.split.output_sources if inst == self.routes.sink
                        else self.split.pieces[inst.piece].inputs)
        for j in range(len(piece_inputs)):
            skey = self.routes.input_slot[m].get((inst, j))
            if skey is None:
                continue
            slot = self.routes.slots[m][skey]
            left = st.slot_left.get((m, skey), len(slot.consumers)) - 1
            st.slot_left[(m, skey)] = left
            if left > 0:
                continue
            leaf = st.leaves.pop((m, skey), None)
            if leaf is None:
                continue
            info = self.split.values[slot.value]
            offset = slot.rows[0] if slot.rows is not None else 0
            for mkey in slot.parts:
                msg = self.routes.msgs[m][mkey]
                st.received.pop((m, mkey), None)
                if not msg.grad:
                    continue
                g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                if msg.rows is not None:
                    f = info.factor
                    g = g[(msg.rows[0] - offset) * f:(msg.rows[1] - offset) * f]
                acc = st.msg_grad.get((m, mkey))
                st.msg_grad[(m, mkey)] = g if acc is None else acc + g
                mleft = st.msg_left.get((m, mkey), len(msg.slots)) - 1
                st.msg_left[(m, mkey)] = mleft
                if mleft == 0:
                    st.outbox.append((msg.tag + 1, st.msg_grad.pop((m, mkey)).contiguous(),
                                      slot.device, self.routes.device_of[msg.src]))

    # --- gradients ------------------------------------------------------
    def allreduce(self) -> None:
        """Sum each parameter's gradient over the devices holding a copy."""
        buckets: dict[tuple, list[str]] = defaultdict(list)
        for name, devs in self.holders.items():
            if len(devs) > 1:
                buckets[devs].append(name)
        for devs, names in sorted(buckets.items()):
            flats = {}
            for d in devs:
                if d not in self.local:
                    continue
                parts = []
                for name in names:
                    p = self.copies[d][name]
                    parts.append((p.grad if p.grad is not None else torch.zeros_like(p))
                                 .reshape(-1))
                flats[d] = torch.cat(parts)
            if not flats:
                continue
            for piece in _buckets(flats, self.bucket_bytes):
                self.transport.allreduce(piece, devs)
            for d, flat in flats.items():
                offset = 0
                for name in names:
                    p = self.copies[d][name]
                    n = p.numel()
                    # a view: the flat buffer is this step's gradient storage
                    p.grad = flat[offset:offset + n].view_as(p)
                    offset += n

    def train_step(self, inputs: list, targets: Any, batch_offsets: list[int], *,
                   training: bool, optimizer=None, keep_gradients: bool = False):
        """One step: forward (and backward) of every microbatch, the all-reduce
        of replicated gradients and the optimizer step. Returns the step's
        result (see :meth:`step`) and the gradients before the optimizer step
        when ``keep_gradients`` (else None)."""
        last = self.step(inputs, targets, batch_offsets)
        grads = None
        if training:
            start = time.perf_counter()
            self.allreduce()
            if any(len(d) > 1 for d in self.holders.values()):
                took = time.perf_counter() - start
                self.events += [Event(d, "all-reduce", "allreduce", start - self._t0, took)
                                for d in self.local]
            if keep_gradients:
                grads = self.gradients()
            if optimizer is not None:
                start = time.perf_counter()
                optimizer.step()
                took = time.perf_counter() - start
                self.events += [Event(d, "update", "update", start - self._t0, took)
                                for d in self.local]
        return last, grads

    def gradients(self) -> dict[str, torch.Tensor]:
        """Parameter name -> gradient (from the first local holder), on CPU."""
        out = {}
        for d in self.local:
            for name, p in self.copies.get(d, {}).items():
                if isinstance(p, torch.nn.Parameter) and name not in out and p.grad is not None:
                    out[name] = p.grad.detach().to("cpu").clone()
        return out

    def state(self) -> dict[str, torch.Tensor]:
        """Parameter and buffer name -> value (first local holder), on CPU."""
        out = {}
        for d in self.local:
            for name, p in self.copies.get(d, {}).items():
                out.setdefault(name, p.detach().to("cpu").clone())
        return out

    def param_bytes(self) -> dict[str, float]:
        return {d: float(sum(t.numel() * t.element_size() for t in table.values()))
                for d, table in self.copies.items()}


def _task_event(dev: str, kind: str, m: int, inst, sink, start: float, duration: float,
                waited: float) -> Event:
    """The timeline bar of one task (forward or backward of a piece for a
    microbatch); ``waited`` is the part spent waiting for messages."""
    what = "loss" if inst == sink else f"piece {getattr(inst, 'piece', inst)}"
    return Event(dev, f"{kind}{m} {what}", "forward" if kind == "F" else "backward",
                 start, duration, {"microbatch": m, "waited": waited})


@dataclass
class _StepState:
    leaves: dict = field(default_factory=dict)
    received: dict = field(default_factory=dict)
    outputs_of: dict = field(default_factory=dict)
    msg_grad: dict = field(default_factory=dict)
    msg_left: dict = field(default_factory=dict)
    slot_left: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    saved: dict = field(default_factory=dict)
    outbox: list = field(default_factory=list)     # (tag, tensor, src, dst) of the task
    loss: float | None = None


class _NoCount:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _SavedBytes:
    """Counts the bytes autograd saves for backward while a task runs (the
    activation memory of a device when its allocator cannot be asked)."""

    def __init__(self, stats: StepStats, device: str):
        self.stats = stats
        self.device = device
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t):
        if not isinstance(t, torch.nn.Parameter):
            self.stats.act_bytes[self.device] += t.numel() * t.element_size()
            self.stats.peak_act[self.device] = max(self.stats.peak_act[self.device],
                                                   self.stats.act_bytes[self.device])
        return t

    @staticmethod
    def _unpack(t):
        return t

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self.hooks.__exit__(*exc)


def _no_inplace(module: torch.nn.Module) -> None:
    """Received activations are shared leaves: in-place layers would modify
    them under autograd, so they run out of place (same numbers)."""
    for sub in module.modules():
        if hasattr(sub, "inplace") and isinstance(getattr(sub, "inplace"), bool):
            sub.inplace = False
    changed = False
    for node in getattr(module, "graph", torch.fx.Graph()).nodes:
        if node.kwargs.get("inplace") is True:
            node.kwargs = {**node.kwargs, "inplace": False}
            changed = True
    if changed:
        module.recompile()

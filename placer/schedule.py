"""One schedule: each device's actions in a fixed order, from the plan alone.

A plan split into pieces (:class:`placer.runtime.engine.Routes`) runs as
*tasks*: ``("F", m, inst)`` and ``("B", m, inst)``, the forward and backward
of microbatch ``m`` on one instance of a piece (the sink, after the last
piece, computes the loss in its forward and has no backward). :func:`build`
orders every device's tasks once, before any step, by the cost model's
dispatch rule (the rule :mod:`placer.cost.simulator` applies to its ready
tasks), played out on the tasks with estimated durations:

- a task that continues the last one on its device (same kind and
  microbatch, fed by it and by nothing from another device) runs next;
- else the first ready task by priority: ``1f1b`` backwards first, earlier
  microbatches first, and a device starts a new microbatch only while fewer
  than its in-flight cap (:func:`inflight_cap`) are between their first
  forward and last backward on it; ``gpipe`` forwards first and no backward
  before the device ran every forward; ``forward`` (inference) microbatch
  order.

1F1B whose caps deadlock on a placement gets larger caps, then falls back to
GPipe. Every process computes the same schedule, and the runtimes (one
process or many ranks) run exactly these orders, so the order of the
messages between any two devices is fixed too: :attr:`Schedule.pairs` lists,
per pair, every message of a step in the order both ends post it (a task's
receives before its work, its sends after it, in tag order). A transport
that posts sends and receives in that order matches them without tags, as
NCCL does (see :class:`placer.runtime.transport.DistTransport`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Action", "Message", "Schedule", "build", "deps", "from_simulation", "inflight_cap",
           "task_cost", "from_orders", "Inst", "interleave"]


def inflight_cap(first_run, runs, microbatches):
    """1F1B's in-flight limit: a device whose first stage (run of the
    topological order on one group) is ``first_run`` of ``runs`` keeps at
    most ``runs - first_run`` microbatches between forward and backward
    (the classic ``S - r`` warm-up), at least 1 and at most
    ``microbatches``. Works on numbers and on numpy arrays alike (the cost
    models' :func:`placer.cost.memory.inflight` applies it per device)."""
    import numpy as np
    return np.minimum(microbatches, np.maximum(np.subtract(runs, first_run), 1))


@dataclass(frozen=True)
class Inst:
    """One instance: ``piece`` (== number of pieces for the sink), its replica."""

    piece: int
    replica: int


@dataclass(frozen=True)
class Message:
    """One message of a step between two devices: ``tag`` identifies it
    within the step (an activation's tag is even, its gradient's the next
    odd number), ``kind`` is ``"activation"`` or ``"gradient"``."""

    tag: int
    src: str
    dst: str
    kind: str
    microbatch: int


@dataclass(frozen=True)
class Action:
    """One action of a device, as PyTorch's pipelining lists them:
    ``kind`` is ``"F"``/``"B"`` (compute of ``piece``, ``replica`` for
    microbatch ``microbatch``; piece == number of pieces is the loss),
    ``"SEND"``/``"RECV"`` (message ``tag`` to/from ``peer``)."""

    kind: str
    microbatch: int
    piece: int = -1
    replica: int = 0
    tag: int = -1
    peer: str = ""


@dataclass
class Schedule:
    """What :func:`build` returns. ``name``: the schedule run (``"1f1b"``,
    ``"gpipe"`` or ``"forward"``); ``orders``: device -> its tasks in order;
    ``order``: one global order of ``(device, task)`` consistent with every
    device's order and every dependency (what one process runs); ``caps``:
    device -> in-flight limit (microbatches between a forward and its
    backward; all of them for GPipe); ``sends``/``recvs``: task -> the
    cross-device messages it sends / receives, in order; ``pairs``:
    ``(a, b)`` with ``a < b`` -> the messages between the two in the order
    both post them; ``source``: ``"simulator"`` when the orders are the
    simulator's (:func:`from_simulation`), ``"rule"`` when :func:`build`'s."""

    name: str
    orders: dict
    order: list
    caps: dict
    sends: dict = field(default_factory=dict)
    recvs: dict = field(default_factory=dict)
    pairs: dict = field(default_factory=dict)
    source: str = "rule"

    def messages(self, a: str, b: str) -> list:
        """The step's messages between devices ``a`` and ``b``, in order."""
        return self.pairs.get((min(a, b), max(a, b)), [])

    def peer_sequence(self, me: str) -> dict:
        """Peer device -> ``[(Message, is_send)]``: what ``me`` posts to or
        from each peer, in order."""
        out: dict = {}
        for (a, b), msgs in self.pairs.items():
            if me in (a, b):
                other = b if me == a else a
                out[other] = [(x, x.src == me) for x in msgs]
        return out

    def actions(self, device: str) -> list:
        """``device``'s actions in order: each task's receives, the task,
        its sends."""
        out = []
        for task in self.orders.get(device, []):
            kind, m, inst = task
            for x in self.recvs.get(task, []):
                out.append(Action("RECV", m, tag=x.tag, peer=x.src))
            out.append(Action(kind, m, inst.piece, inst.replica))
            for x in self.sends.get(task, []):
                out.append(Action("SEND", m, tag=x.tag, peer=x.dst))
        return out


def deps(routes, task) -> list:
    """The tasks ``task`` waits for (on any device): a forward waits for the
    forwards producing its inputs; a backward for its own forward and for
    the consumers of its outputs (their backward; the sink's forward)."""
    kind, m, inst = task
    out = []
    if kind == "F":
        for (ci, _j), skey in routes.input_slot[m].items():
            if ci == inst:
                for mkey in routes.slots[m][skey].parts:
                    out.append(("F", m, routes.msgs[m][mkey].src))
    else:
        out.append(("F", m, inst))
        for mkey in routes.outgoing[m].get(inst, []):
            msg = routes.msgs[m][mkey]
            if msg.grad:
                for skey in msg.slots:
                    for c in routes.slots[m][skey].consumers:
                        out.append(("F", m, c) if c == routes.sink else ("B", m, c))
    return out


def interleave(routes, orders: dict) -> list | None:
    """One global order that respects every device's order and every
    dependency (what one process issues), or None if the orders deadlock."""
    pos = {d: 0 for d in orders}
    done: set = set()
    out = []
    deps_cache: dict = {}
    total = sum(len(o) for o in orders.values())
    while len(out) < total:
        progress = False
        for d, order in orders.items():
            while pos[d] < len(order):
                task = order[pos[d]]
                if task not in deps_cache:
                    deps_cache[task] = deps(routes, task)
                if all(t in done for t in deps_cache[task]):
                    done.add(task)
                    out.append((d, task))
                    pos[d] += 1
                    progress = True
                else:
                    break
        if not progress:
            return None
    return out


def task_cost(routes) -> Callable:
    """Estimated task durations when nothing better is known: a piece's
    forward costs its number of computing nodes over its replicas, a
    backward twice that, the loss one node. Only the order depends on it."""
    sizes = {}
    for p in routes.split.pieces:
        nodes = sum(1 for n in p.module.graph.nodes
                    if n.op in ("call_module", "call_function", "call_method"))
        sizes[p.index] = max(1, nodes) / len(routes.instances[p.index])

    def cost(task) -> float:
        kind, _m, inst = task
        if inst == routes.sink:
            return 1.0
        return sizes[inst.piece] * (1.0 if kind == "F" else 2.0)
    return cost


def build(routes, schedule: str, training: bool, cost: Callable | None = None) -> Schedule:
    """Each device's tasks in order, and the step's messages (see the module
    doc). ``schedule``: the plan's (``"1f1b"`` or ``"gpipe"``); ``cost``:
    task -> estimated seconds (default :func:`task_cost`). Deterministic."""
    cost = cost or task_cost(routes)
    devs = routes.devices()
    mine: dict = {d: [] for d in devs}
    for inst in routes.all_instances():
        mine[routes.device_of[inst]].append(inst)
    M = len(routes.mb_rows)
    pieces = len(routes.split.pieces)
    first = {d: min((i.piece for i in mine[d] if i != routes.sink), default=pieces)
             for d in devs}
    if not training:
        caps = {d: M for d in devs}
        out = _play(routes, mine, "forward", caps, cost)
        return _finish(routes, "forward", out, caps, training)
    if schedule == "1f1b":
        for extra in range(M):
            caps = {d: int(inflight_cap(first[d], pieces, M)) + extra for d in devs}
            caps = {d: min(M, c) for d, c in caps.items()}
            out = _play(routes, mine, "1f1b", caps, cost)
            if out is not None:
                return _finish(routes, "1f1b", out, caps, training)
    caps = {d: M for d in devs}
    return _finish(routes, "gpipe", _play(routes, mine, "gpipe", caps, cost), caps, training)


def _tasks_of(routes, mine: dict, d: str, name: str) -> list:
    """A device's tasks in base order: per microbatch its forwards in piece
    order, then (training) its backwards in reverse."""
    M = len(routes.mb_rows)
    out = [("F", m, i) for m in range(M) for i in mine[d]]
    if name != "forward":
        out += [("B", m, i) for m in range(M) for i in reversed(mine[d]) if i != routes.sink]
    return out


def _play(routes, mine: dict, name: str, caps: dict, cost: Callable) -> list | None:
    """List scheduling by the dispatch rule (module doc) with durations
    ``cost``; returns ``[(device, task)]`` by start time, or None when the
    caps deadlock."""
    devs = list(mine)
    urgent = "B" if name == "1f1b" else "F"
    base = {d: _tasks_of(routes, mine, d, name) for d in devs}
    index = {t: k for d in devs for k, t in enumerate(base[d])}
    prio = {d: sorted(base[d], key=lambda t: (t[0] != urgent, t[1], index[t])) for d in devs}
    need = {t: deps(routes, t) for d in devs for t in base[d]}
    local_only = {t: all(routes.device_of[x[2]] == d for x in need[t])
                  for d in devs for t in base[d]}
    forwards_left = {d: sum(1 for t in base[d] if t[0] == "F") for d in devs}
    owed = {d: {} for d in devs}
    for d in devs:
        for t in base[d]:
            if t[0] == "B":
                owed[d][t[1]] = owed[d].get(t[1], 0) + 1
    started: dict = {d: set() for d in devs}
    done: set = set()
    pending = {d: list(prio[d]) for d in devs}
    last: dict = {}
    busy: dict = {}
    events: list = []          # (end, seq, device, task)
    out: list = []
    now, seq = 0.0, 0
    total = sum(len(b) for b in base.values())
    while len(done) < total:
        for d in devs:
            if d in busy or not pending[d]:
                continue
            pick = _continuation(pending[d], last.get(d), need, local_only, done)
            if pick is None:
                for k, t in enumerate(pending[d]):
                    kind, m, _i = t
                    if kind == "F" and name == "1f1b" and m not in started[d] and sum(
                            1 for j in started[d] if owed[d].get(j, 0) > 0) >= caps[d]:
                        continue
                    if kind == "B" and name == "gpipe" and forwards_left[d] > 0:
                        continue
                    if all(x in done for x in need[t]):
                        pick = k
                        break
            if pick is None:
                continue
            t = pending[d].pop(pick)
            busy[d] = t
            out.append((d, t))
            heapq.heappush(events, (now + float(cost(t)), seq, d, t))
            seq += 1
        if not events:
            return None
        now, _s, d, t = heapq.heappop(events)
        finished = [(d, t)]
        while events and events[0][0] == now:
            _e, _s, d2, t2 = heapq.heappop(events)
            finished.append((d2, t2))
        for d, t in finished:
            del busy[d]
            done.add(t)
            last[d] = t
            if t[0] == "F":
                forwards_left[d] -= 1
                started[d].add(t[1])
            else:
                owed[d][t[1]] -= 1
    return out


def _continuation(pending: list, last, need: dict, local_only: dict, done: set):
    """Index in ``pending`` of the task continuing ``last`` (same kind and
    microbatch, waiting for it and for nothing from another device), else
    None: the simulator runs such a piece in one segment with the one
    before it."""
    if last is None:
        return None
    for k, t in enumerate(pending):
        if t[0] != last[0] or t[1] != last[1]:
            continue
        if local_only[t] and last in need[t] and all(x in done for x in need[t]):
            return k
    return None


def _finish(routes, name: str, order: list, caps: dict, training: bool,
            source: str = "rule") -> Schedule:
    """The schedule of a played ``order``: per-device orders and messages."""
    orders: dict = {d: [] for d in routes.devices()}
    for d, t in order:
        orders[d].append(t)
    pos = {t: k for d in orders for k, t in enumerate(orders[d])}
    # the task on a value's device that sends its gradient back: the last
    # of the value's local consumers to finish with it
    grad_sender: dict = {}
    if training:
        for m, msgs in enumerate(routes.msgs):
            for mkey, msg in msgs.items():
                if not msg.grad:
                    continue
                users = {("F", m, c) if c == routes.sink else ("B", m, c)
                         for skey in msg.slots for c in routes.slots[m][skey].consumers}
                grad_sender[(m, mkey)] = max(users, key=lambda t: pos[t])
    sends: dict = {}
    recvs: dict = {}
    for m, msgs in enumerate(routes.msgs):
        for mkey, msg in msgs.items():
            src = routes.device_of[msg.src]
            if src == msg.dst:
                continue
            act = Message(msg.tag, src, msg.dst, "activation", m)
            sends.setdefault(("F", m, msg.src), []).append(act)
            takers = [c for skey in msg.slots for c in routes.slots[m][skey].consumers]
            first = min((("F", m, c) for c in takers), key=lambda t: pos[t])
            recvs.setdefault(first, []).append(act)
            if (m, mkey) in grad_sender:
                grad = Message(msg.tag + 1, msg.dst, src, "gradient", m)
                sends.setdefault(grad_sender[(m, mkey)], []).append(grad)
                recvs.setdefault(("B", m, msg.src), []).append(grad)
    for table in (sends, recvs):
        for lst in table.values():
            lst.sort(key=lambda x: x.tag)
    pairs: dict = {}
    for d, t in order:
        for x in sends.get(t, []):
            pairs.setdefault((min(x.src, x.dst), max(x.src, x.dst)), []).append(x)
    return Schedule(name, orders, list(order), dict(caps), sends, recvs, pairs, source)


def plain(sched: Schedule) -> dict:
    """What :func:`from_orders` needs of ``sched``, in plain values (to send
    it from one process to the others)."""
    return {"name": sched.name, "caps": dict(sched.caps), "source": sched.source,
            "order": [(d, (k, m, i.piece, i.replica)) for d, (k, m, i) in sched.order]}


def from_orders(routes, data: dict, training: bool) -> Schedule:
    """The schedule :func:`plain` described, rebuilt on ``routes``."""
    order = [(d, (k, m, Inst(p, r))) for d, (k, m, p, r) in data["order"]]
    return _finish(routes, data["name"], order, dict(data["caps"]), training,
                   data.get("source", "rule"))


def from_simulation(routes, graph, sim_orders: dict, schedule: str, training: bool):
    """The order the simulator ran (``sim_orders``:
    :func:`placer.cost.simulator.executed_orders`) as the runtime's schedule:
    each simulated task's ops mapped to the pieces holding them on its
    device, each where the simulator ran its last segment (the simulator
    may start a piece on part of its inputs; the runtime runs it whole),
    the loss of a microbatch just before the first backward of it on the
    loss's device. None when that is not a valid order of exactly the
    runtime's tasks (e.g. a piece the runtime runs unsharded): then
    :func:`build`'s rule applies."""
    calls = ("call_module", "call_function", "call_method")
    by_fx = {op.extra.get("fx", op.id): op.id for op in graph}
    inst_of: dict = {}
    for p in routes.split.pieces:
        # the traced names (split_module renames the nodes inside a piece)
        names = [by_fx[n] for n in p.nodes if n in by_fx] if p.nodes else \
            [by_fx[n.name] for n in p.module.graph.nodes if n.op in calls and n.name in by_fx]
        for inst in routes.instances[p.index]:
            for op in names:
                inst_of[(routes.device_of[inst], op)] = inst
    devs = routes.devices()
    orders: dict = {d: [] for d in devs}
    for d, tasks in sim_orders.items():
        at: dict = {}           # task -> its last segment's position
        for k, (kind, m, ops) in enumerate(tasks):
            if kind == "B" and not training:
                return None
            insts = sorted({inst_of[(d, o)] for o in ops if (d, o) in inst_of},
                           key=lambda i: i.piece, reverse=kind == "B")
            if insts and d not in orders:
                return None
            for j, inst in enumerate(insts):
                at[(kind, m, inst)] = (k, j)
        # a piece the simulator ran in several segments with other tasks in
        # between runs whole where its last segment ran: only then has the
        # runtime every input it needs
        orders[d] = sorted(at, key=at.get)
    sink, M = routes.sink, len(routes.mb_rows)
    on_sink = orders[routes.sink_device]
    for m in range(M):
        at = next((k for k, t in enumerate(on_sink) if t[0] == "B" and t[1] == m), None)
        if at is None:
            feeds = [k for k, t in enumerate(on_sink) if t[0] == "F" and t[1] == m]
            at = feeds[-1] + 1 if feeds else len(on_sink)
        on_sink.insert(at, ("F", m, sink))
    mine: dict = {d: [] for d in devs}
    for inst in routes.all_instances():
        mine[routes.device_of[inst]].append(inst)
    name = schedule if training else "forward"
    for d in devs:
        want = _tasks_of(routes, mine, d, name)
        if len(orders[d]) != len(want) or set(orders[d]) != set(want):
            return None
    order = interleave(routes, orders)
    if order is None:
        return None
    pieces = len(routes.split.pieces)
    first = {d: min((i.piece for i in mine[d] if i != sink), default=pieces) for d in devs}
    caps = {d: (int(inflight_cap(first[d], pieces, M)) if name == "1f1b" else M) for d in devs}
    return _finish(routes, name, order, caps, training, "simulator")



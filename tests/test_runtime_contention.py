"""Ranks that share cores: the schedule's order on a rank and contention-aware prediction."""

from __future__ import annotations

import pytest
import torch

import placer
from placer import zoo
from placer.cost.report import Event
from placer.runtime.contention import overlap, predict_shared
from placer.runtime.engine import Engine, Routes
from placer.schedule import build as build_schedule
from placer.runtime.run import default_loss, prepare, sink_device

from runtime_helpers import one_thread  # noqa: F401


class _Transport:
    """A rank's transport (only where devices are)."""

    def __init__(self, me):
        self.me = me

    def hosts(self, device):
        return device == self.me


def _rank_engine(me="a", middle=("b",), schedule="1f1b"):
    """Rank ``me``'s engine for a, ``middle``, a (thirds of the tiny GPT's
    order): device a waits for the middle in every microbatch."""
    model, inputs = zoo.build("gpt-125m", tiny=True, batch=4)
    graph = placer.trace(model, inputs)
    order = graph.topological_order()
    third = len(order) // 3
    where = [["a"] if i < third or i >= 2 * third else list(middle) for i in range(len(order))]
    plan = placer.Plan(dict(zip(order, where)), microbatches=2, schedule=schedule)
    for members in graph.colocation_groups().values():
        for op in members[1:]:
            plan.placement[op] = list(plan.placement[members[0]])
    graph, plan, sp, inputs, rows = prepare(model, plan, inputs, graph=graph)
    routes = Routes(sp, rows, sink_device(sp))
    sched = build_schedule(routes, plan.schedule, True)
    engine = Engine(sp, routes, {d: torch.device("cpu") for d in routes.devices()}, [me],
                    _Transport(me), training=True, loss_fn=default_loss,
                    loss_weights=[0.5, 0.5], order=[(me, t) for t in sched.orders[me]],
                    schedule=sched)
    return engine, sched


def test_a_rank_runs_its_schedule_order():
    # whatever arrives first: the order is the schedule's, so that every
    # pair of ranks posts its messages in one sequence
    engine, sched = _rank_engine()
    assert [t for _, t in engine._tasks()] == sched.orders["a"]
    # 1F1B on a, whose first and last pieces bracket b's: microbatch 0's
    # backward runs as soon as its loss is done, before microbatch 1's last
    # forward (the simulator's rule), not after every forward
    kinds = [t[0] for t in sched.orders["a"]]
    assert kinds.index("B") < len(kinds) - 1 - kinds[::-1].index("F")


def test_overlap_of_timelines():
    ev = [Event("a", "F0", "forward", 0.0, 2.0), Event("b", "F0", "forward", 1.0, 2.0),
          Event("a->b", "x", "transfer", 0.0, 5.0), Event("c", "B0", "backward", 10.0, 1.0)]
    got = overlap(ev, ["a", "b", "c"])
    assert got == {"a": 0.5, "b": 0.5, "c": 0.0}


def _problem():
    g = placer.Graph("chain", [placer.Op("x", flops=1e9), placer.Op("y", flops=1e9)],
                     [placer.Edge("x", "y", 1e3)])
    devices = [placer.Device(n, 1e10, 1e10, efficiency=1.0,
                             extra={"cpu_share": 1.0, "cpu_share_all": 0.5}) for n in "ab"]
    return g, placer.Cluster.from_rules("two", devices, default=(1e9, 0.0))


def test_replicas_computing_at_once_get_the_shared_rate():
    g, c = _problem()
    alone = placer.Plan({"x": ["a"], "y": ["a"]})
    dp = placer.Plan({"x": ["a", "b"], "y": ["a", "b"]})
    # one device: nobody to share with, the plain simulation
    assert predict_shared(g, c, alone, op_overhead=0.0).step_time == \
        placer.simulate(g, c, alone, op_overhead=0.0).step_time
    # replicas compute at the same time: half a core each
    shared = predict_shared(g, c, dp, op_overhead=0.0)
    assert shared.extra["cpu_shares"] == {"a": 0.5, "b": 0.5}
    plain = placer.simulate(g, c, dp, op_overhead=0.0).step_time
    assert shared.step_time > 1.9 * plain - 1e-12


def test_pipeline_stages_that_take_turns_keep_their_core():
    g, c = _problem()
    g = placer.Graph("chain", list(g), list(g.edges), training=False)
    plan = placer.Plan({"x": ["a"], "y": ["b"]})   # one microbatch: b waits for a
    report = predict_shared(g, c, plan, op_overhead=0.0)
    assert report.extra["cpu_shares"] == {"a": 1.0, "b": 1.0}


def test_message_costs_weigh_by_how_much_the_ranks_compute_at_once():
    from placer.runtime.contention import MESSAGE_IDLE_SHARE, message_weight
    assert message_weight({"a": 1.0, "b": 1.0}) == 1.0
    assert message_weight({"a": 0.0, "b": 0.0}) == MESSAGE_IDLE_SHARE
    assert message_weight({"a": 0.5, "b": 0.5}) == MESSAGE_IDLE_SHARE + \
        (1 - MESSAGE_IDLE_SHARE) * 0.5
    assert message_weight({"a": 0.0}) == 1.0           # one rank: no one to share with
    # ranks that take turns (one microbatch through a chain): each message
    # end costs its idle share, on the critical path
    g, c = _problem()
    plan = placer.Plan({"x": ["a"], "y": ["b"]})
    cost = 1e-3
    free = predict_shared(g, c, plan, op_overhead=0.0).step_time
    priced = predict_shared(g, c, plan, op_overhead=0.0, message_overhead=cost).step_time
    full = placer.simulate(g, c, plan, op_overhead=0.0, message_overhead=cost).step_time
    ends = 2 * 2              # forward and gradient, each at both ends
    assert priced - free == pytest.approx(ends * cost * MESSAGE_IDLE_SHARE, rel=1e-6)
    assert full - placer.simulate(g, c, plan, op_overhead=0.0).step_time == \
        pytest.approx(ends * cost, rel=1e-6)


def test_a_rank_runs_the_piece_that_continues_its_last_task_next():
    # a, (a, b), a: the middle piece is data-parallel, its replica on a fed
    # by a's first piece only. The simulator runs the two as one segment;
    # the schedule does too, although microbatch 0's last piece (waiting
    # for b's half) may be ready in between.
    engine, sched = _rank_engine("a", middle=("a", "b"))
    assert sched.name == "1f1b"
    ran = sched.orders["a"]
    routes = engine.routes
    pieces = sorted({t[2].piece for t in ran if t[2] != routes.sink})
    first, middle = pieces[0], pieces[1]
    for k, t in enumerate(ran[:-1]):
        if t[0] == "F" and t[2].piece == first:
            nxt = ran[k + 1]
            assert nxt[:2] == t[:2] and nxt[2].piece == middle

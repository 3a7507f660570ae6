"""Ranks that share cores: ready-first dispatch and contention-aware prediction."""

from __future__ import annotations

import torch

import placer
from placer import zoo
from placer.cost.report import Event
from placer.runtime.contention import overlap, predict_shared
from placer.runtime.engine import Engine, Routes, device_orders
from placer.runtime.run import default_loss, prepare, sink_device

from runtime_helpers import one_thread  # noqa: F401


class _Transport:
    """A rank's transport whose messages ``ok`` have arrived."""

    def __init__(self, me, ok):
        self.me, self.ok = me, ok

    def hosts(self, device):
        return device == self.me

    def ready(self, tag):
        return tag in self.ok


def _rank_engine(me="a", ok=(), middle=("b",), schedule=None):
    """Rank ``me``'s engine for a, ``middle``, a (thirds of the tiny GPT's
    order): with the default, device a waits for b in the middle of every
    microbatch. ``schedule``: the engine dispatches by it (see
    Engine._dispatch), else by its order's runs."""
    model, inputs = zoo.build("gpt-125m", tiny=True, batch=4)
    graph = placer.trace(model, inputs)
    order = graph.topological_order()
    third = len(order) // 3
    where = [["a"] if i < third or i >= 2 * third else list(middle) for i in range(len(order))]
    plan = placer.Plan(dict(zip(order, where)), microbatches=2, schedule=schedule or "1f1b")
    for members in graph.colocation_groups().values():
        for op in members[1:]:
            plan.placement[op] = list(plan.placement[members[0]])
    graph, plan, sp, inputs, rows = prepare(model, plan, inputs, graph=graph)
    routes = Routes(sp, rows, sink_device(sp))
    orders, used = device_orders(routes, plan.schedule, True)
    transport = _Transport(me, set(ok))
    engine = Engine(sp, routes, {d: torch.device("cpu") for d in routes.devices()}, [me],
                    transport, training=True, loss_fn=default_loss, loss_weights=[0.5, 0.5],
                    order=[(me, t) for t in orders[me]],
                    schedule=used if schedule is not None else None)
    return engine, transport


def _check_dispatch(engine, arrived):
    """Run the rank's dispatch with messages ``arrived``; return the tasks
    that overtook an earlier task of the order."""
    order = [t for _, t in engine.order]
    needs = engine._needs()
    engine.transport.ok = arrived
    ran = [t for _, t in engine._tasks()]
    assert sorted(ran, key=order.index) == order          # every task once
    for i, t in enumerate(ran):
        assert needs[t][2] == needs[order[i]][2]          # never leaves its run of the order
        assert all(d in ran[:i] for d in needs[t][0])     # after this rank's tasks it needs
    overtook = [t for i, t in enumerate(ran)
                if any(order.index(u) < order.index(t) for u in order if u not in ran[:i])]
    # only a task whose messages are all here overtakes another
    assert all(tag in arrived for t in overtook for tag in needs[t][1])
    return overtook


def test_a_rank_runs_the_first_ready_task_of_its_run():
    engine, _ = _rank_engine()
    order = [t for _, t in engine.order]
    needs = engine._needs()
    every = {tag for t in order for tag in needs[t][1]}
    overtook = _check_dispatch(engine, every)
    assert not overtook                                   # all here: the planned order
    # nothing here: tasks that need no message (microbatch 1's first
    # forward, its inputs are local) overtake microbatch 0's that wait for b
    overtook = _check_dispatch(engine, set())
    assert any(t[:2] == ("F", 1) for t in overtook)
    assert all(not needs[t][1] for t in overtook)
    # microbatch 1's messages only: its tasks that wait for them overtake too
    overtook = _check_dispatch(engine, {tag for t in order if t[1] == 1
                                           for tag in needs[t][1]})
    assert any(needs[t][1] for t in overtook)


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


def test_a_rank_runs_the_piece_that_continues_its_last_task_next():
    # a, (a, b), a: the middle piece is data-parallel, its replica on a fed
    # by a's first piece only. The simulator runs the two as one segment;
    # the rank must too, even when an earlier microbatch's task (the last
    # piece, waiting for b's half) becomes ready in between.
    engine, transport = _rank_engine("a", middle=("a", "b"), schedule="1f1b")
    assert engine.schedule == "1f1b"
    routes = engine.routes
    needs = engine._needs()
    every = {tag for _, t in engine.order for tag in needs[t][1]}
    ran = []
    for _dev, task in engine._tasks():
        ran.append(task)
        if len(ran) == 3:
            # b's half of microbatch 0 arrives while a runs microbatch 1's first piece
            assert [t[:2] for t in ran] == [("F", 0), ("F", 0), ("F", 1)]
            transport.ok = every
    pieces = sorted({t[2].piece for t in ran if t[2] != routes.sink})
    first, middle = pieces[0], pieces[1]
    assert ran[3][:2] == ("F", 1) and ran[3][2].piece == middle   # not ("F", 0, last piece)
    assert ran[2][2].piece == first
    assert sorted(map(str, ran)) == sorted(str(t) for _, t in engine.order)   # each once

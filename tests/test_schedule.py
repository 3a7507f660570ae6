"""One schedule (placer.schedule): fixed orders, message sequences that match
by order alone, and runtimes that run exactly it."""

from __future__ import annotations

import functools

import pytest
import torch

import placer
from placer import Plan, zoo
from placer.runtime.engine import Routes, interleave
from placer.runtime.run import Runner, prepare, sink_device
from placer.schedule import build, deps

from runtime_helpers import (branchy_build, one_thread, random_plan,  # noqa: F401
                             reference)


_TRACED: dict = {}


def _routes(build_fn, plan):
    key = repr(build_fn)
    if key not in _TRACED:
        model, inputs = build_fn()
        _TRACED[key] = (model, inputs, placer.trace(model, inputs))
    model, inputs, graph = _TRACED[key]
    _g, plan, sp, _inputs, rows = prepare(model, plan, inputs, graph=graph)
    return Routes(sp, rows, sink_device(sp))


def _branchy_plan(microbatches=2, schedule="1f1b"):
    """Op-level and non-contiguous: the branches on different devices, the
    stem and the reuse of its weight data-parallel over a and b, the head on c."""
    where = {"x": ["a"], "stem": ["a", "b"], "relu": ["a", "b"], "left.0": ["b"],
             "left.1": ["b"], "left.2": ["b"], "right.0": ["a"], "right.1": ["a"],
             "add": ["c"], "linear": ["a", "b"], "head": ["c"]}
    return Plan(where, microbatches=microbatches, schedule=schedule)


def _gpt_plans():
    build_fn = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=4)
    model, inputs = build_fn()
    graph = placer.trace(model, inputs)
    plans = [random_plan(graph, ["a", "b", "c"], seed=s, microbatches=m, schedule=sch)
             for s, m, sch in [(0, 2, "1f1b"), (1, 4, "1f1b"), (2, 2, "gpipe"), (3, 4, "1f1b"),
                               (5, 1, "1f1b"), (6, 4, "gpipe")]]
    return build_fn, plans


def _check_schedule(routes, sched, training=True):
    # every task once, in an order consistent with every dependency
    for d, order in sched.orders.items():
        assert len(order) == len(set(order))
    assert interleave(routes, sched.orders) is not None
    seen = set()
    for _d, task in sched.order:
        assert all(t in seen for t in deps(routes, task)), task
        seen.add(task)
    # every cross-device message once, sent before it is received
    pos = {t: k for k, (_d, t) in enumerate(sched.order)}
    sent = {x.tag: t for t, xs in sched.sends.items() for x in xs}
    got = {x.tag: t for t, xs in sched.recvs.items() for x in xs}
    assert set(sent) == set(got)
    assert all(pos[sent[k]] < pos[got[k]] for k in sent)
    assert sum(len(v) for v in sched.pairs.values()) == len(sent)


def _nccl_streams_progress(sched, prepost: bool = False) -> bool:
    """Play the ranks' posting rule (DistTransport without pre-posting) on
    NCCL's semantics: each pair's operations run one at a time, in posting
    order, and the k-th operation of one end completes with the k-th of the
    other. A rank runs its tasks in order, posting a task's receives (and
    every receive before them in the pair's sequence) and waiting for them,
    then posting its sends (after every receive before them). True when
    every rank finishes. ``prepost``: every receive of the step posted
    first (what gloo's ranks do)."""
    seqs = {d: sched.peer_sequence(d) for d in sched.orders}
    index = {d: {(x.tag, s): (p, i) for p, rows in seqs[d].items()
                 for i, (x, s) in enumerate(rows)} for d in seqs}
    posted = {d: {p: [] for p in seqs[d]} for d in seqs}    # the pair stream's ops
    cursor = {d: {p: 0 for p in seqs[d]} for d in seqs}
    pc = {d: 0 for d in seqs}                                # next task
    stage = {d: "recv" for d in seqs}
    early = {d: {p: set() for p in seqs[d]} for d in seqs}
    if prepost:
        for d in seqs:
            for p, rows in seqs[d].items():
                for i, (x, is_send) in enumerate(rows):
                    if not is_send:
                        posted[d][p].append(("recv", x.tag))
                        early[d][p].add(i)

    def post_upto(d, p, i):
        while cursor[d][p] < i:
            x, is_send = seqs[d][p][cursor[d][p]]
            if cursor[d][p] not in early[d][p]:
                assert not is_send, "a send is due before the task that sends it ran"
                posted[d][p].append(("recv", x.tag))
            cursor[d][p] += 1

    def completed(d, p, tag):
        # stream op k completes when both ends have posted ops 0..k and they match
        k = posted[d][p].index(("recv", tag))
        other = posted[p][d]
        if len(other) <= k:
            return False
        return all(a[1] == b[1] and a[0] != b[0] for a, b in zip(posted[d][p][:k + 1],
                                                                   other[:k + 1]))
    progress = True
    while progress:
        progress = False
        for d, order in sched.orders.items():
            while pc[d] < len(order):
                task = order[pc[d]]
                if stage[d] == "recv":
                    for x in sched.recvs.get(task, []):
                        p, i = index[d][(x.tag, False)]
                        post_upto(d, p, i + 1)
                    if not all(completed(d, x.src, x.tag) for x in sched.recvs.get(task, [])):
                        break
                    stage[d] = "send"
                for x in sched.sends.get(task, []):
                    p, i = index[d][(x.tag, True)]
                    post_upto(d, p, i)
                    posted[d][p].append(("send", x.tag))
                    cursor[d][p] = i + 1
                stage[d] = "recv"
                pc[d] += 1
                progress = True
    return all(pc[d] == len(o) for d, o in sched.orders.items())


def test_schedules_are_valid_deterministic_and_deadlock_free_under_nccl_rules():
    build_fn, plans = _gpt_plans()
    plans.append(_branchy_plan())
    plans.append(_branchy_plan(4, "gpipe"))
    for k, plan in enumerate(plans):
        fn = branchy_build if k >= len(plans) - 2 else build_fn
        routes = _routes(fn, plan)
        sched = build(routes, plan.schedule, True)
        _check_schedule(routes, sched)
        again = build(routes, plan.schedule, True)
        assert again.orders == sched.orders and again.pairs == sched.pairs
        assert _nccl_streams_progress(sched), k
        inference = build(routes, plan.schedule, False)
        assert inference.name == "forward" and not any(
            t[0] == "B" for o in inference.orders.values() for t in o)


def test_preposting_every_receive_would_deadlock_under_nccl():
    # the checker can fail: ranks that post every receive of the step before
    # their sends (gloo's way) wait for each other on NCCL's pair streams
    build_fn, plans = _gpt_plans()
    routes = _routes(build_fn, plans[1])
    sched = build(routes, "1f1b", True)
    assert _nccl_streams_progress(sched)
    assert not _nccl_streams_progress(sched, prepost=True)


def test_1f1b_caps_and_linear_pipeline_order():
    # a 3-stage pipeline with 4 microbatches: the classic 1F1B orders
    model, inputs = zoo.build("gpt-125m", tiny=True, batch=4)
    graph = placer.trace(model, inputs)
    from placer.runtime.dist import reference_plan
    plan = reference_plan(graph, ["a", "b", "c"], 4)
    routes = _routes(functools.partial(zoo.build, "gpt-125m", tiny=True, batch=4), plan)
    sched = build(routes, "1f1b", True)
    assert sched.name == "1f1b"
    last = [d for d in sched.orders][-1]
    kinds = {d: "".join(t[0] for t in o if t[2] != routes.sink) for d, o in sched.orders.items()}
    # the first stage warms up with as many forwards as its cap, then alternates
    first = next(iter(sched.orders))
    cap = sched.caps[first]
    assert kinds[first].startswith("F" * cap + "B")
    assert sched.caps[last] <= cap
    actions = sched.actions(first)
    assert {a.kind for a in actions} >= {"F", "B", "SEND", "RECV"}


def test_one_process_runs_exactly_the_schedule():
    model, inputs = branchy_build()
    out, loss, grads = reference(model, inputs)
    runner = Runner(model, _branchy_plan(), inputs)
    _seconds, last, kept = runner.step(keep_gradients=True)
    assert runner.engine.executed == runner.plan_schedule.order
    assert abs(last["loss"] - loss) < 1e-5
    for name, g in grads.items():
        torch.testing.assert_close(kept[name], g, atol=1e-5, rtol=1e-4)


def _check_ranks(result, sched):
    """Each rank ran its schedule's order, and both ends of every pair
    posted the pair's messages in one sequence."""
    for dev, ran in result["executed"].items():
        want = [(k, m, i.piece, i.replica) for k, m, i in sched.orders[dev]]
        assert ran == want, dev
    posted = result["posted"]
    for (a, b), msgs in sched.pairs.items():
        for src, dst in ((a, b), (b, a)):
            sends = [t for p, t, k in posted[src] if p == dst and k == "send"]
            recvs = [t for p, t, k in posted[dst] if p == src and k == "recv"]
            assert sends == recvs == [x.tag for x in msgs if x.src == src]


@pytest.mark.parametrize("schedule,microbatches,tag0,simulated,prepost",
                         [pytest.param("1f1b", 2, True, False, True, marks=pytest.mark.slow),
                          ("gpipe", 4, True, False, True), ("1f1b", 4, False, False, True),
                          ("1f1b", 4, True, True, False)])
def test_ranks_run_the_schedule_with_tag0_and_match_unplaced(schedule, microbatches, tag0,
                                                             simulated, prepost, monkeypatch):
    # simulated: with a cluster, the ranks run the order the simulator ran;
    # not prepost: receives posted as NCCL ranks post them
    monkeypatch.setenv("PLACER_P2P_PREPOST", "1" if prepost else "0")
    from placer.runtime.dist import launch
    from placer.runtime.run import RUNTIME_OPTIONS
    from placer.runtime.order import for_plan
    model, inputs = branchy_build()
    graph = placer.trace(model, inputs)
    out, loss, grads = reference(model, inputs)
    plan = _branchy_plan(microbatches, schedule)
    routes = _routes(branchy_build, plan)
    cluster = _cluster(["a", "b", "c"]) if simulated else None
    sched = for_plan(routes, plan, True, graph, cluster, RUNTIME_OPTIONS)
    if simulated:
        assert sched.orders != build(routes, schedule, True).orders
    result = launch(plan, branchy_build, steps=1, warmup=0, timeout=120, p2p_tag0=tag0,
                    cluster=cluster)
    assert result["p2p_tag0"] is tag0
    assert result["schedule"] == sched.name
    _check_ranks(result, sched)
    if not prepost:
        # every rank posted each pair's messages exactly in the sequence
        for (a, b), msgs in sched.pairs.items():
            for me, peer in ((a, b), (b, a)):
                assert [t for p, t, _k in result["posted"][me] if p == peer] == \
                    [x.tag for x in msgs]
    torch.testing.assert_close(result["outputs"], out, atol=1e-5, rtol=1e-4)
    assert abs(result["loss"] - loss) < 1e-5
    assert set(result["gradients"]) == set(grads)
    for name, g in grads.items():
        torch.testing.assert_close(result["gradients"][name], g, atol=1e-5, rtol=1e-4)


def _piece_orders(graph, routes, sched):
    """The schedule's orders as (kind, microbatch, piece), the loss left out
    (the simulator charges it to the last op's tasks)."""
    return {d: [(k, m, i.piece) for k, m, i in o if i != routes.sink]
            for d, o in sched.orders.items()}


def _cluster(devs):
    """Devices of unequal speed: orders that depend on durations differ."""
    return placer.Cluster.from_rules(
        "c", [placer.Device(d, 1e10 * (1 + k), 1e10) for k, d in enumerate(devs)],
        default=(1e9, 1e-5))


@pytest.mark.parametrize("stages,microbatches,schedule", [(2, 4, "1f1b"), (3, 4, "1f1b"),
                                                         (3, 3, "gpipe"), (3, 6, "1f1b")])
def test_the_runtime_schedule_is_the_simulators_order(stages, microbatches, schedule):
    from placer.cost.problem import Problem
    from placer.cost.simulator import executed_orders
    from placer.runtime.dist import reference_plan
    from placer.runtime.order import for_plan
    build_fn = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=6)
    model, inputs = build_fn()
    graph = placer.trace(model, inputs)
    devs = ["a", "b", "c"][:stages]
    plan = reference_plan(graph, devs, microbatches, schedule)
    cluster = _cluster(devs)
    routes = _routes(build_fn, plan)
    sched = for_plan(routes, plan, True, graph, cluster)
    _check_schedule(routes, sched)
    assert sched.name == schedule
    # the same tasks in the same order as the simulation ran them
    sim = executed_orders(Problem(graph, cluster), plan)
    ours = _piece_orders(graph, routes, sched)

    def last_segments(seq):
        # (kind, microbatch) of each device's tasks where the last of its
        # segments ran (a piece runs whole once every input is there)
        last = {}
        for k, (kind, m, ops) in enumerate(seq):
            for p in sorted({piece_of[(d, o)] for o in ops if (d, o) in piece_of},
                            reverse=kind == "B"):
                last[(kind, m, p)] = (k, p if kind == "F" else -p)
        return sorted(last, key=last.get)
    piece_of = {}
    by_fx = {op.extra.get("fx", op.id): op.id for op in graph}
    for p in routes.split.pieces:
        for n in p.module.graph.nodes:
            if n.name in by_fx and n.op in ("call_module", "call_function", "call_method"):
                for d in p.group:
                    piece_of[(d, by_fx[n.name])] = p.index
    for d in devs:
        assert last_segments(sim[d]) == ours[d], d
    # durations matter: the rule played with node counts orders differently
    # somewhere, so the simulator's order is not a coincidence
    if stages == 2:
        assert build(routes, schedule, True).orders != sched.orders
    assert _nccl_streams_progress(sched)


def test_simulator_orders_map_onto_op_level_plans():
    from placer.cost.problem import Problem
    from placer.cost.simulator import executed_orders
    from placer.runtime.order import for_plan
    from placer.schedule import from_simulation
    model, inputs = branchy_build()
    graph = placer.trace(model, inputs)
    mapped = 0
    for mb, sch in [(2, "1f1b"), (4, "1f1b"), (4, "gpipe")]:
        plan = _branchy_plan(mb, sch)
        routes = _routes(branchy_build, plan)
        cluster = _cluster(["a", "b", "c"])
        got = from_simulation(routes, graph, executed_orders(Problem(graph, cluster), plan),
                              sch, True)
        sched = for_plan(routes, plan, True, graph, cluster)
        _check_schedule(routes, sched)
        if got is not None:
            mapped += 1
            assert got.orders == sched.orders
    assert mapped >= 2


@pytest.mark.parametrize("key", ["gnmt", "inception"])
def test_ranks_run_the_simulators_order_for_op_level_plans(key):
    # scattered and branch-split plans: split_module renames the nodes
    # inside a piece, so the pieces are matched to the simulated tasks by
    # the traced names they keep (Piece.nodes); at the runtime's
    # granularity every task maps onto a piece
    from placer.bench.fidelity import MODELS, random_plans
    from placer.runtime.run import RUNTIME_OPTIONS
    from placer.runtime.order import for_plan
    build_fn = MODELS[key].build
    model, inputs = build_fn()
    graph = placer.trace(model, inputs)
    cluster = _cluster(["r0", "r1"])
    for plan in random_plans(graph, ["r0", "r1"], 8, 0):
        _g, plan, sp, _inputs, rows = prepare(model, plan, inputs, graph=graph)
        routes = Routes(sp, rows, sink_device(sp))
        sched = for_plan(routes, plan, True, graph, cluster, RUNTIME_OPTIONS)
        assert sched.source == "simulator"
        _check_schedule(routes, sched)


def test_a_schedule_travels_as_plain_values():
    import pickle
    from placer.schedule import from_orders, plain
    routes = _routes(branchy_build, _branchy_plan(4))
    sched = build(routes, "1f1b", True)
    data = pickle.loads(pickle.dumps(plain(sched)))
    again = from_orders(_routes(branchy_build, _branchy_plan(4)), data, True)
    assert again.orders == sched.orders and again.pairs == sched.pairs
    assert again.caps == sched.caps and again.name == sched.name


def test_a_rank_leaving_the_sequence_is_one_clear_error():
    from placer.errors import PlanError
    from placer.runtime.dist import DistTransport
    t = DistTransport({"a": 0, "b": 1}, "a", torch.device("cpu"), "gloo", tag0=True)
    # the step's sequence with b: a sends message 0, then receives message 3
    t.begin({"b": [(0, True, (2,), torch.float32), (3, False, (2,), torch.float32)]})
    with pytest.raises(PlanError, match="out of the schedule's order"):
        t.recv((2,), torch.float32, "b", "a", 3)      # before a sent message 0
    assert t.tag0 and t._wire(7) == 0

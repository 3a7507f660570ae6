"""What a ``calibrate=True`` rank run measures besides its steps, and how the
ranks' measurements become the graph, cluster and options the prediction
is made on: rounds of microbenchmarks (:func:`calibration_round`: links,
core shares, op times, message and resume costs), their medians over ranks
and rounds (:func:`combine_calibration`), and the :class:`Reference`
pipeline whose measured over predicted step scales the prediction
(:func:`reference_factor`). The rank loop (:mod:`placer.runtime.rank_loop`)
calls them; see :func:`placer.runtime.rank_loop.run_rank` for when."""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict

import torch
import torch.distributed as dist

from ..schedule import build as build_schedule
from .engine import Engine, Routes
from .common import RUNTIME_OPTIONS, prepare, sink_device
from .transport import DistTransport, start_step
from .waiting import wait_work


#: calibration rounds a ``calibrate=True`` run interleaves with its steps
CALIBRATION_ROUNDS = 3


def calibration_round(model, example_inputs, graph, tdev, loss_fn=None,
                       spin: bool = False, work=None, transport=None, devs=()) -> dict:
    """Collective: one round of microbenchmarks on every rank: the links
    between ranks, the share of a core each rank gets while all compute,
    every op's time on this rank's device (one rank at a time), how much
    slower the same ops ran with every rank timing them at once
    (``ops_together``), what a message costs each end (fixed and per byte,
    :func:`_message_costs`), what a chunk of the model loses after a
    wait (:func:`placer.runtime.profile.resume_cost`) and what the model
    costs run as the runtime's pieces (``pieces``,
    :func:`placer.runtime.piece_costs.measure_pieces`, in the same turn as
    the op times)."""
    from ..cluster import Cluster, Device
    from .piece_costs import measure_pieces
    from .profile import allreduce_sizes, measure_links, profile, resume_cost
    links = measure_links(dist.get_world_size(), dist.get_rank(), repeats=5, spin=spin,
                          allreduce_sizes=allreduce_sizes(sum(op.param_bytes for op in graph)))
    sync = _sync_delays(links["pairs"], transport, list(devs))
    messages, copy_rate = (_message_costs(transport, list(devs)) if transport is not None
                           else (0.0, float("inf")))
    name = str(tdev)
    here = Cluster.from_rules("here", [Device(name, 1e11, 1e10)], default=(1e9, 1e-4))
    share_one, share_all, rate_before = core_shares(tdev, 0.1, work)
    resume = resume_cost(work)
    # op times one rank at a time (the median repeat: an op's typical speed
    # at a whole core; the time slices it loses are the shares')
    for turn in range(dist.get_world_size()):
        dist.barrier()
        if turn == dist.get_rank():
            timed, cal = profile(model, example_inputs, graph=graph, cluster=here,
                                 devices=[name], repeats=3, warmup=1, loss_fn=loss_fn,
                                 share=1.0)
            pieces = measure_pieces(model, example_inputs, graph, tdev,
                                    loss_fn=None if loss_fn is False else loss_fn)
    dist.barrier()
    # and every rank at once: how much slower the same ops run while the
    # others compute too (caches, memory, a virtual machine's siblings)
    _, cal_all = profile(model, example_inputs, graph=graph, cluster=here, devices=[name],
                         repeats=3, warmup=1, loss_fn=loss_fn, share=1.0, tasks=False)
    dist.barrier()
    # the work's rate after the op times too: the host's speed drifts within
    # a round (see speed_drift)
    rate_after = core_shares(tdev, 0.05, work)[2]
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
            "probe_rate": (rate_before + rate_after) / 2, "pieces": pieces}


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


def core_shares(tdev, seconds: float, work=None) -> tuple[float, float, float]:
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


def combine_calibration(rounds: list[dict], graph, devs: list[str], tdev,
                         shares: list = (), between: list = ()) -> dict | None:
    """Collective: rank 0 gets the calibrated graph and cluster (medians over
    every round of every rank: the ranks' devices are alike); None elsewhere."""
    from ..cluster import Device
    from .piece_costs import fit_piece_costs, scale_graph
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
    heavy: dict = defaultdict(list)        # the message plan's (Reference kind "messages")
    alone: dict = defaultdict(list)        # the one-device plan's (kind "one")
    for _, _, part in gathered:
        for r in part:
            kept = {"messages": heavy, "one": alone}.get(r.get("kind"), reference)
            kept[r["device"]].append(r)
    # the ring runs at the speed of its slowest link and its worst latency,
    # as the cluster below states them (synchronisation delay included)
    efficiency = collective_efficiency(
        allreduce, min((v["bandwidth"] for v in pairs.values()), default=float("inf")),
        max((v["latency"] + v["sync_delay"] for v in pairs.values()), default=0.0), len(devs),
        sizes=allreduce_sizes(sum(op.param_bytes for op in graph)))
    from ..cluster import Cluster
    one = Cluster("here", [dev], [[float("inf")]], [[0.0]])
    cgraph = calibrated_graph(timed, one, name, overhead=ovh)
    # what the runtime's pieces cost against the ops' times (see piece_costs)
    runs = _median_pieces(every)
    scale, task = fit_piece_costs(cgraph, dev, runs, {**RUNTIME_OPTIONS, "op_overhead": ovh},
                                  task)
    if scale != 1.0:
        cgraph, ovh = scale_graph(cgraph, scale), ovh * scale
    for d in (dev, shared):
        d.extra["op_overhead"], d.extra["task_overhead"] = ovh, task
    return {"graph": cgraph, "compute_scale": scale, "pieces": runs,
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
            "reference_messages_step": max((med(x for r in v for x in r["step"])
                                            for v in heavy.values()), default=None),
            # the rank that computes is the slowest
            "reference_one_step": max((med(x for r in v for x in r["step"])
                                       for v in alone.values()), default=None),
            # every reference step, for a later look at how they spread
            "reference_samples": {kind: {d: {k: [x for r in v for x in r[k]]
                                             for k in ("compute", "step")}
                                         for d, v in steps.items()}
                                  for kind, steps in (("pipeline", reference),
                                                      ("messages", heavy), ("one", alone))},
            "rounds": len(every),
            "links": {f"{devs[i]}-{devs[j]}": v for (i, j), v in pairs.items()},
            "allreduce": allreduce}


def _median_pieces(rounds: list[dict]) -> list[dict]:
    """Per plan of :func:`placer.runtime.piece_costs.piece_plans`, the
    median compute over every round that timed the pieces ([] if none)."""
    runs = [r["pieces"] for r in rounds if r.get("pieces")]
    if not runs:
        return []
    return [{"compute": statistics.median(r[k]["compute"] for r in runs),
             "tasks": runs[0][k]["tasks"]} for k in range(len(runs[0]))]


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
    from .piece_costs import segments_plan
    return segments_plan(graph, devs, len(devs), microbatches, schedule)


def one_device_plan(graph, devs: list[str]):
    """The whole graph on ``devs[0]``, one microbatch: a plan that sends
    nothing, on which :func:`reference_factor` can fit the compute alone."""
    from ..plan import Plan
    return Plan({op: [devs[0]] for op in graph.ids})


#: segments of :func:`message_plan` (at most; one per op of a smaller graph)
MESSAGE_SEGMENTS = 16


def message_plan(graph, devs: list[str], microbatches: int, schedule: str = "1f1b"):
    """The graph's topological order cut into :data:`MESSAGE_SEGMENTS` equal
    runs placed on ``devs`` in turn (colocated ops follow the first of their
    group): a plan whose step sends many messages (each cut, each way, each
    microbatch), whose measured step :func:`reference_factor` adds to the
    pipeline's so that many messages weigh in the factor (see
    :class:`Reference`)."""
    from .piece_costs import segments_plan
    runs = max(1, min(MESSAGE_SEGMENTS, len(graph)))
    return segments_plan(graph, devs, runs, microbatches, schedule)


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

    def __init__(self, engine: Engine, plan, inputs, offsets, me: str, kind: str = "pipeline"):
        self.engine, self.plan, self.inputs, self.offsets, self.me = \
            engine, plan, inputs, offsets, me
        self.kind = kind
        self.warm = False

    @classmethod
    def build(cls, model, example_inputs, graph, plan, devs, me, tdev, transport, *,
              loss_fn, loss_reduction: str, seed: int,
              kind: str = "pipeline") -> "Reference | None":
        """The reference engine on this rank, or None (every rank agrees) when
        the pipeline would need a collective the transport has no group for.
        ``kind``: ``"pipeline"`` (:func:`reference_plan`), ``"messages"``
        (:func:`message_plan`, which the factor is fitted on beside the pipeline)
        or ``"one"`` (:func:`one_device_plan`, the plan the compute is
        fitted on)."""
        if kind == "one":
            ref = one_device_plan(graph, devs)
        else:
            make = message_plan if kind == "messages" else reference_plan
            ref = make(graph, devs, plan.microbatches, plan.schedule)
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
        return cls(engine, ref, inputs, offsets, me, kind)

    def run(self, steps: int, spin: bool, targets=None) -> dict:
        """Collective: ``steps`` reference steps (one more the first time, to
        warm up); returns this rank's compute and step seconds per step."""
        compute, elapsed = [], []
        for k in range(steps + (0 if self.warm else 1)):
            for p in self.engine.parameters():
                p.grad = None
            start, _cpu = start_step(self.engine, spin)
            last, _ = self.engine.train_step(self.inputs, targets, self.offsets, training=True)
            if self.warm or k > 0:
                elapsed.append(time.perf_counter() - start)
                compute.append(last["stats"].compute.get(self.me, 0.0))
        self.warm = True
        return {"device": self.me, "compute": compute, "step": elapsed, "kind": self.kind}


#: bounds of :func:`reference_factor` (one outside them is a broken measurement)
REFERENCE_FACTOR_BOUNDS = (0.67, 1.5)


def reference_factor(calibration: dict, ref_plan, options: dict,
                     messages_plan=None, one_plan=None) -> float:
    """Fit the prediction to the :class:`Reference` plans measured beside
    the steps, in two parts, and return the factor a multi-rank prediction
    is multiplied by:

    1. compute, with ``one_plan`` (:func:`one_device_plan`) and its measured
       step (``calibration["reference_one_step"]``): every op's time and
       the launch and task costs are scaled until that plan's predicted
       step is the measured one (``reference_compute_factor``, within
       :data:`REFERENCE_FACTOR_BOUNDS`); the devices' shares of a core
       stay as the calibration rounds measured them.
       Without: the ranks' measured compute in the reference steps (summed)
       over the simulator's (messages costing nothing) scales every op's time
       and the launch and task costs (``reference_compute_factor``, within
       :data:`REFERENCE_FACTOR_BOUNDS`): ``calibration["graph"]`` is
       replaced by the scaled graph, its and ``options``' launch and task
       costs scaled in place; above 1, no more than lets the reference's
       predicted step (messages at their measured cost) reach the measured
       one (over a shaped link the ranks' compute holds transport work);
    2. the rest: the measured over the predicted step of the pipeline and,
       with ``messages_plan`` (the :func:`message_plan` measured beside it,
       ``calibration["reference_messages_step"]``), of both summed, within
       :data:`REFERENCE_FACTOR_BOUNDS`. Messages cost what the calibration
       rounds measured (``message_overhead``, ``message_copy_rate``).

    Why the message plan: the pipeline sends a few messages a step (one
    cut) and its step is short, so a slow moment of the host decided the
    factor alone; summed with the message plan's longer step of many
    messages, it weighs less.

    Why no fitted cost per message: a cost added to every message end
    until both plans' steps were predicted (as earlier versions fitted
    it) took over what a shaped link loses on the message plan's large
    messages (0.24-0.6 ms a message end over ``tc tbf`` for gpt and moe)
    and charged it to every small message: moe over ``tbf``'s plans of
    4-8 microbatches were predicted 1.3-1.6x their step (90th-percentile
    error 36-48%, that fit on four full fidelity runs' kept
    measurements). Predicted again from the
    kept measurements of five runs (40 cases), all four targets held in
    33 with the factor alone against 28 with the fitted message cost;
    the 90th-percentile error of moe over ``tbf`` fell to 17-27%. Fitted
    instead as a bandwidth scale, a cost per byte or time lost after a
    wait (``resume_overhead``), the extra did no better.

    Why the one-device plan: the ranks' compute in a pipeline's step
    holds more than the ops (two ranks computing at once, a message's work
    done inside a task): fitted on it, inception over loopback's compute
    was scaled 1.20 and its one-device plans predicted 20% slow, where
    their own step was predicted within 1% unscaled.

    Why the shares are not fitted too: slowing the shared core until the
    pipeline ranks' measured compute was predicted (``cpu_share_all``
    divided by 1 to 1.5) reached its bound in 4 of 8 cases at the default
    priority, and plans of 2-4 microbatches, which overlap most, were
    predicted up to 1.4x their step.

    Why two parts: the compute a step measures and the rest of a
    multi-rank step are off by different amounts (gnmt over loopback:
    compute 0.69 of the predicted, the step 0.97), and the one-device plan
    fits the first without any of the second.
    A calibration it was applied to already (``reference_compute_factor``
    set) keeps its graph and costs: the same options and factor again.
    Records the factors, the raw ratio, the predicted steps and
    each rank's predicted compute in ``calibration``."""
    from .contention import predict_shared
    measured = calibration.get("reference_step")
    lo, hi = REFERENCE_FACTOR_BOUNDS
    graph, cluster, factor_c = _fit_compute(calibration, ref_plan, options, one_plan)
    heavy = calibration.get("reference_messages_step") if messages_plan is not None else None
    report = predict_shared(graph, cluster, ref_plan, **options)
    more = predict_shared(graph, cluster, messages_plan, **options).step_time if heavy else 0.0
    both = report.step_time + more
    raw = (measured + (heavy or 0.0)) / both if measured and both > 0 else 1.0
    factor = min(hi, max(lo, raw))
    calibration.update(reference_factor=factor, reference_factor_raw=raw,
                       reference_compute_factor=factor_c,
                       reference_predicted=report.step_time,
                       reference_messages_predicted=more if heavy else None,
                       reference_compute_predicted=dict(_compute_bars(report)))
    return factor


def _fit_compute(calibration: dict, ref_plan, options: dict, one_plan=None):
    """Part 1 of :func:`reference_factor`: scale the calibration's compute
    in place; returns the graph, the cluster and the compute factor the
    prediction goes on with."""
    from .contention import predict_shared
    measured = calibration.get("reference_step")
    graph, cluster = calibration["graph"], calibration["cluster"]
    lo, hi = REFERENCE_FACTOR_BOUNDS
    compute = calibration.get("reference_compute") or {}
    # a calibration fitted before holds its scaled graph and costs already
    factor_c = calibration.get("reference_compute_factor", 1.0)
    if "reference_compute_factor" in calibration:
        return graph, cluster, factor_c
    quiet = {**options, "message_overhead": 0.0, "message_copy_rate": math.inf}
    alone = calibration.get("reference_one_step") if one_plan is not None else None
    if alone:
        factor_c = _solve(lambda x: _scaled_step(graph, cluster, one_plan, options, x),
                          alone, lo, hi, rounds=16)
        graph = _scale_compute(calibration, options, factor_c)
    elif measured and compute:
        bars = _compute_bars(predict_shared(graph, cluster, ref_plan, **quiet))
        predicted_c = sum(bars.get(d, 0.0) for d in compute)
        if predicted_c > 0:
            factor_c = min(hi, max(lo, sum(compute.values()) / predicted_c))
            if factor_c > 1.0:
                factor_c = _solve(lambda x: _scaled_step(graph, cluster, ref_plan, options, x),
                                  measured, 1.0, factor_c, rounds=12)
            graph = _scale_compute(calibration, options, factor_c)
    return graph, cluster, factor_c


#: the options a compute factor scales with the ops' times
_COMPUTE_COSTS = ("op_overhead", "task_overhead")


def _scaled_step(graph, cluster, plan, options: dict, scale: float) -> float:
    """``plan``'s predicted step with every op's time and the launch and
    task costs ``scale`` times as long."""
    from .contention import predict_shared
    from .piece_costs import scale_graph
    opts = {k: v * scale if k in _COMPUTE_COSTS and v else v for k, v in options.items()}
    return predict_shared(scale_graph(graph, scale), cluster, plan, **opts).step_time


def _scale_compute(calibration: dict, options: dict, factor: float):
    """Scale ``calibration``'s graph and its and ``options``' launch and
    task costs by ``factor`` in place; returns the scaled graph."""
    from .piece_costs import scale_graph
    graph = calibration["graph"] = scale_graph(calibration["graph"], factor)
    for key in _COMPUTE_COSTS:
        if options.get(key):
            options[key] = options[key] * factor
        if calibration.get(key):
            calibration[key] = calibration[key] * factor
    return graph


#: what :func:`reference_factor` records in a calibration
FIT_KEYS = ("reference_factor", "reference_factor_raw", "reference_compute_factor",
            "reference_share_factor",
            "reference_message_extra", "reference_predicted", "reference_messages_predicted",
            "reference_compute_predicted")


def unfitted(calibration: dict) -> dict:
    """A copy of ``calibration`` as it was before :func:`reference_factor`
    fitted it: the graph's op times and the launch and task costs divided
    by ``reference_compute_factor``, the devices' ``cpu_share_all`` times
    ``reference_share_factor``, the fit's records dropped (the message
    cost's extra was only ever in the options); an unfitted
    calibration is copied as it is. The graph stays a dict or a
    :class:`~placer.graph.Graph`, as given.

    Why: rank 0 fits the calibration on the reference steps run beside
    the calibrating burst; to fit it again on other measurements of the
    references (``placer bench fidelity`` measures them as plans), the
    first fit must go, or its compute factor stays (inception over ``tbf``:
    beside steps of 55 ms in a slow phase left a compute factor of 1.26
    that every later fit kept, so one-device plans were predicted 38-59%
    slow)."""
    from ..cluster import Cluster
    from ..graph import Graph
    from .contention import slower_together
    from .piece_costs import scale_graph
    out = {k: v for k, v in calibration.items() if k not in FIT_KEYS}
    factor = calibration.get("reference_compute_factor")
    if factor and factor != 1.0:
        out["graph"] = _in_form(calibration["graph"], Graph,
                                lambda g: scale_graph(g, 1.0 / factor))
        for key in _COMPUTE_COSTS:
            if out.get(key):
                out[key] = out[key] / factor
    share = calibration.get("reference_share_factor")
    if share and share != 1.0:
        out["cluster"] = _in_form(calibration["cluster"], Cluster,
                                  lambda c: slower_together(c, 1.0 / share))
    return out


def _in_form(value, kind, change):
    """``change`` applied to a graph or cluster ``value`` (an object of
    ``kind`` or its dict), returned in the form it was given."""
    as_dict = isinstance(value, dict)
    out = change(kind.from_dict(value) if as_dict else value)
    return out.to_dict() if as_dict else out


def _compute_bars(report) -> dict:
    """Per device, the seconds of a report's forward and backward bars."""
    out: dict = defaultdict(float)
    for e in report.events():
        if e.category in ("forward", "backward"):
            out[e.lane] += e.duration
    return out


def _solve(step, target: float, lo: float, hi: float, rounds: int = 24) -> float:
    """The ``x`` in ``[lo, hi]`` where the increasing ``step(x)`` reaches
    ``target`` (bisection; the nearer end when it lies outside)."""
    if step(lo) >= target:
        return lo
    if step(hi) <= target:
        return hi
    for _ in range(rounds):
        mid = (lo + hi) / 2
        if step(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


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


def calibration_line(calibration: dict) -> str:
    """One line on how a calibrated prediction was made: the simulator's
    step, the reference pipeline's factor, what the fit on the reference
    plans changed (see :func:`reference_factor`), and how much slower the host ran
    around the steps than around the op timings (``speed_drift``, not
    applied)."""
    line = (f"calibrated: simulator {calibration['predicted_model'] * 1e3:.2f} ms"
            f" x reference factor {calibration.get('reference_factor', 1.0):.2f}")
    fitted = []
    if calibration.get("reference_compute_factor") not in (None, 1.0):
        fitted.append(f"op times x{calibration['reference_compute_factor']:.2f}")
    if fitted:
        line += f" (fitted on the reference plans: {', '.join(fitted)})"
    drift = calibration.get("speed_drift")
    if drift is not None:
        line += (f"; the model's work took {drift:.2f}x as long around the steps as in the "
                 "calibration rounds (speed_drift, not applied)")
    return line

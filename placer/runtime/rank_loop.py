"""One rank's share of a plan (:func:`run_rank`): the rank loop of
:mod:`placer.runtime.dist`. Every rank prepares the whole split, agrees
with the others on the schedule, steps its own pieces with
:class:`placer.runtime.transport.DistTransport` and, with
``calibrate=True``, interleaves the calibration of
:mod:`placer.runtime.calibration` with its steps; rank 0 gathers and merges
the results and the prediction."""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from ..schedule import from_orders as schedule_from_orders
from ..schedule import plain as schedule_plain
from .calibration import (CALIBRATION_ROUNDS, Reference, calibrated_options, calibration_round,
                          combine_calibration, core_shares, reference_factor)
from .devices import cpu_fallback_line, gpu_named
from .engine import Engine, Routes
from .order import for_plan
from .ranks import pinned_cores, rank_devices, this_rank
from .common import (RUNTIME_OPTIONS, MeasuredReport, build_optimizer, default_loss,
                     join_outputs, predict, prepare, sink_device)
from .status import STATUS, inject_fault
from .steps import Measured, Step, run_steps, timed_step
from .transport import DistTransport, gather_to_first, start_step
from .waiting import (TRANSPORT_THREADS, KeepAwake, busy_poll_default, demote_threads,
                      quick_handover, wait_work)


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
    setup = _set_up(model, plan, example_inputs, graph=graph, cluster=cluster, device=device,
                    training=training, busy_poll=busy_poll, p2p_tag0=p2p_tag0)
    try:
        return _run_set_up(setup, model, optimizer, loss_fn, targets, example_inputs,
                           cluster=cluster, training=training, loss_reduction=loss_reduction,
                           problem_options=problem_options, seed=seed, calibrate=calibrate,
                           steps=steps, warmup=warmup)
    finally:
        setup.transport.close()


def _run_set_up(setup: "RankSetup", model, optimizer, loss_fn, targets, example_inputs, *,
                cluster, training: bool, loss_reduction: str, problem_options, seed: int,
                calibrate: bool, steps: int, warmup: int) -> dict | None:
    """:func:`run_rank` once this rank is set up."""
    hook = (RankCalibration(model, example_inputs, setup, loss_fn, targets)
            if calibrate else None)
    order_on = (setup.graph, cluster, {**RUNTIME_OPTIONS, **(problem_options or {})})
    if hook is not None:
        # the first round before the schedule: the ranks then run the order
        # the prediction's simulator assumes on what they measured, not the
        # dispatch rule's (no cluster is known before)
        order_on = hook.first_round(problem_options) or order_on
    sched = _agree_schedule(setup, training, order_on)
    engine, opt = _build_engine(setup, sched, model, optimizer, loss_fn, loss_reduction,
                                training, seed)
    if hook is not None:
        hook.prepare_steps(engine, setup.plan, steps, warmup, training, loss_fn,
                           loss_reduction, seed)
    measured = _measured_steps(setup, engine, opt, steps, warmup, training, targets, hook)
    mine = _rank_figures(setup, engine, opt, measured, training)
    calibration = hook.combine() if hook is not None else None
    gathered = gather_to_first(mine)
    if gathered is None:
        return None
    prediction = _prediction(setup, cluster, problem_options, calibration,
                             hook.reference_plans() if hook is not None else None)
    return _merge(gathered, setup, sched, measured.figures.times, prediction, calibration)


class RankSetup(NamedTuple):
    """What a rank prepares before its schedule: the split plan, this rank's
    device (plan name, backend, torch device) among ``devs`` (rank order),
    whether it is a GPU-named device running on the CPU (``fallback``), the
    routes, whether it busy-polls (``spin``) and its transport."""

    graph: object
    plan: object
    split: object
    inputs: list
    mb_rows: list
    devs: list
    me: str
    backend: str
    tdev: torch.device
    fallback: bool
    routes: Routes
    spin: bool
    transport: DistTransport


def _set_up(model, plan, example_inputs, *, graph, cluster, device, training, busy_poll,
            p2p_tag0) -> RankSetup:
    graph, plan, sp, inputs, mb_rows = prepare(model, plan, example_inputs, graph=graph,
                                               training=training)
    devs = rank_devices(plan, cluster)
    me, backend, tdev = this_rank(devs, cluster, device)
    if tdev.type == "cuda":
        torch.cuda.set_device(tdev)      # NCCL's collectives run on this device
    fallback = tdev.type == "cpu" and gpu_named(me, cluster)
    routes = Routes(sp, mb_rows, sink_device(sp))
    spin = busy_poll if busy_poll is not None else busy_poll_default(
        pinned_cores() is not None, tdev.type, backend)
    transport = DistTransport({d: i for i, d in enumerate(devs)}, me, tdev, backend, spin=spin,
                              tag0=p2p_tag0)
    return RankSetup(graph, plan, sp, inputs, mb_rows, devs, me, backend, tdev, fallback,
                     routes, spin, transport)


def _agree_schedule(setup: RankSetup, training: bool, order_on: tuple):
    """Collective: the order the prediction assumes when a cluster is given
    (see :func:`placer.runtime.order.for_plan`): rank 0's, sent to all (every
    rank would compute the same, but a simulation on a host of another CPU
    could break a near tie the other way)."""
    routes = setup.routes
    sched = for_plan(routes, setup.plan, training, *order_on) if dist.get_rank() == 0 else None
    if dist.get_world_size() > 1:
        shared = [schedule_plain(sched) if sched is not None else None]
        dist.broadcast_object_list(shared, src=0)
        sched = schedule_from_orders(routes, shared[0], training)
    return sched


def _build_engine(setup: RankSetup, sched, model, optimizer, loss_fn, loss_reduction: str,
                  training: bool, seed: int) -> tuple:
    """Collective (the all-reduce groups): this rank's engine and optimizer."""
    mb_rows, me, tdev, transport = setup.mb_rows, setup.me, setup.tdev, setup.transport
    batch = sum(mb_rows)
    weights = [(n / batch if loss_reduction == "mean" else 1.0) for n in mb_rows]
    order = [(me, t) for t in sched.orders.get(me, [])]
    engine = Engine(setup.split, setup.routes, {d: tdev for d in setup.devs}, [me], transport,
                    training=training, loss_fn=loss_fn or default_loss, loss_weights=weights,
                    order=order, model=model, seed=seed, schedule=sched)
    engine.bucket_bytes = (getattr(setup.plan, "allreduce", None) or {}).get("bucket_bytes")
    transport.make_groups(engine.holders.values())
    if setup.spin:
        # gloo's socket threads must not take the core from the rank while the
        # rank holds a pair's lock (see waiting.demote_threads)
        demote_threads(TRANSPORT_THREADS)
    opt = build_optimizer(optimizer, engine.parameters()) if training else None
    return engine, opt


def _measured_steps(setup: RankSetup, engine, opt, steps: int, warmup: int, training: bool,
                    targets, hook: "RankCalibration | None") -> Measured:
    """The shared step loop (:func:`placer.runtime.steps.run_steps`) on this
    rank: each step starts at the step barrier and lasts as long as the
    slowest rank's; calibration (``hook``) runs before the steps it chose."""
    mb_rows, spin = setup.mb_rows, setup.spin
    offsets = [sum(mb_rows[:m]) for m in range(len(mb_rows))]
    params = engine.parameters()
    rank = dist.get_rank()

    def before(index: int) -> None:
        if hook is not None:
            hook.before_step(index)
        STATUS.set(f"step {index}")
        inject_fault(rank, index)

    def step(keep_gradients: bool) -> Step:
        done = timed_step(engine, params, [setup.tdev], setup.transport, setup.inputs, targets,
                          offsets, training=training, optimizer=opt,
                          keep_gradients=keep_gradients, start=lambda: start_step(engine, spin))
        elapsed = torch.tensor([done.seconds], dtype=torch.float64)
        with STATUS.wait(None, "the step's end"):
            wait_work(dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, async_op=True), spin)
        return done._replace(seconds=float(elapsed))

    cores = sorted(os.sched_getaffinity(0)) if spin and hasattr(os, "sched_getaffinity") \
        else []
    with KeepAwake(cores), quick_handover():
        return run_steps(steps, warmup, step, engine, setup.transport, before)


def _rank_figures(setup: RankSetup, engine, opt, measured: Measured, training: bool) -> dict:
    """What this rank sends rank 0: its figures, outputs, gradients and
    weights, the tasks and messages of its last step."""
    me, tdev, figures, last = setup.me, setup.tdev, measured.figures, measured.last
    if tdev.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(tdev))
    else:
        state = 0.0
        if opt is not None:
            for p in engine.parameters():
                for v in opt.state.get(p, {}).values():
                    if isinstance(v, torch.Tensor):
                        state += v.numel() * v.element_size()
        pbytes = engine.param_bytes().get(me, 0.0)
        peak = pbytes * (2 if training else 1) + state + figures.peak_act.get(me, 0.0)
    # the last step was a measured one: its tasks and messages
    executed = [(k, m, i.piece, i.replica) for _d, (k, m, i) in engine.executed]
    return {"device": me, "loss": last["loss"], "losses": figures.losses,
            "outputs": (join_outputs(setup.split, last["outputs"]) if last["outputs"]
                        else None),
            "gradients": measured.gradients, "parameters": engine.state(),
            "compute": figures.compute.get(me, 0.0), "comm": figures.comm.get(me, 0.0),
            "peak": peak, "cpu_time": figures.cpu,
            "events": [dataclasses.astuple(e) for e in figures.timeline],
            "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None, "executed": executed, "posted": list(setup.transport.log),
            "cpu_fallback": setup.fallback}


def _prediction(setup: RankSetup, cluster, problem_options, calibration, references):
    """Rank 0's prediction of the plan's step: on the calibrated graph and
    cluster, scaled by the reference factor (fitted on ``references``,
    :meth:`RankCalibration.reference_plans`), when calibrated; else the
    simulator's on ``cluster``; None without either."""
    plan = setup.plan
    if calibration is not None:
        from .contention import predict_shared
        options = {**calibrated_options(calibration), **(problem_options or {})}
        # the factor's fit scales the calibrated graph and options (see there)
        pipeline, messages, one = references or (None, None, None)
        factor = (reference_factor(calibration, pipeline, options, messages, one)
                  if pipeline is not None else 1.0)
        cg, cc = calibration["graph"], calibration["cluster"]
        prediction = predict_shared(cg, cc, plan, **options)
        calibration["predicted_model"] = prediction.step_time   # before the factor
        prediction.step_time *= factor
        calibration["cpu_shares"] = prediction.extra["cpu_shares"]
        return prediction
    if cluster is not None:
        return predict(setup.graph, cluster, plan, problem_options)
    return None


def _merge(gathered: list, setup: RankSetup, sched, times: list, prediction,
           calibration) -> dict:
    """Rank 0: every rank's part merged into :func:`run_rank`'s result."""
    merged = {"loss": None, "losses": [], "outputs": None, "gradients": {}, "parameters": {}}
    for part in gathered:
        if part["loss"] is not None:
            merged["loss"], merged["losses"] = part["loss"], part["losses"]
        if part["outputs"] is not None:
            merged["outputs"] = part["outputs"]
        for key in ("gradients", "parameters"):
            for k, v in part[key].items():
                merged[key].setdefault(k, v)
    if calibration is not None:
        merged["calibration"] = {**calibration, "graph": calibration["graph"].to_dict(),
                                 "cluster": calibration["cluster"].to_dict()}
    step_time = statistics.median(times)
    busy = {p["device"]: p["compute"] + p["comm"] for p in gathered}
    used = sched.name
    report = MeasuredReport(step_time=step_time, peak_memory={p["device"]: p["peak"]
                                                              for p in gathered},
                            busy=busy, compute={p["device"]: p["compute"] for p in gathered},
                            comm={p["device"]: p["comm"] for p in gathered},
                            idle={d: max(0.0, step_time - b) for d, b in busy.items()},
                            model="measured", microbatches=len(setup.mb_rows), schedule=used,
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
    # dispatch rule's ("rule"; see placer.runtime.order.for_plan)
    merged["schedule_source"] = sched.source
    merged["executed"] = {p["device"]: p["executed"] for p in gathered}
    merged["posted"] = {p["device"]: p["posted"] for p in gathered}
    merged["p2p_tag0"] = setup.transport.tag0
    merged["backend"] = setup.backend
    fell_back = [p["device"] for p in gathered if p["cpu_fallback"]]
    if fell_back:
        # one line for the whole run; a GPU's prediction says nothing of a CPU's step
        print(cpu_fallback_line(fell_back), file=sys.stderr, flush=True)
        merged["report"]["predicted"] = None
        merged["report"]["cpu_fallback"] = fell_back
        merged["report"]["prediction_compared"] = False
    merged["cpu_fallback"] = fell_back
    merged["notes"] = list(setup.split.notes)
    return merged


class RankCalibration:
    """The calibration hook of a ``calibrate=True`` rank run (see
    :func:`run_rank`): a first round of :func:`placer.runtime.calibration.calibration_round`
    before the schedule, the others before measured steps spread over the
    run, and before every measured step the ranks' core shares and (several
    CPU ranks, training) one :class:`placer.runtime.calibration.Reference`
    step. Collective, like every method here."""

    def __init__(self, model, example_inputs, setup: RankSetup, loss_fn, targets):
        self.model, self.example_inputs, self.setup = model, example_inputs, setup
        self.loss_fn, self.targets = loss_fn, targets
        self.rounds, self.shares, self.between = [], [], []
        self.reference = self.messages = self.one = None
        self.rounds_before: set = set()
        self.warmup = 0
        # how much the ranks slow each other down is timed on the model's own ops
        from .profile import model_work
        probe = model_work(model, example_inputs, setup.tdev)
        agreed = torch.tensor([0.0 if probe is None else 1.0])
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)   # every rank times the same kind
        self.probe = probe if float(agreed) > 0 else None

    def round(self) -> None:
        """One calibration round (the steps' random numbers untouched)."""
        setup = self.setup
        STATUS.set("calibrating")
        rng = torch.get_rng_state()   # the steps draw the same numbers as without it
        with STATUS.wait(None, "calibration"):
            # a loss of (outputs, targets) is not timed: the profile runs
            # rows without their targets
            self.rounds.append(calibration_round(
                self.model, self.example_inputs, setup.graph, setup.tdev,
                loss_fn=self.loss_fn if self.targets is None else False, spin=setup.spin,
                work=self.probe, transport=setup.transport, devs=setup.devs))
        torch.set_rng_state(rng)

    def first_round(self, problem_options) -> tuple | None:
        """The round before the schedule; on rank 0 the ``(graph, cluster,
        options)`` the schedule is then made on (None elsewhere)."""
        setup = self.setup
        self.round()
        early = combine_calibration(self.rounds, setup.graph, setup.devs, setup.tdev)
        if early is None:
            return None
        return (early["graph"], early["cluster"],
                {**calibrated_options(early), **(problem_options or {})})

    def prepare_steps(self, engine, plan, steps: int, warmup: int, training: bool, loss_fn,
                      loss_reduction: str, seed: int) -> None:
        """Build the reference pipeline and choose the steps the other
        rounds run before."""
        setup = self.setup
        if training and dist.get_world_size() > 1 and setup.tdev.type == "cpu":
            refs = [Reference.build(
                self.model, self.example_inputs, setup.graph, plan, setup.devs, setup.me,
                setup.tdev, setup.transport, loss_fn=loss_fn or default_loss,
                loss_reduction=loss_reduction, seed=seed, kind=kind)
                for kind in ("pipeline", "messages", "one")]
            self.reference, self.messages, self.one = refs
        # the other calibration rounds interleaved with the measured steps, so
        # both sample the same load of a shared machine (the first ran before)
        chunk = -(-steps // min(CALIBRATION_ROUNDS, steps))
        self.rounds_before = {warmup + k for k in range(0, steps, chunk)} - {warmup}
        self.warmup = warmup

    def reference_plans(self) -> tuple:
        """The plans :func:`placer.runtime.calibration.reference_factor`
        fits on: the pipeline and the message plan (the factor) and the
        one-device plan (the compute), None for one not built."""
        return tuple(r.plan if r is not None else None
                     for r in (self.reference, self.messages, self.one))

    def before_step(self, index: int) -> None:
        """What runs before step ``index``."""
        if index in self.rounds_before:
            self.round()
        if index >= self.warmup:
            # the load of a shared host changes from second to second: the
            # shares are sampled before every measured step, too
            with STATUS.wait(None, "calibration"):
                self.shares.append(core_shares(self.setup.tdev, 0.05, self.probe))
                # a reference step beside each measured one: both see the
                # host's speed of the moment
                for ref in (self.reference, self.messages, self.one):
                    if ref is not None:
                        self.between.append(ref.run(1, self.setup.spin, self.targets))

    def combine(self) -> dict | None:
        """Rank 0: every rank's rounds and samples combined
        (:func:`placer.runtime.calibration.combine_calibration`); None elsewhere."""
        setup = self.setup
        with STATUS.wait(None, "the calibration gather"):
            return combine_calibration(self.rounds, setup.graph, setup.devs, setup.tdev,
                                       self.shares, self.between)

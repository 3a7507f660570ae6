"""The command lines of the runtime: ``placer run`` (one process),
``placer launch`` (one process per device, this host) and one rank under
torchrun (``python -m placer.runtime.dist``): their options, how they
build the model and the run's arguments, and how they print and write
the measured report. The runtime itself never imports this module."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist

from ._cli import slow_stage
from .errors import PlacerError
from .loaders import check_model, load_cluster, load_model, outputs_next_to
from .runtime.launch import init_group, launch
from .runtime.calibration import calibration_line
from .runtime.rank_loop import run_rank
from .runtime.ranks import auto_pin, launch_backend, pin_cores, rank_devices
from .runtime.status import START_UP, STATUS


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


def run_parser(prog: str, with_nproc: bool, pictures: bool = False) -> argparse.ArgumentParser:
    """The options of ``placer run`` (``with_nproc`` False), ``placer launch``
    (True) and a torchrun rank (``prog`` ``python -m placer.runtime.dist``)."""
    from ._cli import add_json, add_model_options, add_seed, command_parser, note_atomic_outputs
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


def run_options(ns) -> tuple:
    """``(plan, build, run keyword arguments, cluster)`` of parsed :func:`run_parser` options."""
    from .plan import Plan
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
    cluster = None if ns.cluster is None else load_cluster(ns.cluster)
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
    from .cluster import Cluster
    from .runtime.profile import calibrated_graph, profile
    from .runtime.run import resolve_graph
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


def print_report(result: dict, ns) -> None:
    """Print the measured report (text, or JSON with ``--json``); write it to ``-o``."""
    from ._io import atomic_write_text, dump_json
    rep = result["report"]
    path = ns.output
    if ns.json:
        print(dump_json({**rep, "loss": result.get("loss")}).rstrip())
        if path:
            atomic_write_text(path, dump_json({**rep, "calibration": result.get("calibration")}))
        return
    from .cost.report import format_time, gap, spread
    pred = rep.get("predicted")
    times = rep.get("step_times") or []
    line = f"step {format_time(rep['step_time'])} measured"
    if len(times) > 1:
        line += f" (median; {spread(times)})"
    if pred:
        said = f"{format_time(pred)} predicted"
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


def pin_arg(value: str) -> bool | None:
    """``--pin auto|on|off`` -> the ``pin`` argument of :func:`placer.launch`."""
    return {"auto": None, "on": True, "off": False}[value]


def measured_report(result: dict):
    """The :class:`MeasuredReport` of a :func:`launch` result (rank 0's
    figures and every rank's timeline of a typical step)."""
    from .cost.report import Event, FrozenTimeline
    from .runtime.common import MeasuredReport
    rep = result["report"]
    fields = {k: rep[k] for k in ("step_time", "feasible", "peak_memory", "busy", "compute",
                                  "comm", "idle", "microbatches", "schedule") if k in rep}
    events = [Event(*e) for e in result.get("events") or []]
    return MeasuredReport(**fields, model="measured", predicted=rep.get("predicted"),
                          step_times=list(rep.get("step_times") or []),
                          timeline=FrozenTimeline(events))


def write_pictures(report, ns) -> None:
    """``--trace``/``--gantt`` of ``placer run`` and ``placer launch``: the
    measured step's timeline (and the prediction's trace beside it when the
    report carries the whole prediction)."""
    if ns.trace:
        report.to_chrome_trace(ns.trace)
        if report.prediction is not None:
            report.prediction.to_chrome_trace(outputs_next_to(ns.trace) + ".predicted.json")
    if ns.gantt:
        report.plot_gantt(ns.gantt, title=f"measured step: {report.step_time * 1e3:.3g} ms"
                          + (f" (predicted {report.predicted * 1e3:.3g} ms)"
                             if report.predicted else ""))


def launch_main(argv: list[str] | None = None) -> int:
    """``placer launch PLAN --model MODEL [--nproc N] ...``: local ranks."""
    from ._io import check_outputs
    ns = run_parser("placer launch", True, pictures=True).parse_args(argv)
    check_outputs([(flag, getattr(ns, key, None)) for flag, key in
                   (("--output", "output"), ("--trace", "trace"), ("--gantt", "gantt"))],
                  [getattr(ns, k, None) for k in ("plan", "cluster", "model")])
    plan, build, kwargs, cluster = run_options(ns)
    if ":" in ns.model:
        # a user's factory is built once here, so that its mistakes (no
        # --input-shape, a factory that raises) are one line, not a rank's death
        with slow_stage("placer launch", f"building {ns.model} to check it"):
            build()
    with slow_stage("placer launch", f"{len(rank_devices(plan, cluster))} ranks building "
                    f"{ns.model} and running {ns.warmup} warm-up and {ns.steps} measured steps"):
        result = launch(plan, build, nproc=ns.nproc, backend=ns.backend, timeout=ns.timeout,
                        cluster=cluster, fault_timeout=ns.fault_timeout, pin=pin_arg(ns.pin),
                        **kwargs)
    write_pictures(measured_report(result), ns)
    print_report(result, ns)
    return 0


def rank_main(argv: list[str] | None = None) -> int:
    """One rank under torchrun (reads RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    A rank that fails, or that makes no progress for ``--fault-timeout``
    seconds once its steps have begun, exits with status 1 and one line
    naming its rank, device and stage (a waiting rank: whom it waits for);
    torchrun then stops the other ranks."""
    ap = run_parser("python -m placer.runtime.dist", False)
    ap.add_argument("--fault-timeout", type=float, default=60.0,
                    help="seconds without progress, once the steps have begun, before this "
                         "rank stops as hung (start-up is bounded by --timeout)")
    ns = ap.parse_args(argv)
    # torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE: this host's ranks
    local = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if auto_pin(pin_arg(ns.pin), local_world):
        cores = pin_cores(local, local_world)
        if cores and not ns.threads:
            torch.set_num_threads(len(cores))
    plan, build, kwargs, cluster = run_options(ns)
    init_group(ns.backend or launch_backend(plan, cluster, kwargs.get("device")), ns.timeout)
    rank = dist.get_rank()
    devs = rank_devices(plan, cluster)
    where = f"rank {rank}" + (f" (device {devs[rank]})" if rank < len(devs) else "")
    STATUS.reopen(None, rank)
    stop = _watch_self(where, ns.fault_timeout)
    try:
        STATUS.set("building the model")
        model, inputs = build()
        result = run_rank(model, plan, inputs, cluster=cluster, **kwargs)
        if result is not None:
            print_report(result, ns)
    except (PlacerError, RuntimeError) as exc:   # gloo reports lost peers as RuntimeError
        text = str(exc).strip().splitlines()
        print(f"placer.runtime.dist: error: {where} in stage {STATUS.stage!r} failed: "
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
    start_up = START_UP

    def watch():
        count, since, started = STATUS.count, time.monotonic(), False
        while not stop.wait(min(1.0, fault_timeout / 10)):
            started = started or (STATUS.stage.startswith("step ")
                                  and STATUS.stage not in start_up)
            if STATUS.count != count or not started or "calibrat" in STATUS.stage:
                count, since = STATUS.count, time.monotonic()
            elif time.monotonic() - since > fault_timeout:
                print(f"placer.runtime.dist: error: {where} in stage {STATUS.stage!r} made no "
                      f"progress for {fault_timeout:g} s (fix: check that device and its links; "
                      f"raise --fault-timeout if one op takes longer)",
                      file=sys.stderr, flush=True)
                os._exit(1)
    threading.Thread(target=watch, name="placer-fault-watch", daemon=True).start()
    return stop

def run_main(argv: list[str] | None = None) -> int:
    """``placer run PLAN --model MODEL``: the plan in this process, measured."""
    from .runtime.run import run
    ns = run_parser("placer run", False, pictures=True).parse_args(argv)
    plan, build, kwargs, cluster = run_options(ns)
    with slow_stage("placer run", f"building {ns.model}"):
        model, inputs = build()
    with slow_stage("placer run", f"running {ns.warmup} warm-up and {ns.steps} measured steps"):
        result = run(model, plan, inputs, cluster=cluster, **kwargs)
    report = result.report
    write_pictures(report, ns)
    print_report({"report": {**report.to_dict(), "predicted": report.predicted,
                       "step_times": report.step_times},
            "loss": None if result.loss is None else float(result.loss)}, ns)
    return 0

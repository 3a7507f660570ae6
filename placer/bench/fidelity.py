"""``placer bench fidelity``: do the cost models rank real plans right?

For each case (a small model on 2-4 CPU ranks, over loopback or over
network-namespace links shaped with ``tc tbf``) a population of plans —
random feasible ones (one device, pipelines, op-level scatters, branch
splits, data-parallel segments), every registered strategy's plan and
evolution's finalists (several seeds) — is measured on gloo ranks (each
plan in 3 bursts of a median step after warm-up, two in a first round of
starts and one in a second, minutes later: the smallest burst counts, see
:func:`measure_plans` and :func:`merge_rounds`; the references, measured
more often, as the expected smallest of as many, :func:`as_counted`) and
predicted three ways
on the case's calibration:

- ``simulator``: the event simulator on the calibrated graph and cluster;
- ``analytical``: the analytical model on the same;
- ``calibrated``: what ``launch(..., calibrate=True)`` reports: the
  simulator with the ranks' CPU contention
  (:func:`placer.runtime.contention.predict_shared`) on the reference
  references' fit (:func:`placer.runtime.calibration.reference_factor`:
  the compute on the one-device plan, the messages on the reference
  pipeline and the message plan, then a factor for the rest), the three
  measured as every plan is (:func:`measured_references`; they are
  reported apart, not scored).

Every prediction is of the plan as the runtime runs it
(:func:`placer.runtime.common.as_run`).

Per case and predictor: Kendall's tau between predicted and measured, the
median and 90th percentile of the absolute relative error, and the regret
(the measured step of the plan the model ranks best over the best measured
step). One PNG scatter per case.

Ranks start once per set of devices a case's plans use, and each run
measures many plans (:func:`measure_plans`): start-up (interpreters,
imports, the process group) costs more than a tiny model's plan.

    placer bench fidelity --quick -o fidelity.json
    python -m placer.bench.fidelity --out docs/bench      # the full bench
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch

import placer
from placer.errors import PlacerError

#: networks: loopback, or namespaces behind ``tc tbf`` at this rate
NETWORKS = {"loopback": None, "tbf": "200mbit"}


@dataclass(frozen=True)
class Model:
    """A zoo model at a bench size (``config`` overrides the entry's tiny)."""

    name: str
    batch: int = 8
    seq: int | None = None
    config: dict = field(default_factory=dict)

    def build(self):
        from placer import zoo
        return zoo.build(self.name, batch=self.batch, seq=self.seq, tiny=True, **self.config)


#: the bench's models: a transformer and three branchy graphs
MODELS = {
    "gpt": Model("gpt-125m", 8, 32, dict(n_layer=2, n_head=4, d_model=128, vocab=512)),
    "inception": Model("inception", 8, 32),
    "moe": Model("moe", 8, 32, dict(n_layer=2, n_head=4, d_model=64, vocab=256)),
    "gnmt": Model("gnmt", 8, 6, dict(hidden=64, vocab=128, n_layer=3)),
}


# --------------------------------------------------------------------------
# measures of agreement
# --------------------------------------------------------------------------
def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two equally long lists (ties in either count as
    neither concordant nor discordant); nan for fewer than two items."""
    n = len(x)
    if n != len(y):
        raise ValueError("kendall_tau needs two lists of one length")
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            a = (x[i] > x[j]) - (x[i] < x[j])
            b = (y[i] > y[j]) - (y[i] < y[j])
            if a and b:
                conc += a == b
                disc += a != b
            elif a:
                tx += 1
            elif b:
                ty += 1
    denom = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / denom if denom else float("nan")


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def agreement(predicted: list[float], measured: list[float]) -> dict:
    """Kendall's tau, median and 90th-percentile absolute relative error
    and regret of ``predicted`` against ``measured`` step times.

    ``regret``: the measured step of the plan the model ranks best over
    the best measured step; where several plans tie for the best
    prediction (the same placement on another device of one kind, found by
    several strategies) the model cannot tell them apart, and their median
    measured step counts (``regret_first``: the first of them, by index)."""
    errors = [abs(p - m) / m for p, m in zip(predicted, measured)]
    best = min(range(len(predicted)), key=lambda i: (predicted[i], i))
    tied = [m for p, m in zip(predicted, measured)
            if p <= predicted[best] + abs(predicted[best]) * 1e-9]
    return {"kendall_tau": kendall_tau(predicted, measured),
            "median_abs_error": statistics.median(errors),
            "p90_abs_error": _quantile(errors, 0.9),
            "regret": statistics.median(tied) / min(measured),
            "regret_first": measured[best] / min(measured),
            "ranked_best": best, "tied_best": len(tied)}


# --------------------------------------------------------------------------
# the population
# --------------------------------------------------------------------------
def _key(plan) -> tuple:
    """What makes two plans the same run (one microbatch: any schedule)."""
    return (tuple(sorted((k, tuple(v)) for k, v in plan.placement.items())),
            plan.microbatches, plan.schedule if plan.microbatches > 1 else None)


def _colocated(graph, placement: dict) -> dict:
    for members in graph.colocation_groups().values():
        for op_id in members[1:]:
            placement[op_id] = list(placement[members[0]])
    return placement


def random_plans(graph, devices: list[str], count: int, seed: int) -> list:
    """``count`` random plans of mixed kinds: contiguous pipelines (some with
    a data-parallel segment over every device), op-level scatters, branch
    splits (a random op and what follows it on another device) and one
    device; microbatch counts from the search's rule
    (:func:`placer.search.base.microbatch_candidates`)."""
    from placer.search.base import microbatch_candidates
    rng = random.Random(seed)
    order = graph.topological_order()
    ms = microbatch_candidates(graph, 8)
    kinds = ["pipeline", "scatter", "branch", "dp", "pipeline", "branch"]
    out = []
    for k in range(count):
        kind = kinds[k % len(kinds)]
        if kind == "scatter":
            # runs of a few ops on random devices: op-level, many crossings
            placement, dev = {}, rng.choice(devices)
            for op_id in order:
                if rng.random() < 0.25:
                    dev = rng.choice(devices)
                placement[op_id] = [dev]
        elif kind == "branch":
            # a fan of the graph (an op and its descendants) moved off the main device
            main, other = rng.sample(devices, 2)
            placement = {op_id: [main] for op_id in order}
            for _ in range(rng.randint(1, 3)):
                root = rng.choice(order[1:-1])
                dest = other if len(devices) == 2 else rng.choice(devices)
                for op_id in _descendants(graph, root, rng.randint(3, 20)):
                    placement[op_id] = [dest]
        else:
            segments = rng.randint(2, max(2, len(devices) + 1))
            cuts = sorted(rng.sample(range(1, len(order)), segments - 1))
            bounds = [0, *cuts, len(order)]
            placement = {}
            devs = devices[:]
            rng.shuffle(devs)
            dp_seg = rng.randrange(segments) if kind == "dp" else -1
            for s, (a, b) in enumerate(zip(bounds, bounds[1:])):
                group = list(devices) if s == dp_seg else [devs[s % len(devs)]]
                for op_id in order[a:b]:
                    placement[op_id] = group
        out.append(placer.Plan(_colocated(graph, placement), microbatches=rng.choice(ms),
                               schedule=rng.choice(["1f1b", "gpipe"])))
    return out


def _descendants(graph, root: str, limit: int) -> list[str]:
    """``root`` and up to ``limit - 1`` of its descendants, breadth first."""
    succ: dict[str, list[str]] = {}
    for e in graph.edges:
        succ.setdefault(e.src, []).append(e.dst)
    seen, queue = [root], [root]
    while queue and len(seen) < limit:
        for nxt in succ.get(queue.pop(0), []):
            if nxt not in seen and len(seen) < limit:
                seen.append(nxt)
                queue.append(nxt)
    return seen


def strategy_plans(graph, cluster, options: dict, *, evaluations: int, seeds: int,
                   seed: int = 0) -> list[tuple[str, object]]:
    """(origin, plan): every registered strategy's plan for the calibrated
    problem, and evolution's from ``seeds`` seeds (its finalists)."""
    out = []
    for method in placer.strategies():
        runs = range(seed, seed + seeds) if method == "evolution" else [seed]
        for s in runs:
            try:
                plan = placer.optimize(graph, cluster, method, seed=s, time_budget=None,
                                       evaluations=evaluations, problem_options=options)
            except PlacerError as exc:
                print(f"fidelity: {method} found no plan: {exc}", file=sys.stderr)
                continue
            out.append((method if method != "evolution" else f"evolution/{s}", plan))
    return out


# --------------------------------------------------------------------------
# measuring: one start of the ranks for many plans
# --------------------------------------------------------------------------
def measure_plans(plans: list, model: "Model | str", *, batch: int | None = None,
                  steps: int = 5, warmup: int = 2, nets=None, calibrate_first: bool = False,
                  keep_gradients: bool = False, pin: bool = True, timeout: float = 900.0,
                  progress=None, bursts: int = 1) -> list[dict]:
    """Run every plan on gloo ranks, one process per device of the plan;
    plans using the same devices share one start of the ranks. Returns one
    dict per plan, in order: ``step_time`` (median of ``steps`` after
    ``warmup``), ``step_times``, ``loss``, ``gradients`` (when
    ``keep_gradients``), ``calibration`` (the first plan of a start with
    ``calibrate_first``), or ``error`` (one line) when the plan failed.
    ``nets``: a :class:`placer.bench.runtime.Namespaces` (rank ``i`` in the
    namespace of device ``r{i}``) or None (loopback).

    ``bursts``: each plan is measured that many times (``warmup`` and
    ``steps`` each), the start's plans in turn, so a plan's bursts lie
    seconds apart; its ``step_time`` is the smallest burst median
    (``burst_medians``; ``step_times`` holds every burst's steps). Why: a
    shared virtual machine's speed changes from one half-second to the
    next, and a burst sees one speed: the same one-device plan of the
    bench's MoE, on one pinned core, measured 11-21 ms from burst to burst
    (each burst's steps within 1-2 ms; 12 bursts on each core and 12
    unpinned: no difference between the cores or the ranks, while other
    work kept the other core busy). One burst in a slow phase made
    identical plans differ by 1.3x, and that alone set the regret; the
    smallest burst is the plan on the host as calibrated (the calibration
    takes medians of repeats)."""
    from placer.runtime.ranks import rank_devices
    if isinstance(model, str):
        model = Model(model, batch or 4)
    batches: dict[tuple, list[int]] = {}
    for i, plan in enumerate(plans):
        batches.setdefault(tuple(sorted(rank_devices(plan))), []).append(i)
    results: list[dict | None] = [None] * len(plans)
    first = True      # only the first start calibrates
    for devs, idx in sorted(batches.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        todo = list(idx)
        while todo:
            done = _launch_batch([plans[i] for i in todo], model, list(devs), steps=steps,
                                 warmup=warmup, nets=nets, keep_gradients=keep_gradients,
                                 calibrate_first=calibrate_first and first, pin=pin,
                                 timeout=timeout, bursts=bursts)
            first = False
            for i, res in zip(todo, done):
                results[i] = res
                if progress is not None:
                    progress(i, res)
            # a failed plan ends its start: the rest go to a new one
            todo = todo[len(done):]
    return results


def _launch_batch(plans, model: Model, devs: list[str], *, steps, warmup, nets,
                  keep_gradients, calibrate_first, pin, timeout, bursts=1) -> list[dict]:
    """One start of ``len(devs)`` ranks running ``plans`` in turn; returns
    the results of the plans up to and including the first that failed."""
    from placer.runtime.launch import free_port as _free_port
    world = len(devs)
    with tempfile.TemporaryDirectory(prefix="placer-fidelity-") as tmp:
        spec = {"model": {"name": model.name, "batch": model.batch, "seq": model.seq,
                          "config": model.config},
                "plans": [p.to_dict() for p in plans], "steps": steps, "warmup": warmup,
                "keep_gradients": keep_gradients, "calibrate_first": calibrate_first,
                "pin": pin, "out": tmp, "timeout": timeout, "bursts": bursts}
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        port = str(_free_port()) if nets is None else str(29000 + random.randrange(2000))
        procs = []
        try:
            for r, dev in enumerate(devs):
                ns_index = int(dev[1:]) if nets is not None else None
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                           LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                           OMP_NUM_THREADS="1",
                           MASTER_ADDR="127.0.0.1" if nets is None else
                           nets.address(int(devs[0][1:])), MASTER_PORT=port)
                cmd = [sys.executable, "-m", "placer.bench.fidelity", "worker", spec_path]
                if nets is not None:
                    env["GLOO_SOCKET_IFNAME"] = f"{nets.prefix}v{ns_index}"
                    cmd = ["ip", "netns", "exec", nets.names[ns_index], *cmd]
                log = open(os.path.join(tmp, f"rank{r}.log"), "w")
                procs.append(subprocess.Popen(cmd, env=env, stdout=log,
                                              stderr=subprocess.STDOUT))
                log.close()
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs):
                if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        kept = []
        for k in range(len(plans)):
            path = os.path.join(tmp, f"plan{k}.pt")
            kept.append(torch.load(path, weights_only=True) if os.path.exists(path) else None)
        # a plan that failed in a later burst has a file from the earlier ones
        failed = None
        if any(p.returncode for p in procs):
            failed = _failed_plan(tmp, world)
            if failed is None:      # no rank said: where the last burst stopped
                done = [len(r["burst_medians"]) if r else 0 for r in kept]
                k = next((i for i, n in enumerate(done) if n < done[0]),
                         0 if done[0] < bursts else None)
                failed = (k, f"plan {k}: the ranks stopped without a result (crash)") \
                    if k is not None else None
        out = []
        for k, res in enumerate(kept):
            if failed is not None and failed[0] == k or res is None:
                out.append({"error": failed[1] if failed is not None and failed[0] == k
                            else f"plan {k}: the ranks stopped without a result "
                                 "(timeout or crash)"})
                break
            out.append(res)
        return out


#: gloo's words when a peer of the rank went away (not the cause)
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _failed_plan(tmp: str, world: int) -> tuple[int, str] | None:
    """(plan index, its error) from the ranks' logs: a rank's own error
    before a rank that only lost its peer; None when no rank said."""
    import re
    found = []
    for r in range(world):
        try:
            with open(os.path.join(tmp, f"rank{r}.log")) as f:
                lines = [ln for ln in f.read().splitlines() if "fidelity-error:" in ln]
        except OSError:
            continue
        for line in lines:
            text = line.split("fidelity-error:", 1)[1].strip()
            match = re.match(r"plan (\d+):", text)
            if match:
                found.append((any(w in text for w in _PEER_GONE), int(match[1]), text))
    if not found:
        return None
    _peer, k, text = min(found)
    return k, text


def worker(spec_path: str) -> int:
    """One rank of :func:`_launch_batch` (RANK, WORLD_SIZE, MASTER_* set)."""
    import torch.distributed as dist
    from placer.runtime import dist as pdist
    with open(spec_path) as f:
        spec = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if spec["pin"]:
        pdist.pin_cores(rank, world)
    torch.set_num_threads(1)
    pdist.init_group("gloo", spec["timeout"])
    m = spec["model"]
    model, inputs = Model(m["name"], m["batch"], m["seq"], m["config"]).build()
    graph = placer.trace(model, inputs)
    plans = [placer.Plan.from_dict(d) for d in spec["plans"]]
    kept: list[dict] = [{} for _ in plans]
    try:
        # a plan's bursts in turn with the others' (see measure_plans)
        for burst in range(spec.get("bursts", 1)):
            for k, plan in enumerate(plans):
                try:
                    res = pdist.run_rank(model, plan, inputs, graph=graph, steps=spec["steps"],
                                         warmup=spec["warmup"],
                                         calibrate=spec["calibrate_first"] and k == 0
                                         and burst == 0)
                except Exception as exc:
                    text = str(exc).strip().splitlines()
                    print(f"fidelity-error: plan {k}: {type(exc).__name__}: "
                          f"{text[-1] if text else ''}", flush=True)
                    return 1
                if res is not None:
                    _keep_burst(kept[k], res, spec["keep_gradients"])
                    path = os.path.join(spec["out"], f"plan{k}.pt")
                    torch.save(kept[k], path + ".tmp")
                    os.replace(path + ".tmp", path)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _keep_burst(keep: dict, res: dict, gradients: bool) -> None:
    """Add one burst of a plan (rank 0's :func:`run_rank` result) to what is
    kept of it: the first burst's loss, gradients and calibration, every
    burst's steps and median, and the step time, compute and communication
    of the burst with the smallest median (see :func:`measure_plans`)."""
    rep = res["report"]
    burst = {"step_times": list(rep["step_times"]), "burst_medians": [rep["step_time"]],
             "step_time": rep["step_time"], "compute": rep.get("compute"),
             "comm": rep.get("comm"),
             "burst_parts": [{"compute": rep.get("compute"), "comm": rep.get("comm")}]}
    if keep:
        keep.update(_with_bursts(keep, burst))
        return
    keep.update(burst, loss=res["loss"], schedule=res["schedule"])
    if gradients:
        keep["gradients"] = res["gradients"]
    if "calibration" in res:
        keep["calibration"] = res["calibration"]
        keep["predicted"] = rep["predicted"]


def _with_bursts(kept: dict, more: dict) -> dict:
    """``kept`` (a plan's measured bursts) with those of ``more`` added:
    every burst's steps and median, and the step time, compute and
    communication of the fastest burst (a tie: the later)."""
    out = {**kept, "burst_medians": kept["burst_medians"] + more["burst_medians"],
           "step_times": kept["step_times"] + more["step_times"],
           "burst_parts": kept.get("burst_parts", []) + more.get("burst_parts", [])}
    if more["step_time"] <= kept["step_time"]:
        out.update(step_time=more["step_time"], compute=more.get("compute"),
                   comm=more.get("comm"))
    return out


def smallest_of(values: list[float], k: int) -> list[float]:
    """Weights on ``values`` whose weighted sum is the expected smallest of
    ``k`` of them drawn without replacement (the mean, over every
    ``k``-subset, of its smallest): all on the smallest when there are
    ``k`` or fewer. The smallest of a subset is the ``i``-th smallest value
    (from 0) in ``C(n - 1 - i, k - 1)`` of the ``C(n, k)`` subsets."""
    n = len(values)
    order = sorted(range(n), key=lambda i: (values[i], i))
    weights = [0.0] * n
    if n <= k:
        weights[order[0]] = 1.0
        return weights
    for rank, i in enumerate(order):
        weights[i] = math.comb(n - 1 - rank, k - 1) / math.comb(n, k)
    return weights


def as_counted(result: dict, bursts: int) -> dict:
    """``result`` (a plan's measured bursts) with its step, compute and
    communication those of the smallest of ``bursts`` bursts, expected over
    the bursts it has (:func:`smallest_of`): unchanged with ``bursts`` or
    fewer.

    Why: the smallest of more bursts is smaller. The references are
    measured in one start more than the plans (5 bursts against 3); their
    smallest was biased low against the plans' (a MoE over loopback:
    the one-device reference's fastest burst set the compute, and the
    one-device plans measured 3 times were predicted fast)."""
    medians = result.get("burst_medians") or []
    if "step_time" not in result or len(medians) <= bursts:
        return result
    weights = smallest_of(medians, bursts)
    out = {**result, "step_time": sum(w * m for w, m in zip(weights, medians))}
    parts = result.get("burst_parts") or []
    for key in ("compute", "comm"):
        if len(parts) == len(medians) and all(p.get(key) for p in parts):
            out[key] = {d: sum(w * p[key].get(d, 0.0) for w, p in zip(weights, parts))
                        for d in parts[0][key]}
    return out


# --------------------------------------------------------------------------
# predictions
# --------------------------------------------------------------------------
def fit_calibration(calibration: dict) -> tuple[dict, dict, float]:
    """One case's calibration fitted on its references as kept:
    ``(calibration, options, factor)``, the calibration's graph and cluster
    as objects (scaled by the fit), the cost model's options and the factor
    a calibrated prediction is multiplied by
    (:func:`placer.runtime.calibration.reference_factor`, fitted afresh:
    :func:`~placer.runtime.calibration.unfitted` first)."""
    from placer.runtime.calibration import (calibrated_options, message_plan, one_device_plan,
                                            reference_factor, reference_plan, unfitted)
    if calibration.get("reference_step"):
        # sets kept before measured_references undid rank 0's fit hold it
        calibration = unfitted(calibration)
    cg = placer.Graph.from_dict(calibration["graph"])
    cc = placer.Cluster.from_dict(calibration["cluster"])
    calibration = {**calibration, "graph": cg, "cluster": cc}
    options = calibrated_options(calibration)
    factor = calibration.get("reference_factor", 1.0)
    if calibration.get("reference_step"):
        # run_case measures the pipeline at 2 microbatches, 1f1b, on every
        # rank; the fit scales the graph, the cluster's shares and options
        one = one_device_plan(cg, cc.names) if calibration.get("reference_one_step") else None
        factor = reference_factor(calibration, reference_plan(cg, cc.names, 2), options,
                                  message_plan(cg, cc.names, 2), one)
    return calibration, options, factor


def predictions(calibration: dict, plans: list, fit: tuple | None = None
                ) -> dict[str, list[float]]:
    """The three predictions of every plan from one case's calibration
    (``fit``: its :func:`fit_calibration`, made here when None)."""
    from placer.cost import Problem, get_cost_model
    from placer.runtime.common import as_run
    from placer.runtime.contention import predict_shared
    calibration, options, factor = fit or fit_calibration(calibration)
    cg, cc = calibration["graph"], calibration["cluster"]
    problem = Problem(cg, cc, **options)
    analytical = get_cost_model("analytical")
    out: dict[str, list[float]] = {"simulator": [], "analytical": [], "calibrated": []}
    for plan in plans:
        run = as_run(cg, plan)
        out["simulator"].append(placer.simulate(cg, cc, run, **options).step_time)
        out["analytical"].append(analytical.estimate(problem, run).step_time)
        out["calibrated"].append(predict_shared(cg, cc, plan, **options).step_time * factor)
    return out


# --------------------------------------------------------------------------
# one case
# --------------------------------------------------------------------------
def run_case(model_key: str, network: str = "loopback", nproc: int = 2, *, plans: int = 30,
             steps: int = 5, warmup: int = 2, evaluations: int = 300, evo_seeds: int = 3,
             seed: int = 0, rate: str | None = None, bursts: int = 1, rounds: int = 1,
             log=print) -> dict:
    """Measure and predict one case's population; see the module doc.
    ``bursts``: a plan's bursts in all; ``rounds``: the starts are made that
    many times, minutes apart, the first with ``bursts - rounds + 1`` of a
    plan's bursts and the others with one each (:func:`merge_rounds`). The
    reference plans are measured in the first round's starts of the
    strategies' plans too (so ``bursts - rounds + 1`` more bursts than a
    plan): the fit rests on them, and a slow phase of the host over the
    calibrating start moved every prediction (inception over ``tbf``: the
    one-device reference at 26.0-32.2 ms in its bursts where the scored
    one-device plan measured 16.2)."""
    from placer.runtime.calibration import message_plan, one_device_plan, reference_plan
    model = MODELS[model_key]
    module, inputs = model.build()
    graph = placer.trace(module, inputs)
    devices = [f"r{i}" for i in range(nproc)]
    rate = rate or NETWORKS.get(network)
    start = time.perf_counter()

    def note(i, res):
        log(f"  {model_key}/{network}: plan {i}: "
            + (f"{res['step_time'] * 1e3:.1f} ms" if "step_time" in res else res["error"]))

    rounds = max(1, min(rounds, bursts))

    def measure(batch, n=bursts - rounds + 1, **kw):
        return measure_plans(batch, model, steps=steps, warmup=warmup, nets=nets,
                             progress=note, bursts=n, **kw)

    nets_cm = _network(network, nproc, rate)
    with nets_cm as nets:
        # 1. calibrate on the reference pipeline, then random plans on every
        # device in the same start (they need no calibration to be chosen)
        # strategies often agree (several one-device plans): randoms fill up
        randoms = random_plans(graph, devices, max(plans // 2, plans - 3), seed)
        # (the first rank's is the reference-one, measured once)
        randoms += [one_device_plan(graph, [d]) for d in devices]
        refs = [reference_plan(graph, devices, 2), message_plan(graph, devices, 2),
                one_device_plan(graph, devices)]
        n_refs = len(refs)
        first = measure(refs + [p for p in randoms if len(p.devices_used()) == nproc],
                        calibrate_first=True)
        if "calibration" not in first[0] or any("step_time" not in r for r in first[:n_refs]):
            raise PlacerError(f"{model_key}/{network}: the calibration run failed: "
                              + next((r["error"] for r in first[:n_refs] if "error" in r),
                                     "rank 0 returned no calibration"))
        calibration = measured_references(*first[:n_refs])
        # 2. the strategies' plans, searched on that calibration
        from placer.runtime.calibration import calibrated_options
        cg = placer.Graph.from_dict(calibration["graph"])
        cc = placer.Cluster.from_dict(calibration["cluster"])
        found = strategy_plans(cg, cc, calibrated_options(calibration),
                               evaluations=evaluations, seeds=evo_seeds, seed=seed)
        population = list(zip(CALIBRATING, refs)) + \
            [("random", p) for p in randoms if len(p.devices_used()) == nproc]
        results = list(first)
        seen = {_key(p) for _, p in population}
        rest = [(o, p) for o, p in found if _key(p) not in seen and not seen.add(_key(p))]
        # strategies whose plan another had already (measured once)
        duplicates = [o for o, p in found if all(p is not q for _, q in rest)]
        rest += [("random", p) for p in randoms if len(p.devices_used()) < nproc
                 and _key(p) not in seen and not seen.add(_key(p))]
        # the references again, in these starts too: a slow phase of the
        # host over their first start no longer sets the fit
        more = measure(refs + [p for _, p in rest])
        results = merge_rounds(results[:n_refs], more[:n_refs]) + results[n_refs:] + \
            more[n_refs:]
        population += rest
        # 3. the same starts again, minutes later: a slow phase of the host
        # during one start no longer sets its plans' steps
        for _ in range(rounds - 1):
            results = merge_rounds(results, measure([p for _, p in population], n=1))
        if any("step_time" not in r for r in results[:n_refs]):
            raise PlacerError(f"{model_key}/{network}: a reference plan failed in a later "
                              "round: " + next((r["error"] for r in results[:n_refs]
                                                if "error" in r), "no step"))
        # measured more often than the plans: counted as often (see as_counted)
        results[:n_refs] = [as_counted(r, bursts) for r in results[:n_refs]]
        calibration = measured_references(*results[:n_refs])
    return _scored_case(graph, population, results, calibration, duplicates,
                        {"model": model_key, "zoo": model.name, "batch": model.batch,
                         "network": network, "rate": rate, "nproc": nproc, "steps": steps,
                         "warmup": warmup, "bursts": bursts, "rounds": rounds}, start)


def _scored_case(graph, population: list, results: list, calibration: dict,
                 duplicates: list, case: dict, start: float) -> dict:
    """:func:`run_case`'s report of its measured ``population`` (``(origin,
    plan)`` pairs, ``results`` in the same order): the scored plans with
    their three predictions on ``calibration``, the metrics, the failed
    plans, the references and the fit; ``case`` names the case."""
    # the plans the calibration was fitted on are not scored
    ok = [i for i, r in enumerate(results)
          if "step_time" in r and population[i][0] not in CALIBRATING]
    plans_ok = [population[i][1] for i in ok]
    measured = [results[i]["step_time"] for i in ok]
    fit = fit_calibration(calibration)
    preds = predictions(calibration, plans_ok, fit)
    rows = []
    for j, i in enumerate(ok):
        origin, plan = population[i]
        rows.append({"origin": origin, "devices": sorted(plan.devices_used()),
                     "microbatches": plan.microbatches, "schedule": plan.schedule,
                     "op_level": _op_level(graph, plan),
                     "measured": measured[j], "step_times": results[i]["step_times"],
                     "burst_medians": results[i].get("burst_medians"),
                     **{k: v[j] for k, v in preds.items()}})
    failed = [{"origin": population[i][0], "error": results[i]["error"]}
              for i in range(len(results)) if "step_time" not in results[i]]
    references = [{"origin": population[i][0], "measured": results[i]["step_time"],
                   "burst_medians": results[i].get("burst_medians"),
                   "beside": calibration.get(f"{key}_beside")}
                  for i, key in enumerate(("reference_step", "reference_messages_step",
                                           "reference_one_step"))]
    return {**case, "plans": rows, "failed": failed, "duplicates": duplicates,
            "references": references,
            "metrics": {k: agreement(v, measured) for k, v in preds.items()}
            if len(measured) >= 2 else {},
            "calibration": {k: fit[0].get(k) for k in CALIBRATION_REPORTED},
            "links": {k: {"bandwidth": v["bandwidth"], "latency": v["latency"]}
                      for k, v in calibration.get("links", {}).items()},
            "seconds": time.perf_counter() - start, "load": _load(),
            # what re-predicting the measured plans needs (see repredict);
            # bench_fidelity keeps it apart from the results
            "raw": {"calibration": calibration, "plans": [p.to_dict() for p in plans_ok],
                    # each rank's measured compute and communication seconds a step
                    "parts": [{"compute": results[i].get("compute"),
                               "comm": results[i].get("comm")} for i in ok]}}


#: what a case reports of its calibration, as fitted (:func:`fit_calibration`)
CALIBRATION_REPORTED = (
    "op_overhead", "task_overhead", "message_overhead", "resume_overhead",
    "collective_efficiency", "reference_factor", "reference_factor_raw", "compute_scale",
    "reference_compute_factor", "reference_share_factor", "reference_message_extra",
    "reference_step", "reference_messages_step", "reference_one_step",
    "reference_step_beside", "reference_messages_step_beside", "reference_one_step_beside",
    "cpu_share", "cpu_share_all",
    "speed_drift")


def merge_rounds(first: list[dict], again: list[dict]) -> list[dict]:
    """Per plan, its results of two rounds of starts as one: every burst
    (``burst_medians``, ``step_times``), the step, compute and
    communication of the fastest, the first round's calibration; a plan
    that failed in either round is failed (its error)."""
    return [{"error": a.get("error") or b["error"]} if "error" in a or "error" in b
            else _with_bursts(a, b) for a, b in zip(first, again)]


#: origins of the plans the calibration is fitted on (measured first, as
#: every plan is; see :func:`measured_references`), not scored
CALIBRATING = ("reference", "reference-messages", "reference-one")


def measured_references(pipeline: dict, messages: dict, one: dict | None = None) -> dict:
    """The calibration of a start whose first plans were
    :func:`~placer.runtime.calibration.reference_plan` (calibrating),
    :func:`~placer.runtime.calibration.message_plan` and
    :func:`~placer.runtime.calibration.one_device_plan` (``one``), their
    steps and the pipeline's compute taken as :func:`measure_plans`
    measured them (the
    smallest burst median) instead of the reference steps run beside the
    calibrating burst (kept as ``reference_step_beside``,
    ``reference_messages_step_beside`` and ``reference_compute_beside``).

    Why: the plans are each measured at their fastest of three bursts, the
    references beside one burst; on a host whose speed changes from
    second to second the two differ by the host's phase (inception over
    loopback: reference steps beside 40.2 ms, the same pipeline as a plan
    33.8, every one-device plan then predicted 28-36% slow), and over a
    ``tbf`` link a reference step run after a pause starts with the
    bucket's burst allowance that back-to-back steps do not have (gpt:
    27.8 ms beside, 33.0 as a plan). The fit rank 0 made on the steps
    beside is undone (:func:`~placer.runtime.calibration.unfitted`): it
    scaled the graph's compute by what those steps measured, and a later
    fit keeps a compute factor it finds."""
    from placer.runtime.calibration import unfitted
    # rank 0 fitted it on the steps beside: that fit goes (see unfitted)
    calibration = unfitted(pipeline["calibration"])
    calibration.update(
        reference_step_beside=calibration.get("reference_step"),
        reference_messages_step_beside=calibration.get("reference_messages_step"),
        reference_compute_beside=calibration.get("reference_compute"),
        reference_one_step_beside=calibration.get("reference_one_step"),
        reference_step=pipeline["step_time"],
        reference_messages_step=messages["step_time"])
    if one is not None:
        calibration["reference_one_step"] = one["step_time"]
    if pipeline.get("compute"):
        calibration["reference_compute"] = dict(pipeline["compute"])
    return calibration


def _op_level(graph, plan) -> bool:
    """Whether the plan cuts the topological order more often than it has
    devices (op-level, branch-parallel) rather than into a pipeline."""
    order = graph.topological_order()
    cuts = sum(plan.placement[a] != plan.placement[b] for a, b in zip(order, order[1:]))
    return cuts > len(plan.devices_used())


class _Loopback:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _network(network: str, nproc: int, rate: str | None):
    if network == "loopback":
        return _Loopback()
    from placer.bench.runtime import Namespaces
    return Namespaces(nproc, rate or NETWORKS["tbf"], prefix="plf")


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return -1.0


# --------------------------------------------------------------------------
# the bench
# --------------------------------------------------------------------------
#: (model, network, ranks) of the full bench and of ``--quick``
FULL = [(m, n, 2) for n in ("loopback", "tbf") for m in ("gpt", "inception", "moe", "gnmt")]
QUICK = [("gnmt", "loopback", 2)]


def bench_fidelity(out: str | None = None, *, quick: bool = False, cases=None,
                   plans: int | None = None, steps: int | None = None, seed: int = 0,
                   plots: str | None = None, raw: str | None = None, bursts: int | None = None,
                   rounds: int | None = None, log=print) -> dict:
    """Run the cases (default :data:`FULL`, or :data:`QUICK`), write the JSON
    to ``out`` and a scatter per case into ``plots`` (default: ``out``'s
    folder); returns the results. Namespaced cases are skipped without
    root (said in the results). ``raw``: a folder to keep each case's
    calibration, plans and measured steps in (``MODEL-NETWORK-RANKS.json``),
    which :func:`repredict` predicts again with the cost models of now.
    ``bursts``: how many times each plan is measured (default 3, quick 1;
    see :func:`measure_plans`); ``rounds``: in how many rounds of starts
    (default 2, quick 1; see :func:`run_case`)."""
    from placer._io import atomic_write_text, dump_json
    cases = cases or (QUICK if quick else FULL)
    plans = plans or (10 if quick else 30)
    steps = steps or (3 if quick else 5)
    bursts = bursts or (1 if quick else 3)
    rounds = rounds or (1 if quick else 2)
    evaluations = 60 if quick else 300
    results, skipped = [], []
    start = time.perf_counter()
    for model_key, network, nproc in cases:
        if network != "loopback" and os.geteuid() != 0:
            skipped.append({"model": model_key, "network": network,
                            "why": "network namespaces need root"})
            continue
        log(f"fidelity: {model_key} over {network}, {nproc} ranks")
        case = run_case(model_key, network, nproc, plans=plans, steps=steps,
                        warmup=2, evaluations=evaluations,
                        evo_seeds=1 if quick else 3, seed=seed, bursts=bursts,
                        rounds=rounds, log=log)
        raw_case = case.pop("raw")
        if raw:
            os.makedirs(raw, exist_ok=True)
            atomic_write_text(os.path.join(raw, f"{model_key}-{network}-{nproc}.json"),
                              dump_json({**raw_case, "measured": [
                                  r["measured"] for r in case["plans"]],
                                  "origins": [r["origin"] for r in case["plans"]]}))
        results.append(case)
    summary = {f"{r['model']}/{r['network']}/{r['nproc']}": {
        k: {m: v[m] for m in ("kendall_tau", "median_abs_error", "p90_abs_error", "regret")}
        for k, v in r["metrics"].items()} | {"plans": len(r["plans"])} for r in results}
    doc = {"format": "placer.bench.fidelity/v1", "version": _version(), "quick": quick,
           "seed": seed, "bursts": bursts, "rounds": rounds, "seconds": time.perf_counter() - start, "summary": summary,
           "skipped": skipped, "cases": results}
    if out:
        atomic_write_text(out, dump_json(doc))
        folder = plots or os.path.dirname(os.path.abspath(out))
        stem = os.path.splitext(os.path.basename(out))[0]
        for r in results:
            plot_case(r, os.path.join(folder, f"{stem}-{r['model']}-{r['network']}.png"))
    return doc


def _kept(path: str) -> dict:
    """A case kept by ``bench_fidelity(raw=...)``, its calibrated graph's
    edges marked as the runtime of now marks them (``fixed_bytes``, see
    :mod:`placer.runtime.scaling`; cases kept before it had none)."""
    from placer.runtime.scaling import mark_fixed_bytes
    with open(path) as f:
        raw = json.load(f)
    model = MODELS.get(os.path.basename(path).split("-", 1)[0])
    if model is not None:
        graph = placer.Graph.from_dict(raw["calibration"]["graph"])
        module, inputs = model.build()
        mark_fixed_bytes(graph, module, inputs)
        raw["calibration"]["graph"] = graph.to_dict()
    return raw


def repredict(path: str) -> dict:
    """The metrics (as in a case's ``metrics``) of a case kept by
    ``bench_fidelity(raw=...)``, predicted again from its calibration."""
    raw = _kept(path)
    # sets kept before the references were measured as plans scored the pipeline
    scored = [i for i, o in enumerate(raw.get("origins") or [""] * len(raw["plans"]))
              if o not in CALIBRATING]
    plans = [placer.Plan.from_dict(raw["plans"][i]) for i in scored]
    measured = [raw["measured"][i] for i in scored]
    preds = predictions(raw["calibration"], plans)
    return {k: {m: v[m] for m in ("kendall_tau", "median_abs_error", "p90_abs_error",
                                  "regret")}
            for k, v in ((k, agreement(v, measured)) for k, v in preds.items())}


def refresh(results: str, raws: list[str], log=print) -> dict:
    """Predict the cases kept in ``raws`` again (as :func:`repredict`) and
    write the predictions, metrics and summary into the bench's results
    file ``results`` (cases matched by model, network and ranks; each
    case's plans in the order kept), with new scatters beside it. The
    measurements stay; ``repredicted`` says with which version."""
    from placer._io import atomic_write_text, dump_json
    with open(results) as f:
        doc = json.load(f)
    cases = {f"{c['model']}-{c['network']}-{c['nproc']}": c for c in doc["cases"]}
    for path in raws:
        name = os.path.splitext(os.path.basename(path))[0]
        case = cases.get(name)
        if case is None:
            continue
        raw = _kept(path)
        if [r["measured"] for r in case["plans"]] != raw["measured"]:
            raise PlacerError(f"{path}: its measurements are not those of case {name} in "
                              f"{results}", fix="pass the raw files of that run")
        fit = fit_calibration(raw["calibration"])
        preds = predictions(raw["calibration"], [placer.Plan.from_dict(p) for p in raw["plans"]],
                            fit)
        case["calibration"] = {k: fit[0].get(k) for k in CALIBRATION_REPORTED}
        for k, v in preds.items():
            for row, value in zip(case["plans"], v):
                row[k] = value
        case["metrics"] = {k: agreement(v, raw["measured"]) for k, v in preds.items()}
        log(f"fidelity: {name} predicted again")
    doc["summary"] = {f"{r['model']}/{r['network']}/{r['nproc']}": {
        k: {m: v[m] for m in ("kendall_tau", "median_abs_error", "p90_abs_error", "regret")}
        for k, v in r["metrics"].items()} | {"plans": len(r["plans"])} for r in doc["cases"]}
    doc["repredicted"] = _version()
    atomic_write_text(results, dump_json(doc))
    folder = os.path.dirname(os.path.abspath(results))
    stem = os.path.splitext(os.path.basename(results))[0]
    for r in doc["cases"]:
        plot_case(r, os.path.join(folder, f"{stem}-{r['model']}-{r['network']}.png"))
    return doc


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("placer")
    except Exception:
        return getattr(placer, "__version__", "unknown")


def plot_case(case: dict, path: str) -> None:
    """Predicted against measured step time of one case's plans, log-log,
    one colour per predictor, with y = x."""
    from placer.plots import pyplot as _pyplot
    from placer.plots import save_figure as _save
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    measured = [r["measured"] * 1e3 for r in case["plans"]]
    lo, hi = min(measured), max(measured)
    for name, colour in (("simulator", "tab:blue"), ("analytical", "tab:green"),
                         ("calibrated", "tab:red")):
        pred = [r[name] * 1e3 for r in case["plans"]]
        lo, hi = min(lo, *pred), max(hi, *pred)
        m = case["metrics"].get(name, {})
        ax.scatter(measured, pred, s=16, alpha=0.75, color=colour,
                   label=f"{name} (tau {m.get('kendall_tau', float('nan')):.2f}, "
                         f"med {m.get('median_abs_error', float('nan')) * 100:.0f}%)")
    ax.plot([lo * 0.9, hi * 1.1], [lo * 0.9, hi * 1.1], color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.set_title(f"{case['model']} over {case['network']}, {case['nproc']} ranks, "
                 f"{len(case['plans'])} plans", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m placer.bench.fidelity")
    ap.add_argument("what", nargs="?", default="bench",
                    choices=["bench", "worker", "repredict"])
    ap.add_argument("spec", nargs="*", help="worker: the batch's spec file; repredict: "
                    "the kept cases (--raw)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("-o", "--output", default="fidelity.json")
    ap.add_argument("--plans", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--case", action="append", metavar="MODEL/NETWORK/RANKS",
                    help="e.g. gnmt/loopback/2 (repeatable; default: the full list)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bursts", type=int, help="times each plan is measured, its step the "
                    "smallest burst median (default 3, --quick 1)")
    ap.add_argument("--rounds", type=int, help="times the starts are made, minutes apart, "
                    "a plan's bursts shared among them (default 2, --quick 1)")
    ap.add_argument("--raw", default=None, help="folder to keep each case's calibration, "
                    "plans and measured steps in (for repredict)")
    ap.add_argument("--results", default=None, help="repredict: the bench's results file "
                    "to write the new predictions, metrics and scatters into")
    ns = ap.parse_args(argv)
    if ns.what == "worker":
        return worker(ns.spec[0])
    if ns.what == "repredict":
        if ns.results:
            doc = refresh(ns.results, ns.spec)
            print(json.dumps(doc["summary"], indent=1))
        else:
            print(json.dumps({p: repredict(p) for p in ns.spec}, indent=1))
        return 0
    cases = None
    if ns.case:
        cases = []
        for c in ns.case:
            m, n, k = c.split("/")
            cases.append((m, n, int(k)))
    doc = bench_fidelity(ns.output, quick=ns.quick, cases=cases, plans=ns.plans,
                         steps=ns.steps, seed=ns.seed, raw=ns.raw, bursts=ns.bursts,
                         rounds=ns.rounds)
    print(json.dumps(doc["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Runtime benchmarks: overhead, predicted vs measured, emulated WAN.

- :func:`overhead`: a training step placed on one device vs plain PyTorch.
- :func:`accuracy`: CPU ranks over gloo on this host; the simulator,
  calibrated by :func:`placer.runtime.profile.profile` and a measured link,
  predicts each random plan's step time; returns the errors.
- :func:`netns`: the same, with every rank in its own network namespace,
  joined through a bridge by veth pairs whose egress is rate-limited with
  ``tc tbf`` (needs root; only namespaces and links it creates are touched,
  and removed afterwards). The cluster file says the same rate.
- :func:`placer.bench.engines.engines` (``--suite engines``): the built-in
  engine vs torch.distributed.pipelining on the same plans, side by side.

    python -m placer.bench.runtime overhead
    python -m placer.bench.runtime accuracy --plans 4
    sudo python -m placer.bench.runtime netns --rate 200mbit
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

import placer
import placer.runtime
from placer import zoo

MODEL = "gpt-125m"
CONFIG = dict(n_layer=2, n_head=4, d_model=128, vocab=512, max_seq=64)
#: model sizes of :func:`accuracy`: (batch, sequence, config). "tiny" steps
#: take ~20 ms, of which framework overheads (op launches, tasks, messages)
#: are most; "small" does 4x the work per step (~80 ms).
SIZES = {"tiny": (8, 32, CONFIG),
         "small": (8, 64, dict(n_layer=2, n_head=4, d_model=256, vocab=512, max_seq=64))}


def _build(model=MODEL, batch=8, seq=32, **config):
    return zoo.build(model, batch=batch, seq=seq, **(config or CONFIG))


def overhead(model: str = MODEL, batch: int = 8, seq: int = 32, steps: int = 30,
             threads: int = 1, microbatches: int = 1, **config) -> dict:
    """Plain PyTorch (forward, backward, SGD step) vs :func:`placer.run` with
    every op on one device, interleaved A/B/A/B in this process so that the
    machine's load changes hit both alike. ``overhead`` is the median of the
    per-pair ratios less one; wall-clock and process CPU time are both
    reported (CPU time ignores time the process spent preempted).
    ``microbatches`` > 1 makes plain PyTorch accumulate over as many slices."""
    from placer.runtime.engine import row_bounds
    from placer.runtime.run import Runner
    torch.set_num_threads(threads)
    module, inputs = _build(model, batch, seq, **config)
    ref = copy.deepcopy(module)
    opt = torch.optim.SGD(ref.parameters(), lr=1e-3)
    rows = [b - a for a, b in row_bounds(batch, microbatches)]

    def plain_step():
        opt.zero_grad(set_to_none=True)
        start = 0
        for n in rows:
            part = [t[start:start + n] for t in inputs]
            (placer.runtime.default_loss(ref(*part)) * (n / batch)).backward()
            start += n
        opt.step()

    graph = placer.trace(module, inputs)
    plan = placer.Plan({op: ["cpu"] for op in graph.ids}, microbatches=microbatches)
    runner = Runner(module, plan, inputs, graph=graph,
                    optimizer=functools.partial(torch.optim.SGD, lr=1e-3))
    pairs = []
    for i in range(steps + 3):
        wall_a, cpu_a = _timed(plain_step)
        wall_b, cpu_b = _timed(lambda: runner.step())
        if i >= 3:
            pairs.append((wall_a, wall_b, cpu_a, cpu_b))
    med = statistics.median
    return {"plain": med(p[0] for p in pairs), "placed": med(p[1] for p in pairs),
            "overhead": med(p[1] / p[0] for p in pairs) - 1,
            "plain_cpu": med(p[2] for p in pairs), "placed_cpu": med(p[3] for p in pairs),
            "overhead_cpu": med(p[3] / p[2] for p in pairs) - 1,
            "microbatches": microbatches, "steps": steps, "load": _load()}


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _load() -> float:
    """The 1-minute load average (how busy the machine was), or -1."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return -1.0


def _pingpong_child(rank, world, port, sizes, out):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    res = {}
    for size in sizes:
        buf = torch.zeros(size // 4)
        ts = []
        for _ in range(20):
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            ts.append((time.perf_counter() - start) / 2)
        res[size] = statistics.median(ts)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def measure_link() -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of gloo between two local processes."""
    import torch.multiprocessing as mp
    from placer.runtime.launch import free_port
    sizes = [64, 4 << 20]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "link.json")
        mp.start_processes(_pingpong_child, args=(2, free_port(), sizes, out), nprocs=2,
                           start_method="spawn")
        with open(out) as f:
            res = {int(k): v for k, v in json.load(f).items()}
    latency = res[sizes[0]]
    bandwidth = (sizes[1] - sizes[0]) / max(res[sizes[1]] - latency, 1e-9)
    return bandwidth, latency


def accuracy(plans: int = 4, nproc: int = 2, model: str = MODEL, batch: int | None = None,
             seq: int | None = None, steps: int = 20, microbatches: int = 2, seed: int = 0,
             pin: str = "on", size: str = "tiny") -> dict:
    """Predicted vs measured step time of random plans on ``nproc`` CPU ranks
    (one torch thread each). Each run calibrates first, in its own ranks and
    before its steps (op times and the links between the ranks, see
    :func:`placer.runtime.dist.run_rank`), so the prediction comes from
    microbenchmarks, never from the steps it predicts. ``pin``: "on" (each
    rank on its own core, :func:`placer.runtime.dist.pin_cores`), "off", or
    "both" (every plan unpinned, then pinned, back to back: the two see
    about the same load); the result has a median per setting. ``size``: a
    key of :data:`SIZES` (``batch``/``seq`` override its)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    from runtime_helpers import random_plan
    from placer.runtime.launch import launch
    b, q, config = SIZES[size]
    build = functools.partial(_build, model, batch or b, seq or q, **config)
    module, inputs = build()
    graph = placer.trace(module, inputs)
    names = [f"r{i}" for i in range(nproc)]
    settings = {"on": [True], "off": [False], "both": [False, True]}[pin]
    rows = []
    for k in range(plans):
        plan = random_plan(graph, names, seed=seed + k, microbatches=microbatches,
                           segments=3, max_group=nproc)
        for pinned in settings:
            load = _load()
            result = launch(plan, build, steps=steps, warmup=2, timeout=300, calibrate=True,
                            threads=1, pin=pinned)
            rows.append(_row(k, plan, result, load) | {"pinned": pinned})
    med = statistics.median
    out = {"nproc": nproc, "pin": pin, "size": size, "plans": rows,
           "median_abs_error": med(abs(r["error"]) for r in rows),
           "median_abs_error_model": med(abs(r["error_model"]) for r in rows),
           # had the prediction been multiplied by the host's speed drift
           "median_abs_error_drift": med(abs(r["error_drift"]) for r in rows)}
    if len(settings) > 1:
        for pinned in settings:
            out[f"median_abs_error_{'pinned' if pinned else 'unpinned'}"] = med(
                abs(r["error"]) for r in rows if r["pinned"] == pinned)
    return out


def _row(k, plan, result, load) -> dict:
    from placer.runtime.contention import predict_shared
    from placer.runtime.calibration import calibrated_options
    rep, cal = result["report"], result["calibration"]
    measured, predicted = rep["step_time"], rep["predicted"]
    # the same calibration without contention: every rank at its share alone
    cc = placer.Cluster.from_dict(cal["cluster"])
    for dev in cc.devices:
        dev.extra["cpu_share_all"] = dev.extra.get("cpu_share", 1.0)
    cg = placer.Graph.from_dict(cal["graph"])
    options = calibrated_options(cal)
    drift = cal.get("speed_drift", 1.0)
    factor = cal.get("reference_factor", 1.0)
    alone = predict_shared(cg, cc, plan, **options).step_time * factor
    # the same calibration without the synchronisation delay
    lat = cc.latency.copy()
    names = [d.name for d in cc.devices]
    for pair, link in cal["links"].items():
        i, j = (names.index(n) for n in pair.split("-"))
        lat[i, j] = lat[j, i] = link["latency"]
    nosync = placer.Cluster.from_dict(cal["cluster"])
    nosync = placer.Cluster(nosync.name, nosync.devices, nosync.bandwidth, lat,
                            meta=nosync.meta)
    no_sync = predict_shared(cg, nosync, plan, **options).step_time * factor
    model = cal.get("predicted_model", predicted)
    link = next(iter(cal["links"].values()), {"bandwidth": None, "latency": None})
    return {"plan": k, "devices": sorted(plan.devices_used()),
            "microbatches": plan.microbatches, "predicted": predicted, "measured": measured,
            "error": (predicted - measured) / measured, "load": load,
            # the simulator alone, before the reference pipeline's factor
            "predicted_model": model, "error_model": (model - measured) / measured,
            "reference_factor": factor,
            "reference_factor_raw": cal.get("reference_factor_raw"), "speed_drift": drift,
            "error_drift": (predicted * drift - measured) / measured,
            **options,
            "link_bandwidth": link["bandwidth"],
            "link_latency": link["latency"], "cpu_share": cal.get("cpu_share"),
            "cpu_share_all": cal.get("cpu_share_all"), "cpu_shares": cal.get("cpu_shares"),
            "predicted_alone": alone, "error_alone": (alone - measured) / measured,
            "sync_delay": link.get("sync_delay"), "predicted_no_sync": no_sync,
            "error_no_sync": (no_sync - measured) / measured}


# --------------------------------------------------------------------------
# network namespaces
# --------------------------------------------------------------------------
def _sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class Namespaces:
    """``n`` namespaces ``{prefix}{i}`` at 10.231.0.(i+1), a bridge namespace
    ``{prefix}br``, veth pairs with ``tc tbf`` at ``rate`` on both ends.
    A context manager: everything it made is deleted on exit."""

    def __init__(self, n: int, rate: str = "200mbit", prefix: str = "plr"):
        self.n, self.rate, self.prefix = n, rate, prefix
        self.names = [f"{prefix}{i}" for i in range(n)]
        self.bridge = f"{prefix}br"

    def address(self, i: int) -> str:
        return f"10.231.0.{i + 1}"

    def __enter__(self):
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
            raise PermissionError("network namespaces need root, ip and tc")
        self._delete()   # leftovers of a run that was killed before it cleaned up
        # a SIGTERM (timeout, CI cancel) unwinds through __exit__ like an error
        self._old_term = signal.signal(signal.SIGTERM, _raise_exit) \
            if threading.current_thread() is threading.main_thread() else None
        try:
            _sh("ip", "netns", "add", self.bridge)
            _sh("ip", "netns", "exec", self.bridge, "ip", "link", "add", "br0", "type", "bridge")
            _sh("ip", "netns", "exec", self.bridge, "ip", "link", "set", "br0", "up")
            for i, ns in enumerate(self.names):
                _sh("ip", "netns", "add", ns)
                a, b = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
                _sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
                _sh("ip", "link", "set", a, "netns", ns)
                _sh("ip", "link", "set", b, "netns", self.bridge)
                _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(i)}/24",
                    "dev", a)
                _sh("ip", "netns", "exec", ns, "ip", "link", "set", a, "up")
                _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                _sh("ip", "netns", "exec", self.bridge, "ip", "link", "set", b, "master", "br0")
                _sh("ip", "netns", "exec", self.bridge, "ip", "link", "set", b, "up")
                for where, dev in ((ns, a), (self.bridge, b)):
                    _sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root",
                        "tbf", "rate", self.rate, "burst", "64kb", "latency", "400ms")
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        self._delete()
        if getattr(self, "_old_term", None) is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None
        return False

    def _delete(self) -> None:
        """Remove the namespaces (their veth ends and qdiscs go with them)."""
        for ns in [*self.names, self.bridge]:
            _sh("ip", "netns", "del", ns, check=False)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def _rate_bytes(rate: str) -> float:
    units = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * f
    return float(rate)


def _launch_in(nets, plan, tmp: str, tag: str, *, model: str, batch: int, seq: int,
               steps: int, timeout: float, pin: bool = True) -> dict:
    """Run ``plan`` with one rank per namespace (rank i in namespace i) and
    ``--calibrate``; returns rank 0's written report."""
    from placer.runtime.ranks import rank_devices
    world = len(rank_devices(plan))
    plan_path = os.path.join(tmp, f"{tag}.plan.json")
    plan.save(plan_path)
    out = os.path.join(tmp, f"{tag}.out.json")
    port = str(29531 + sum(map(ord, tag)) % 400)
    procs = []
    try:
        for i in range(world):
            env = dict(os.environ, MASTER_ADDR=nets.address(0), MASTER_PORT=port,
                       RANK=str(i), WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
                       LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(world),
                       GLOO_SOCKET_IFNAME=f"{nets.prefix}v{i}")
            cmd = ["ip", "netns", "exec", nets.names[i], sys.executable, "-m",
                   "placer.runtime.dist", plan_path, "--model", model, "--batch", str(batch),
                   "--seq", str(seq), "--steps", str(steps), "--warmup", "2", "--calibrate",
                   "--timeout", str(timeout), "--config", json.dumps(CONFIG),
                   "--threads", "1", "--pin", "on" if pin else "off"]
            if i == 0:
                cmd += ["-o", out]
            log = open(os.path.join(tmp, f"{tag}.rank{i}.log"), "w")
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          text=True))
            log.close()
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the {tag} plan's ranks did not finish within "
                                   f"{timeout:.0f} s; last lines: " + " | ".join(
                                       _tail(os.path.join(tmp, f"{tag}.rank{i}.log"))
                                       for i in range(world))) from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if procs[0].returncode != 0:
        with open(os.path.join(tmp, f"{tag}.rank0.log")) as f:
            err = f.read().strip().splitlines()
        raise RuntimeError(f"rank 0 of the {tag} plan failed: {err[-1] if err else '?'}")
    with open(out) as f:
        return json.load(f)


def _tail(path: str, lines: int = 3) -> str:
    """The last lines of a rank's log (for an error message)."""
    try:
        with open(path) as f:
            return " / ".join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _naive_plan(graph, names: list[str], microbatches: int):
    """Consecutive ops cut into equal-FLOP stages, one per device (what one
    would write by hand without a cost model)."""
    order = graph.topological_order()
    work = [graph.op(o).flops + graph.op(o).bwd_flops for o in order]
    total = sum(work) or 1.0
    placement, acc = {}, 0.0
    for op_id, w in zip(order, work):
        stage = min(int(acc / total * len(names)), len(names) - 1)
        placement[op_id] = [names[stage]]
        acc += w
    for members in graph.colocation_groups().values():
        for op_id in members[1:]:
            placement[op_id] = list(placement[members[0]])
    return placer.Plan(placement, microbatches=microbatches, schedule="1f1b")


def netns(nproc: int = 2, rate: str = "100mbit", model: str = MODEL, batch: int = 8,
          seq: int = 32, steps: int = 5, microbatches: int = 2, seed: int = 0,
          search_seconds: float = 20.0, timeout: float = 300.0, rounds: int = 1,
          pin: bool = True) -> dict:
    """An emulated decentralized cluster: ranks in namespaces behind ``tc
    tbf`` links at ``rate``. Runs a naive plan (equal-FLOP pipeline stages),
    whose ranks calibrate first (op times, links); searches an optimized
    plan on that calibrated graph and cluster; runs it (calibrating again).
    Then both run again, alternately, ``rounds`` times in all (the load of a
    shared host drifts between runs: a pair run back to back sees about the
    same). Reports every run's measured and predicted step times, each
    pair's measured vs predicted speedup of the optimized plan over the
    naive one, and their medians. ``pin``: each rank on a core of its own."""
    from placer.runtime.contention import predict_shared
    from placer.runtime.calibration import calibrated_options
    module, inputs = _build(model, batch, seq)
    graph = placer.trace(module, inputs)
    names = [f"r{i}" for i in range(nproc)]
    naive = _naive_plan(graph, names, microbatches)
    pairs = []
    with Namespaces(nproc, rate) as nets, tempfile.TemporaryDirectory() as tmp:
        best = None
        for k in range(max(1, rounds)):
            load_naive = _load()
            first = _launch_in(nets, naive, tmp, f"naive{k}", model=model, batch=batch,
                               seq=seq, steps=steps, timeout=timeout, pin=pin)
            if best is None:
                cal = first["calibration"]
                cg = placer.Graph.from_dict(cal["graph"])
                cc = placer.Cluster.from_dict(cal["cluster"])
                options = calibrated_options(cal)
                best = placer.optimize(cg, cc, "evolution", seed=seed,
                                       time_budget=search_seconds, problem_options=options,
                                       microbatches=[m for m in (1, 2, 4) if m <= batch])
                # the optimized plan predicted on the naive run's calibration, too
                best_on_first = predict_shared(cg, cc, best, **options).step_time * \
                    cal.get("reference_factor", 1.0)
                first_pred = first["predicted"]
            load_opt = _load()
            second = _launch_in(nets, best, tmp, f"optimized{k}", model=model, batch=batch,
                                seq=seq, steps=steps, timeout=timeout, pin=pin)
            pairs.append([_netns_row("naive", naive, first, load_naive),
                          _netns_row("optimized", best, second, load_opt)])
    rows = [r for pair in pairs for r in pair]
    measured = [a["measured"] / b["measured"] for a, b in pairs]
    predicted = [a["predicted"] / b["predicted"] for a, b in pairs]
    errors = [(p - m) / m for p, m in zip(predicted, measured)]
    med = statistics.median
    return {"rate": rate, "rate_bytes_per_s": _rate_bytes(rate), "plans": rows,
            "speedups": [{"measured": m, "predicted": p, "error": e}
                         for m, p, e in zip(measured, predicted, errors)],
            "speedup_measured": med(measured), "speedup_predicted": med(predicted),
            "speedup_predicted_one_calibration": first_pred / best_on_first,
            "speedup_error": med(errors),
            "link": {k: {"bandwidth": v["bandwidth"], "latency": v["latency"]}
                     for k, v in cal["links"].items()},
            "median_abs_error": med(abs(r["error"]) for r in rows)}


def _netns_row(name, plan, rep, load) -> dict:
    measured, predicted = rep["step_time"], rep["predicted"]
    return {"plan": name, "devices": sorted(plan.devices_used()),
            "microbatches": plan.microbatches, "measured": measured, "predicted": predicted,
            "error": (predicted - measured) / measured, "load": load}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m placer.bench.runtime")
    ap.add_argument("what", choices=["overhead", "accuracy", "netns"])
    ap.add_argument("--plans", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--rounds", type=int, default=2, help="netns: runs of each plan, alternately")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES),
                    help="accuracy: the model's size (see SIZES)")
    ap.add_argument("--pin", default="on", choices=["on", "off", "both"],
                    help="ranks on cores of their own (both: accuracy runs every plan "
                         "unpinned, then pinned)")
    ns = ap.parse_args(argv)
    if ns.what == "overhead":
        out = overhead()
    elif ns.what == "accuracy":
        out = accuracy(plans=ns.plans, nproc=ns.nproc, pin=ns.pin, size=ns.size)
    else:
        out = netns(nproc=ns.nproc, rate=ns.rate, rounds=ns.rounds, pin=ns.pin != "off")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

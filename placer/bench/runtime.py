"""Runtime benchmarks: overhead, predicted vs measured, emulated WAN.

- :func:`overhead`: a training step placed on one device vs plain PyTorch.
- :func:`accuracy`: CPU ranks over gloo on this host; the simulator,
  calibrated by :func:`placer.runtime.profile.profile` and a measured link,
  predicts each random plan's step time; returns the errors.
- :func:`netns`: the same, with every rank in its own network namespace,
  joined through a bridge by veth pairs whose egress is rate-limited with
  ``tc tbf`` (needs root; only namespaces and links it creates are touched,
  and removed afterwards). The cluster file says the same rate.

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
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import placer
import placer.runtime
from placer import zoo

MODEL = "gpt-125m"
CONFIG = dict(n_layer=2, n_head=4, d_model=128, vocab=512, max_seq=64)


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
    from placer.runtime.run import Runner
    torch.set_num_threads(threads)
    module, inputs = _build(model, batch, seq, **config)
    ref = copy.deepcopy(module)
    opt = torch.optim.SGD(ref.parameters(), lr=1e-3)
    rows = [b - a for a, b in _row_bounds(batch, microbatches)]

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


def _row_bounds(n: int, k: int) -> list[tuple]:
    from placer.runtime.engine import _bounds
    return _bounds(n, k)


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
    from placer.runtime.dist import _free_port
    sizes = [64, 4 << 20]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "link.json")
        mp.start_processes(_pingpong_child, args=(2, _free_port(), sizes, out), nprocs=2,
                           start_method="spawn")
        with open(out) as f:
            res = {int(k): v for k, v in json.load(f).items()}
    latency = res[sizes[0]]
    bandwidth = (sizes[1] - sizes[0]) / max(res[sizes[1]] - latency, 1e-9)
    return bandwidth, latency


def _calibrate(build, names, bandwidth, latency):
    """Profile in this process on one thread (what each rank gets), then
    describe ``names`` as identical calibrated devices joined by the link."""
    from placer.runtime.profile import calibrated_graph, profile
    torch.set_num_threads(1)
    module, inputs = build()
    local = placer.Cluster.from_rules("here", [placer.Device("cpu", 3.2e10, 1e10)],
                                      default=(1e9, 1e-4))
    graph, cal = profile(module, inputs, cluster=local, repeats=7, warmup=2)
    dev = cal.device("cpu")
    devices = [placer.Device(n, dev.flops, 1e10, efficiency=dev.efficiency) for n in names]
    cluster = placer.Cluster.from_rules("ranks", devices, default=(bandwidth, latency))
    # the calibrated graph, timed for device "cpu", serves every identical rank
    cg = calibrated_graph(graph, cal, "cpu")
    return graph, cg, cluster, dev.extra["op_overhead"]


def accuracy(plans: int = 4, nproc: int = 2, model: str = MODEL, batch: int = 8,
             seq: int = 32, steps: int = 5, microbatches: int = 2, seed: int = 0,
             link: tuple | None = None) -> dict:
    """Predicted vs measured step time of random plans on ``nproc`` CPU ranks."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    from runtime_helpers import random_plan
    from placer.runtime.dist import launch
    build = functools.partial(_build, model, batch, seq)
    module, inputs = build()
    bandwidth, latency = link or measure_link()
    names = [f"r{i}" for i in range(nproc)]
    graph, cg, cluster, ovh = _calibrate(build, names, bandwidth, latency)
    rows = []
    for k in range(plans):
        plan = random_plan(graph, names, seed=seed + k, microbatches=microbatches,
                           segments=3, max_group=nproc)
        predicted = placer.simulate(cg, cluster, plan, op_overhead=ovh, nic="none").step_time
        measured = launch(plan, build, steps=steps, warmup=2, cluster=cluster,
                          timeout=300)["report"]["step_time"]
        rows.append({"plan": k, "predicted": predicted, "measured": measured,
                     "error": (predicted - measured) / measured})
    errors = [abs(r["error"]) for r in rows]
    return {"link": {"bandwidth": bandwidth, "latency": latency}, "plans": rows,
            "median_abs_error": statistics.median(errors)}


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
        for ns in [*self.names, self.bridge]:
            _sh("ip", "netns", "del", ns, check=False)
        return False


def _rate_bytes(rate: str) -> float:
    units = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * f
    return float(rate)


def netns(plans: int = 2, nproc: int = 2, rate: str = "200mbit", model: str = MODEL,
          batch: int = 8, seq: int = 32, steps: int = 3, microbatches: int = 2,
          seed: int = 0, timeout: float = 300.0) -> dict:
    """Ranks in namespaces behind ``tc tbf`` links; predicted vs measured."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    from runtime_helpers import random_plan
    module, inputs = _build(model, batch, seq)
    names = [f"r{i}" for i in range(nproc)]
    bandwidth = _rate_bytes(rate)
    build = functools.partial(_build, model, batch, seq)
    graph, cg, cluster, ovh = _calibrate(build, names, bandwidth, 2e-4)
    rows = []
    with Namespaces(nproc, rate) as nets, tempfile.TemporaryDirectory() as tmp:
        cluster_path = os.path.join(tmp, "cluster.yaml")
        cluster.save(cluster_path)
        for k in range(plans):
            plan = random_plan(graph, names, seed=seed + k, microbatches=microbatches,
                               segments=3, max_group=nproc)
            plan_path = os.path.join(tmp, f"plan{k}.json")
            plan.save(plan_path)
            out = os.path.join(tmp, f"out{k}.json")
            procs = []
            for i, ns in enumerate(nets.names):
                env = dict(os.environ, MASTER_ADDR=nets.address(0), MASTER_PORT="29531",
                           RANK=str(i), WORLD_SIZE=str(nproc), OMP_NUM_THREADS="1",
                           GLOO_SOCKET_IFNAME=f"{nets.prefix}v{i}")
                cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "placer.runtime.dist",
                       plan_path, "--model", model, "--batch", str(batch), "--seq", str(seq),
                       "--cluster", cluster_path, "--steps", str(steps),
                       "--timeout", str(timeout), "--config", json.dumps(CONFIG)]
                if i == 0:
                    cmd += ["-o", out]
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
            try:
                for p in procs:
                    p.wait(timeout=timeout)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            if procs[0].returncode != 0:
                raise RuntimeError(procs[0].stderr.strip().splitlines()[-1])
            with open(out) as f:
                measured = json.load(f)["step_time"]
            predicted = placer.simulate(cg, cluster, plan, op_overhead=ovh,
                                        nic="none").step_time
            rows.append({"plan": k, "predicted": predicted, "measured": measured,
                         "error": (predicted - measured) / measured})
    return {"rate": rate, "plans": rows,
            "median_abs_error": statistics.median(abs(r["error"]) for r in rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m placer.bench.runtime")
    ap.add_argument("what", choices=["overhead", "accuracy", "netns"])
    ap.add_argument("--plans", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rate", default="200mbit")
    ns = ap.parse_args(argv)
    if ns.what == "overhead":
        out = overhead()
    elif ns.what == "accuracy":
        out = accuracy(plans=ns.plans, nproc=ns.nproc)
    else:
        out = netns(plans=ns.plans, nproc=ns.nproc, rate=ns.rate)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

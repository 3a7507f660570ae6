"""``placer bench cost``: speed and agreement of the cost models.

For random graphs of each size on synthetic clusters of each device count it
measures simulations per second, analytical estimates per second (through
``estimate_many`` on the same Plan objects again and again, as a search
re-ranking its population does; on new Plan objects each time, which pays
for reading every op's devices; and through the ``step_times`` array
path), the Kendall rank correlation between the two models' step times over
random plans, and whether the simulator's memory stays flat over many
consecutive estimates. Rates are per CPU second of this process. Run it on
one core for comparable figures, e.g.
``taskset -c 0 env OMP_NUM_THREADS=1 placer bench cost``.
"""

from __future__ import annotations

import gc
import os
import platform
import time
from typing import Callable, Sequence

import numpy as np

from .._io import PathLike, atomic_write_text, dump_json
from ..cluster import Cluster, Device
from ..graph import Edge, Graph, Op
from ..groups import GroupTable
from ..plan import Plan

QUICK = {"sizes": (100,), "devices": (4,), "plans": 20, "leak_estimates": 200,
         "seconds": 0.5}


def bench_graph(n: int, seed: int = 0) -> Graph:
    """A seeded random DAG of ``n`` ops (``placer.datasets.random_dag`` when
    available, else a small built-in generator of the same flavour)."""
    try:
        from ..datasets import random_dag
    except ImportError:
        random_dag = None
    if random_dag is not None:
        return random_dag(n, width=8, seed=seed)
    rng = np.random.default_rng([7, seed, n])
    hidden = 1024
    ops, edges = [], []
    for i in range(n):
        tokens = 2048
        flops = float(2 * tokens * hidden * hidden * rng.choice([0.0, 0.25, 1.0, 4.0]))
        params = float(hidden * hidden * 2 if flops else 0.0)
        ops.append(Op(f"op{i}", "matmul" if flops else "add", flops=flops,
                      param_bytes=params, output_bytes=float(tokens * hidden * 2)))
        if i:
            preds = {i - 1}
            if i > 2 and rng.random() < 0.3:
                preds.add(int(rng.integers(max(0, i - 8), i - 1)))
            edges += [Edge(f"op{p}", f"op{i}", float(tokens * hidden * 2)) for p in preds]
    return Graph(f"bench-{n}-s{seed}", ops, edges)


def bench_cluster(devices: int) -> Cluster:
    """A geo-distributed cluster: 2 sites (4 from 32 devices) of fast and
    slow GPUs, fast links inside a site and a slow one between sites."""
    n_sites = 4 if devices >= 32 else (2 if devices >= 2 else 1)
    devs = []
    for i in range(devices):
        site = f"site{i * n_sites // devices}"
        fast = i % 2 == 0
        devs.append(Device(f"g{i}", 3.12e14 if fast else 1.25e14,
                           8e10 if fast else 4e10, site=site,
                           kind="A100-80GB" if fast else "V100-40GB"))
    sites = [(f"site{a}", f"site{b}", 1.25e9, 0.02)
             for a in range(n_sites) for b in range(a + 1, n_sites)]
    return Cluster.from_rules(f"bench-{devices}", devs, default=(1.0e11, 5e-6), sites=sites)


def random_plans(graph: Graph, cluster: Cluster, count: int, *, seed: int = 0,
                 microbatches: int = 8) -> list[Plan]:
    """Plausible random plans: the topological order cut into 1..D stages at
    random points, each stage on one device or a data-parallel group of 2-4,
    a few ops moved to another stage's devices, either schedule."""
    from ..cost import Problem
    problem = Problem(graph, cluster)
    rng = np.random.default_rng([11, seed, len(graph), len(cluster)])
    n, D = problem.n_ops, problem.n_devices
    names = cluster.names
    plans = []
    for _ in range(count):
        stages = int(np.clip(round(D ** rng.uniform(0.0, 1.0)), 1, min(D, n)))
        cuts = np.sort(rng.choice(np.arange(1, n), size=stages - 1, replace=False)) \
            if stages > 1 else np.zeros(0, dtype=int)
        order = rng.permutation(D)
        spare = list(order[stages:])
        groups = []
        for s in range(stages):
            members = [int(order[s])]
            if spare and rng.random() < 0.25:
                extra = int(min(len(spare), rng.integers(1, 4)))
                members += [int(x) for x in spare[:extra]]
                spare = spare[extra:]
            groups.append([names[d] for d in sorted(members)])
        stage = np.searchsorted(cuts, np.arange(n), side="right")
        if stages > 1 and rng.random() < 0.3:
            moved = rng.choice(n, size=max(1, n // 200), replace=False)
            stage[moved] = rng.integers(0, stages, size=len(moved))
        placement = {op_id: list(groups[s]) for op_id, s in zip(problem.ids, stage.tolist())}
        plans.append(Plan(placement, microbatches=microbatches,
                          schedule=str(rng.choice(["gpipe", "1f1b"])), method="random"))
    return plans


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two sequences (ties counted as in tau-b).

    >>> kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]), kendall_tau([1, 2, 3], [3, 2, 1])
    (1.0, -1.0)
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    i, j = np.triu_indices(len(x), 1)
    dx = np.sign(x[i] - x[j])
    dy = np.sign(y[i] - y[j])
    denom = np.sqrt(float(np.sum(dx != 0)) * float(np.sum(dy != 0)))
    return float(np.sum(dx * dy) / denom) if denom > 0 else float("nan")


def _rss() -> float:
    """Resident memory of this process in bytes (Linux; else NaN)."""
    try:
        with open("/proc/self/statm") as f:
            return float(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return float("nan")


def _clock() -> float:
    """CPU seconds of this process: the work is single-threaded, and unlike
    wall time this does not count time the machine gave to other programs."""
    return time.process_time()


def _rate(fn: Callable[[], int], seconds: float) -> float:
    """Calls of ``fn`` (each worth its return count) per second, for at
    least ``seconds`` and at least one call."""
    done = 0
    start = _clock()
    while True:
        done += fn()
        elapsed = _clock() - start
        if elapsed >= seconds:
            return done / elapsed


def _rate_fresh(make: Callable[[], list], fn: Callable[[list], int], seconds: float) -> float:
    """Like :func:`_rate`, each call on a new argument from ``make``, whose
    making is not timed."""
    done = 0
    elapsed = 0.0
    while True:
        arg = make()
        start = _clock()
        done += fn(arg)
        elapsed += _clock() - start
        if elapsed >= seconds:
            return done / elapsed


def _copies(plans: Sequence[Plan]) -> list[Plan]:
    """New Plan objects (and device lists) equal to ``plans``: nothing of
    them is cached anywhere yet."""
    return [Plan({op: list(devices) for op, devices in plan.placement.items()},
                 plan.microbatches, plan.schedule, plan.method) for plan in plans]


def bench_case(n: int, devices: int, plans: int = 200, *, microbatches: int = 8,
               seconds: float = 2.0, seed: int = 0) -> dict:
    """Figures for one graph size and device count."""
    from ..cost import Analytical, Problem, Simulator
    graph = bench_graph(n, seed)
    cluster = bench_cluster(devices)
    problem = Problem(graph, cluster)
    batch = random_plans(graph, cluster, plans, seed=seed, microbatches=microbatches)
    sim, ana = Simulator(), Analytical()
    sim_reports = []
    from ..cost.warmup import warm_up
    warm_up()                    # compiled kernels load (or compile) untimed
    t0 = _clock()
    for plan in batch:
        sim_reports.append(sim.estimate(problem, plan))
    sim_elapsed = _clock() - t0
    ana_reports = ana.estimate_many(problem, batch)
    table = GroupTable(problem.n_devices)
    arrays = np.stack([problem.compile(p, table).op_group for p in batch])
    groups = problem.compile(batch[-1], table).groups[problem.n_devices:]
    schedules = np.array([p.schedule for p in batch])
    ana_rate = _rate(lambda: len(ana.estimate_many(problem, batch)), seconds)
    fresh_rate = _rate_fresh(lambda: _copies(batch),
                             lambda fresh: len(ana.estimate_many(problem, fresh)), seconds)

    def arrays_once():
        for schedule in ("gpipe", "1f1b"):
            rows = arrays[schedules == schedule]
            if len(rows):
                ana.step_times(problem, rows, groups=groups, microbatches=microbatches,
                               schedule=schedule)
        return len(arrays)

    array_rate = _rate(arrays_once, seconds)
    sim_times = [r.step_time for r in sim_reports]
    ana_times = [r.step_time for r in ana_reports]
    sim_rate = len(batch) / sim_elapsed
    return {"ops": n, "edges": graph.totals()["edges"], "devices": devices,
            "microbatches": microbatches, "plans": plans, "sim_per_s": sim_rate,
            "analytical_per_s": ana_rate, "analytical_fresh_per_s": fresh_rate,
            "analytical_array_per_s": array_rate,
            "speedup": ana_rate / sim_rate, "array_speedup": array_rate / sim_rate,
            "kendall_tau": kendall_tau(sim_times, ana_times),
            "feasible_agreement": float(np.mean([a.feasible == b.feasible for a, b
                                                 in zip(sim_reports, ana_reports)])),
            "median_ratio": float(np.median(np.array(ana_times) / np.array(sim_times)))}


def memory_flat(n: int = 1000, devices: int = 16, estimates: int = 10_000, *,
                microbatches: int = 8, seed: int = 0) -> dict:
    """Resident memory after the first tenth and after all of ``estimates``
    consecutive simulator estimates over a cycle of random plans."""
    from ..cost import Problem, Simulator
    graph = bench_graph(n, seed)
    cluster = bench_cluster(devices)
    problem = Problem(graph, cluster)
    batch = random_plans(graph, cluster, 50, seed=seed + 1, microbatches=microbatches)
    sim = Simulator()
    warm = max(1, estimates // 10)
    start = time.perf_counter()
    for i in range(warm):
        sim.estimate(problem, batch[i % len(batch)])
    gc.collect()
    before = _rss()
    for i in range(warm, estimates):
        sim.estimate(problem, batch[i % len(batch)])
    gc.collect()
    after = _rss()
    return {"ops": n, "devices": devices, "estimates": estimates,
            "rss_after_warmup": before, "rss_after_all": after,
            "growth_bytes": after - before, "seconds": time.perf_counter() - start}


def bench_cost(sizes: Sequence[int] = (100, 1000, 10_000),
               devices: Sequence[int] = (4, 16, 64), plans: int = 200, *,
               out: PathLike | None = "bench-cost.json", progress: bool = True,
               quick: bool = False, leak_estimates: int = 10_000,
               seconds: float = 2.0, microbatches: int = 8) -> dict:
    """Run the cost-model benchmark, print a table and write JSON (atomically)
    to ``out`` (None: don't write). ``quick`` runs a small version for tests."""
    if quick:
        sizes, devices, plans = QUICK["sizes"], QUICK["devices"], QUICK["plans"]
        leak_estimates, seconds = QUICK["leak_estimates"], QUICK["seconds"]
    rows = []
    header = (f"{'ops':>6} {'devices':>7} {'sim/s':>9} {'analytical/s':>13} {'fresh/s':>9} "
              f"{'array/s':>10} {'speedup':>8} {'tau':>6} {'feas.agree':>10}")
    if progress:
        print(header, flush=True)
    for n in sizes:
        for d in devices:
            row = bench_case(n, d, plans, microbatches=microbatches, seconds=seconds)
            rows.append(row)
            if progress:
                print(f"{n:>6} {d:>7} {row['sim_per_s']:>9.1f} "
                      f"{row['analytical_per_s']:>13.0f} {row['analytical_fresh_per_s']:>9.0f} "
                      f"{row['analytical_array_per_s']:>10.0f} "
                      f"{row['speedup']:>7.0f}x {row['kendall_tau']:>6.3f} "
                      f"{row['feasible_agreement']:>10.0%}", flush=True)
    leak = None
    if leak_estimates:
        n_leak = 1000 if not quick else sizes[0]
        d_leak = 16 if not quick else devices[0]
        leak = memory_flat(n_leak, d_leak, leak_estimates, microbatches=microbatches)
        if progress:
            print(f"memory over {leak['estimates']} simulator estimates "
                  f"({leak['ops']} ops, {leak['devices']} devices): "
                  f"{leak['rss_after_warmup'] / 1e6:.1f} MB -> "
                  f"{leak['rss_after_all'] / 1e6:.1f} MB", flush=True)
    result = {"benchmark": "cost", "python": platform.python_version(),
              "machine": platform.machine(), "cpus": os.cpu_count(),
              "threads": os.environ.get("OMP_NUM_THREADS"), "clock": "process_time",
              "rows": rows,
              "memory": leak,
              "targets": {"sim_per_s_1000ops_16dev": 100, "analytical_per_s": 20_000,
                          "kendall_tau": 0.9}}
    if out is not None:
        atomic_write_text(out, dump_json(result))
        if progress:
            print(f"wrote {out}")
    return result

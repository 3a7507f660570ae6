"""The simulator's event loop against an older version of itself.

Loads ``placer/cost/event_loop.py`` as it was at a git revision next to the
current one and runs both in one process:

- ``check`` (default): random plans of shipped graphs and clusters (both
  schedules, data-parallel groups, recompute on and off, inference, runtime
  pieces, a link with a burst) through ``Simulator.estimate`` with each
  kernel; the kernel's outputs (task and transfer starts, all-reduce starts
  and ends, end time, tasks never run) and every ``Report`` field must be
  bit-identical.
- ``--time``: the kernel alone (on the arguments the simulator passed it,
  each call's fastest of five), the simulator's batch path (``step_times``)
  and single ``estimate`` calls (each the fastest of three), the two
  kernels alternated; prints the new/old ratio's median and spread per
  problem.
- ``--compile``: the first call's compile time of each kernel, in fresh
  processes with an empty numba cache.

    python scripts/event_loop_check.py --against HEAD~1 --plans 100
    python scripts/event_loop_check.py --against HEAD~1 --time --repeats 7
    python scripts/event_loop_check.py --against HEAD~1 --compile --repeats 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import placer.cost.event_loop as current  # noqa: E402
from placer import datasets  # noqa: E402
from placer.bench.cost import bench_cluster, bench_graph, random_plans  # noqa: E402
from placer.cost import Problem, Simulator  # noqa: E402
from placer.graph import Graph  # noqa: E402
from placer.groups import GroupTable  # noqa: E402

#: (graph, cluster, microbatches, Problem options); a graph name ending in
#: ``!`` is run as inference
PROBLEMS = [
    ("gpt-125m.op", "two-sites", 8, {}),
    ("bert-base.module", "hetero-lab", 4, {"recompute": True}),
    ("resnet50.op", "a100x8", 1, {"resume_overhead": 2e-5}),
    ("inception.module", "dtfm-regional", 4, {"allreduce_overlap": False}),
    ("unet.op", "edge-wireless", 4, {"link_burst": 64e3, "recompute": True}),
    ("moe.op", "ib-4x8-a100", 8, {"bucket_bytes": 4e6}),
    ("dlrm.module!", "dtfm-worldwide", 4, {}),
    ("utransformer.module", "two-sites", 6, {"granularity": "piece", "task_overhead": 1e-4,
                                             "message_overhead": 5e-5}),
    ("bench-120", "bench-16", 8, {"link_burst": 1e6, "resume_overhead": 1e-5}),
]


def reference(rev: str, workdir: str):
    """``placer/cost/event_loop.py`` at ``rev``, imported as its own module."""
    source = subprocess.run(["git", "show", f"{rev}:placer/cost/event_loop.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    # the project's own source at a revision the developer names: imported
    # as a module of the work folder, under a fixed name
    (Path(workdir) / "event_loop_reference.py").write_text(source)
    sys.path.insert(0, str(workdir))
    try:
        return importlib.import_module("event_loop_reference")
    finally:
        sys.path.remove(str(workdir))


def problem(spec) -> Problem:
    """The Problem of one PROBLEMS row."""
    gname, cname, _mb, options = spec
    if gname.startswith("bench-"):
        graph = bench_graph(int(gname.split("-")[1]), 3)
        cluster = bench_cluster(int(cname.split("-")[1]))
    else:
        graph = datasets.graph(gname.rstrip("!"))
        if gname.endswith("!"):
            graph = Graph.from_dict({**graph.to_dict(), "training": False})
        cluster = datasets.cluster(cname)
    return Problem(graph, cluster, **options)


class Kernel:
    """Calls one module's ``run_events`` in the simulator's place and keeps
    what it returned and wrote."""

    def __init__(self, module):
        self.module = module
        self.out = None

    def __call__(self, *args):
        result = self.module.run_events(*args)
        start, x_start, ar_s, ar_e = args[33:37]
        self.out = [np.asarray(result[0]).tobytes(), int(result[1]),
                    start.tobytes(), x_start.tobytes(), ar_s.tobytes(), ar_e.tobytes()]
        return result


def use(kernel):
    """Make the simulator call ``kernel`` (``simulator._run`` imports
    ``run_events`` from the module at each call)."""
    current.run_events = kernel


def check(ref, plans: int) -> int:
    """Compare both kernels on every problem; returns the plans that differ."""
    original = current.run_events
    old, new = Kernel(ref), Kernel(type("m", (), {"run_events": staticmethod(original)}))
    bad = compared = 0
    try:
        for spec in PROBLEMS:
            p = problem(spec)
            feasible = 0
            for plan in random_plans(p.graph, p.cluster, plans, seed=len(spec[0]),
                                     microbatches=spec[2]):
                reports = []
                for kernel in (old, new):
                    use(kernel)
                    reports.append(repr(Simulator().estimate(p, plan)))
                compared += 1
                feasible += "feasible=True" in reports[1]
                if reports[0] != reports[1] or old.out != new.out:
                    bad += 1
            print(f"{spec[0]:22s} {spec[1]:16s} mb {spec[2]} {json.dumps(spec[3])}: "
                  f"{plans} plans ({feasible} feasible), differing so far {bad}", flush=True)
    finally:
        use(original)
    print(f"{plans} plans x {len(PROBLEMS)} problems ({compared} in all) compared; "
          f"{bad} differ")
    return bad


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timing(ref, plans: int, repeats: int, same: bool = False) -> None:
    """Median new/old ratios (and their spread over repeats), alternating;
    ``same``: the old kernel on both sides (the noise floor)."""
    original = current.run_events
    kernels = {"old": ref.run_events, "new": ref.run_events if same else original}
    try:
        for spec in PROBLEMS:
            p = problem(spec)
            sample = random_plans(p.graph, p.cluster, plans, seed=1, microbatches=spec[2])
            sample = [pl for pl in sample if pl.schedule == "1f1b"] or sample
            table = GroupTable(p.n_devices)
            rows = np.stack([p.compile(pl, table).op_group for pl in sample])
            groups = p.compile(sample[-1], table).groups[p.n_devices:]
            ratios = {"kernel": [], "batch": [], "estimate": []}
            calls = []
            use(lambda *a: calls.append([x.copy() if isinstance(x, np.ndarray) else x
                                         for x in a]) or original(*a))
            for pl in sample:
                Simulator().estimate(p, pl)
            for name in kernels:                # compile or load both, untimed
                use(kernels[name])
                Simulator().estimate(p, sample[0])
            for r in range(repeats):
                t = {}
                for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    # each call's fastest of five (on fresh copies): a call
                    # takes microseconds, so one preemption would swamp a sum
                    fresh = [[[x.copy() if isinstance(x, np.ndarray) else x for x in a]
                              for _ in range(5)] for a in calls]
                    t[name, "kernel"] = sum(min(_timed(lambda: kernels[name](*f)) for f in copies)
                                            for copies in fresh)
                    use(kernels[name])
                    t[name, "estimate"] = min(_timed(
                        lambda: [Simulator().estimate(p, pl) for pl in sample])
                        for _ in range(3))
                    t[name, "batch"] = min(_timed(lambda: Simulator().step_times(
                        p, rows, groups=groups, microbatches=spec[2],
                        schedule=sample[0].schedule)) for _ in range(3))
                for what in ratios:
                    ratios[what].append(t["new", what] / t["old", what])
            line = " ".join(f"{k} {statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
                            for k, v in ratios.items())
            print(f"{spec[0]:22s} {spec[1]:16s} new/old {line}", flush=True)
    finally:
        use(original)


_COMPILE = """
import sys, time, numpy as np
sys.path.insert(0, {root!r})
import importlib.util
spec = importlib.util.spec_from_file_location("k", {path!r})
k = importlib.util.module_from_spec(spec); spec.loader.exec_module(k)
import placer.cost.event_loop as cur
cur.segment_heads(np.zeros(1, np.int64), np.zeros(1, np.bool_), np.zeros(1, np.bool_),
                  np.zeros(1), np.zeros(1))
from placer.bench.cost import bench_graph, bench_cluster, random_plans
from placer.cost import Problem, Simulator
g, c = bench_graph(30, 1), bench_cluster(4)
p = Problem(g, c)
plan = random_plans(g, c, 1, seed=2, microbatches=2)[0]
cur.run_events = k.run_events
times = []
for _ in range(2):
    t0 = time.perf_counter(); Simulator().estimate(p, plan); times.append(time.perf_counter() - t0)
print(times[0] - times[1])
"""


def compile_times(ref, repeats: int, workdir: str) -> None:
    """First-call compile seconds of each kernel, fresh processes, empty caches."""
    paths = {"old": ref.__file__, "new": current.__file__}
    seconds = {"old": [], "new": []}
    for r in range(repeats):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            with tempfile.TemporaryDirectory(dir=workdir) as cache:
                env = dict(os.environ, NUMBA_CACHE_DIR=cache)
                # the new kernel's folder may hold a cache already: copy it away
                src = Path(cache) / f"{name}.py"
                src.write_text(Path(paths[name]).read_text())
                out = subprocess.run([sys.executable, "-c", _COMPILE.format(
                    root=str(ROOT), path=str(src))], env=env, capture_output=True, text=True,
                    check=True).stdout
                seconds[name].append(float(out.split()[-1]))
    for name, v in seconds.items():
        print(f"{name}: first call compiles in {statistics.median(v):.2f} s "
              f"[{min(v):.2f}-{max(v):.2f}] over {len(v)} fresh processes")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="HEAD", help="git revision of the old kernel")
    parser.add_argument("--plans", type=int, default=100, help="plans per problem")
    parser.add_argument("--time", action="store_true", help="time both kernels")
    parser.add_argument("--compile", action="store_true", help="time both kernels' compile")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--same", action="store_true",
                        help="with --time: the old kernel on both sides (noise floor)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        ref = reference(args.against, workdir)
        if args.compile:
            compile_times(ref, args.repeats, workdir)
            return 0
        if args.time:
            timing(ref, args.plans, args.repeats, args.same)
            return 0
        return 1 if check(ref, args.plans) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile placer's numba kernels once, ahead of the first plan.

The cost models' inner loops (the simulator's event loop, the analytical
model's path and link sums) and the GNN policy's decoder are numba
functions with ``cache=True``: the first process that calls one compiles it
(about 15 s for all of them on a laptop core) and writes the machine code
beside the source (``__pycache__/*.nbi``, ``*.nbc``; numba's user-wide
cache directory, or ``NUMBA_CACHE_DIR``, when the package folder is
read-only); later processes load it in a fraction of a second.
:func:`warmup` runs tiny problems through every kernel so that cost is paid
by ``placer warmup`` (or the first command, which says so on stderr) and not
inside a search's time budget.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


def kernels(policy: bool = True) -> list:
    """The numba dispatchers of the cost models (and of the GNN policy's
    decoder when ``policy``)."""
    from numba.core.registry import CPUDispatcher

    from .cost import analytical_loops, event_loop
    modules = [event_loop, analytical_loops]
    if policy:
        from gnn import decode_loops
        modules.append(decode_loops)
    return [v for m in modules for v in vars(m).values()
            if isinstance(v, CPUDispatcher) and v.__module__ == m.__name__]


def _cached(dispatcher) -> bool:
    """Whether numba has this kernel's machine code on disk for its current
    source (the cache index exists and is not older than the source)."""
    cache = getattr(dispatcher, "_cache", None)
    index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    if not index or not os.path.exists(index):
        return False
    source = sys.modules[dispatcher.__module__].__file__
    return os.path.getmtime(index) >= os.path.getmtime(source)


def uncompiled(policy: bool = True) -> list[str]:
    """Names of the kernels the next call would compile rather than load."""
    return [f"{d.__module__}.{d.__name__}" for d in kernels(policy) if not _cached(d)]


def _tiny_problem():
    """A small training graph with a branch, and two sites of two devices."""
    from .cluster import Cluster, Device
    from .graph import Edge, Graph, Op
    ops = [Op("x", "input", output_bytes=4096)]
    ops += [Op(f"l{i}", "linear", flops=2e9, param_bytes=4e6, output_bytes=8192)
            for i in range(6)]
    ops += [Op("side", "linear", flops=1e9, param_bytes=1e6, output_bytes=8192),
            Op("add", "add", flops=1e6, output_bytes=8192)]
    edges = [Edge("x", "l0", 4096)] + [Edge(f"l{i}", f"l{i + 1}", 8192) for i in range(5)]
    edges += [Edge("l2", "side", 8192), Edge("side", "add", 8192), Edge("l5", "add", 8192)]
    graph = Graph("warmup", ops, edges)
    devices = [Device(f"{s}{i}", flops=1e14 if s == "a" else 5e13, memory=1.6e10, site=s)
               for s in ("a", "b") for i in range(2)]
    cluster = Cluster.from_rules("warmup", devices, default=(1.25e10, 1e-5),
                                 sites=[("a", "b", 1.5e8, 0.035)])
    return graph, cluster


def warmup(policy: bool = True) -> dict:
    """Run every kernel once on a tiny problem, so numba compiles and caches
    them; returns what was compiled and how long it took."""
    from .api import optimize, simulate
    from .cost import Problem, get_cost_model
    from .plan import Plan
    todo = uncompiled(policy)
    start = time.perf_counter()
    graph, cluster = _tiny_problem()
    ids = [op.id for op in graph]
    for schedule in ("gpipe", "1f1b"):
        plan = Plan({op: (["a0"] if k < 4 else ["b0", "b1"] if k < 7 else ["a1"])
                     for k, op in enumerate(ids)}, microbatches=2, schedule=schedule)
        simulate(graph, cluster, plan)
    # the analytical model's longest path over the runtime's pieces
    get_cost_model("analytical").estimate(Problem(graph, cluster, granularity="piece"), plan)
    for method in ("heft", "evolution") + (("rl",) if policy else ()):
        optimize(graph, cluster, method, seed=0, time_budget=None, evaluations=40)
    return {"compiled": todo, "kernels": len(kernels(policy)),
            "seconds": time.perf_counter() - start, "uncompiled_after": uncompiled(policy)}


def warm_if_cold(prog: str, policy: bool = False, stream: TextIO | None = None) -> bool:
    """Before a command's first use of the kernels: when some are not cached
    yet, say so in one line on stderr and compile them now (not inside a
    search's time budget). Returns whether it compiled."""
    cold = uncompiled(policy)
    if not cold:
        return False
    print(f"{prog}: compiling {len(cold)} numba kernels once (about 15 s; cached for "
          "later runs; `placer warmup` does it ahead)", file=stream or sys.stderr, flush=True)
    warmup(policy)
    return True

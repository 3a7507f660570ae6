"""Load the cost models' compiled kernels before a clock starts.

The simulator's event loop and the analytical model's passes are compiled
by numba on their first call in a fresh install (about 10 s, then cached on
disk) and loaded from that cache on the first call in every process (a few
tenths of a second). :func:`warm_up` pays either cost up front, so a search
under a time budget spends its budget searching; a package with kernels of
its own (``gnn``'s decoder) joins it with :func:`on_warm_up`.
"""

from __future__ import annotations

__all__ = ["warm_up", "on_warm_up"]

_DONE = False
_HOOKS: list = []


def on_warm_up(fn):
    """Have :func:`warm_up` also call ``fn`` (once, at its next call);
    usable as a decorator."""
    _HOOKS.append(fn)
    return fn


def warm_up() -> None:
    """Run both cost models once on a tiny plan with a data-parallel stage
    (every compiled kernel, with the argument types searches use) and call
    the hooks of :func:`on_warm_up` not called yet; a no-op after the first
    call in a process but for hooks added since."""
    global _DONE
    while _HOOKS:
        _HOOKS.pop(0)()
    if _DONE:
        return
    from ..cluster import Cluster, Device
    from ..graph import Edge, Graph, Op
    from ..plan import Plan
    from .analytical import Analytical
    from .problem import Problem
    from .simulator import Simulator
    ops = [Op(f"o{i}", flops=1e9, param_bytes=1e6, output_bytes=1e5) for i in range(6)]
    edges = [Edge(f"o{i}", f"o{i + 1}", 1e5) for i in range(5)] + [Edge("o0", "o3", 1e5)]
    cluster = Cluster.from_rules("warm-up", [Device(f"d{i}", 1e12, 1e10) for i in range(3)],
                                 default=(1e9, 1e-5))
    problem = Problem(Graph("warm-up", ops, edges), cluster)
    plans = [Plan({"o0": ["d0"], "o1": ["d0"], "o2": ["d1", "d2"], "o3": ["d1", "d2"],
                   "o4": ["d2"], "o5": ["d0"]}, microbatches=2),
             Plan({f"o{i}": [f"d{i % 3}"] for i in range(6)}, microbatches=2, schedule="gpipe")]
    for plan in plans:
        Simulator().estimate(problem, plan)
    Analytical().estimate_many(problem, plans)
    _DONE = True

"""placer: decide where every part of a deep-learning model runs, then run it.

>>> import placer
>>> cluster = placer.Cluster.preset("two-sites")
>>> len(cluster) > 1
True
"""

from __future__ import annotations

import importlib

from .cluster import Cluster, Device
from .errors import PlacerError
from .graph import Edge, Graph, Op
from .plan import Plan

__version__ = "0.1.0"

# Heavier pieces (torch, the cost model, search) load on first use so that
# `import placer` and the CLI start quickly.
_LAZY = {
    "trace": ("placer.trace", "trace"),
    "simulate": ("placer.api", "simulate"),
    "optimize": ("placer.api", "optimize"),
    "strategies": ("placer.api", "strategies"),
    "run": ("placer.runtime", "run"),
    "launch": ("placer.runtime", "launch"),
    "Report": ("placer.cost", "Report"),
    "Problem": ("placer.cost", "Problem"),
    "CostModel": ("placer.cost", "CostModel"),
    "datasets": ("placer.datasets", None),
    "errors": ("placer.errors", None),
}

__all__ = ["Cluster", "Device", "Edge", "Graph", "Op", "Plan", "PlacerError",
           "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'placer' has no attribute {name!r}")

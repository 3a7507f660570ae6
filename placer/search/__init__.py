"""Search strategies: the interface, the registry and the built-in heuristics.

A strategy is one :class:`Strategy` subclass with a ``name``, registered
with :func:`register_strategy`; :func:`get_strategy` builds one by name and
:func:`optimize` runs it end to end. Built-ins (imported on first use):

- ``single``, ``round_robin``, ``even_pipeline``, ``m_topo``
  (:mod:`placer.search.heuristics`);
- ``heft``, ``m_etf``, ``m_sct`` (:mod:`placer.search.listsched`);
- ``partition`` (:mod:`placer.search.partition`);
- ``pipeline_dp`` (:mod:`placer.search.pipeline_dp`);

and the sibling packages ``evolution`` (``evolution``, ``dtfm``) and
``gnn`` (``rl``, ``hybrid``) register theirs when imported (see
:data:`placer.search.base.LAZY`).

>>> import placer
>>> "heft" in placer.strategies()
True
"""

from __future__ import annotations

from .base import (LAZY, Budget, MeteredCostModel, Progress, Strategy, get_strategy,
                   print_progress, progress_callback, register_lazy, register_strategy,
                   strategies, unregister_strategy)
from .runner import optimize, optimize_with_report

__all__ = ["Budget", "LAZY", "MeteredCostModel", "Progress", "Strategy", "get_strategy",
           "optimize", "optimize_with_report", "print_progress", "progress_callback", "register_lazy",
           "register_strategy", "strategies", "unregister_strategy"]

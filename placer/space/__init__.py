"""The plan space: how a placement is encoded for search and how a search
moves through it, shared by evolution (``evolution``) and the policy
(``gnn``), and below both.

- :mod:`placer.space.arrays`: :class:`PlanArrays`, the one array form of a
  plan every search and the cost models' compile step share;
- :mod:`placer.space.genome`: the encodings (:class:`OpGenome`, one group
  id per op over a :class:`GroupTable` of device sets; :class:`LayoutGenome`,
  stages over the topological order) and :class:`Space`, what the moves
  need to know about one problem, including colocation repair (and
  :func:`compact`, a batch's group ids renumbered for the cost model);
- :mod:`placer.space.moves`: the variation operators (mutations,
  crossover), each with an explicit ``numpy.random.Generator``;
- :mod:`placer.space.local`: the neighbourhood of a genome and the
  steepest descent through it (the memetic step, the policy's polish);
- :mod:`placer.space.layouts`: balanced stage/replica layouts, the seeds
  both start from, and :func:`even_allocation` (the even, Megatron-style
  plan the benchmarks compare with).

Nothing here searches or imports a search: the strategies drive it.
"""

from .arrays import PlanArrays, compact_rows
from .genome import GroupTable, LayoutGenome, OpGenome, Space, compact
from .layouts import device_chain, even_allocation, layout_seeds, shapes_for
from .local import local_search, neighbourhood
from .moves import MUTATIONS, boundary_ops, crossover, mutate

__all__ = ["MUTATIONS", "GroupTable", "LayoutGenome", "OpGenome", "PlanArrays", "Space",
           "boundary_ops", "compact", "compact_rows", "crossover", "device_chain",
           "even_allocation", "layout_seeds", "local_search", "mutate", "neighbourhood",
           "shapes_for"]

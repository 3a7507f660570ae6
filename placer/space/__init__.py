"""The plan space: how a placement is encoded for search and how a search
moves through it, shared by evolution (``evolution``) and the policy
(``gnn``), and below both.

- :mod:`placer.space.genome`: the encodings (:class:`OpGenome`, one group
  id per op over a :class:`GroupTable` of device sets; :class:`LayoutGenome`,
  stages over the topological order) and :class:`Space`, what the moves
  need to know about one problem, including colocation repair;
- :mod:`placer.space.moves`: the variation operators (mutations,
  crossover), each with an explicit ``numpy.random.Generator``;
- :mod:`placer.space.local`: the neighbourhood of a genome and the
  steepest descent through it (the memetic step, the policy's polish).

Nothing here searches or imports a search: the strategies drive it.
"""

from .genome import GroupTable, LayoutGenome, OpGenome, Space, stage_shapes
from .local import local_search, neighbourhood
from .moves import MUTATIONS, boundary_ops, crossover, mutate

__all__ = ["MUTATIONS", "GroupTable", "LayoutGenome", "OpGenome", "Space", "boundary_ops",
           "crossover", "local_search", "mutate", "neighbourhood", "stage_shapes"]

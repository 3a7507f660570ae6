"""Evolutionary searches on deap: the memetic GA (``method="evolution"``),
the decentralized bi-level scheduler of Yuan et al. (``method="dtfm"``)
and the Optuna search of the structured space (``method="optuna"``).

Importing this package registers the strategies; ``placer.search`` knows
them by name and imports this package on first use.

The genomes, operators and memetic moves they search with are the plan
space, :mod:`placer.space`, shared with the policy (``gnn``). Their former
homes stay importable for outside code: ``evolution.genome``,
``evolution.operators`` and ``evolution.memetic`` are the modules
:mod:`placer.space.genome`, :mod:`placer.space.moves` and
:mod:`placer.space.local` under their old names (aliases, not copies, so a
class is the same object under both), and the genome classes are
importable from this package as before.
"""

import sys

from placer.space import GroupTable, LayoutGenome, OpGenome, Space
from placer.search import evaluate
from placer.space import genome, local as memetic, moves as operators

from .search import Evolution
from .dtfm import DTFM
from .optuna_search import OptunaSearch

for _name, _module in (("genome", genome), ("operators", operators), ("memetic", memetic),
                       ("evaluate", evaluate)):
    sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module

__all__ = ["DTFM", "Evolution", "OptunaSearch", "GroupTable", "LayoutGenome", "OpGenome", "Space"]

"""Evolutionary searches on deap: the memetic GA (``method="evolution"``),
the decentralized bi-level scheduler of Yuan et al. (``method="dtfm"``)
and the Optuna search of the structured space (``method="optuna"``).

Importing this package registers the strategies; ``placer.search`` knows
them by name and imports this package on first use.

The genomes, operators and memetic moves they search with are the plan
space, :mod:`placer.space`, shared with the policy (``gnn``), and their
batch scoring is :mod:`placer.search.evaluate`. The former homes stay
importable for outside code: ``evolution.genome``, ``evolution.operators``,
``evolution.memetic`` and ``evolution.evaluate`` are the modules
:mod:`placer.space.genome`, :mod:`placer.space.moves`,
:mod:`placer.space.local` and :mod:`placer.search.evaluate` under their old
names: aliases, not copies, so a class is the same object under both; and
no file stays at the old paths, so git carries edits made to them on
other branches over to the new ones. The genome classes are importable
from this package as before.
"""

import sys

from placer.search import evaluate
from placer.space import GroupTable, LayoutGenome, OpGenome, Space
from placer.space import genome, local as memetic, moves as operators

from .search import Evolution
from .dtfm import DTFM
from .optuna_search import OptunaSearch

for _name, _module in (("genome", genome), ("operators", operators), ("memetic", memetic),
                       ("evaluate", evaluate)):
    sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module

__all__ = ["DTFM", "Evolution", "OptunaSearch", "GroupTable", "LayoutGenome", "OpGenome", "Space"]

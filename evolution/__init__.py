"""Evolutionary searches on deap: genomes, operators, the memetic GA
(``method="evolution"``), the decentralized bi-level scheduler of Yuan et
al. (``method="dtfm"``) and the Optuna search of the structured space
(``method="optuna"``).

Importing this package registers the strategies; ``placer.search`` knows
them by name and imports this package on first use.
"""

from .genome import GroupTable, LayoutGenome, OpGenome, Space
from .search import Evolution
from .dtfm import DTFM
from .optuna_search import OptunaSearch

__all__ = ["DTFM", "Evolution", "OptunaSearch", "GroupTable", "LayoutGenome", "OpGenome", "Space"]

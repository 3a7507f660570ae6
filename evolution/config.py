"""The options of the ``evolution`` strategy, as one frozen dataclass
validated in one place.

``Evolution(**options)`` builds an :class:`EvolutionConfig` from its
keywords; ``Evolution(config=EvolutionConfig(...))`` takes one whole (its
keywords then change single fields). A bad value is a
:class:`~placer.errors.StrategyError` naming the field.

>>> config = EvolutionConfig(population=16)
>>> config.population, config.n_offspring, config.replace(offspring=8).n_offspring
(16, 16, 8)
>>> EvolutionConfig(crossover=2)
Traceback (most recent call last):
...
placer.errors.StrategyError: crossover: crossover must be in [0, 1], got 2
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from typing import Sequence

from placer.errors import StrategyError
from placer.executors import check_backend
from placer.search.evaluate import check_workers

__all__ = ["EvolutionConfig", "DEFAULT_SEEDS", "FIELDS", "validate", "with_config_keywords"]

#: heuristics whose plans seed the population by default
DEFAULT_SEEDS = ("even_pipeline", "heft", "m_sct", "pipeline_dp", "m_etf", "partition",
                 "m_topo", "single")

#: whole-number fields and their least values
_COUNTS = {"population": 2, "tournament": 1, "patience": 1, "final_k": 1, "coarsen_to": 2}
#: how a field's value is stored, by its annotation
_COERCE = {"int": int, "float": float, "bool": bool}
_OPTIONAL_INT = ("offspring", "generations", "given_slots")


@dataclass(frozen=True)
class EvolutionConfig:
    """How :class:`evolution.search.Evolution` searches (see its module doc
    for the algorithm). Whole numbers are stored as ints, shares as floats,
    flags as bools, ``seeds`` as a tuple."""

    #: genomes kept per generation (>= 2)
    population: int = 48
    #: children bred per generation (None or 0: ``population``)
    offspring: int | None = None
    #: tournament size of parent selection (>= 1)
    tournament: int = 3
    #: probability that a pair of parents is crossed over, in [0, 1]
    crossover: float = 0.6
    #: mean number of mutation operators per child
    mutation_rate: float = 1.5
    #: relative weight of each mutation operator by name (missing names keep
    #: :data:`placer.space.moves.MUTATIONS`' weights)
    mutation_weights: dict | None = None
    #: heuristic names whose plans seed the population
    seeds: Sequence[str] | None = DEFAULT_SEEDS
    #: share of the budget the seed heuristics may use, in [0, 1]
    seed_share: float = 0.3
    #: polish the best genome by local search every this many generations (0: never)
    memetic_every: int = 5
    #: rounds of that local search
    memetic_rounds: int = 3
    #: generations without improvement before a restart or the end (>= 1)
    patience: int = 25
    #: after ``patience`` stale generations, while budget is left: polish the
    #: best to convergence, keep the best quarter and refill the population
    #: with heavy mutants of it (3x ``mutation_rate``), this many times
    restarts: int = 4
    #: once converged after those restarts, under a time budget with time
    #: left, start again from the seeds (the hall of fame kept), this many times
    fresh_starts: int = 3
    #: a cap on generations (None: none)
    generations: int | None = None
    #: cost model name for the inner loop; ``"auto"``: the analytical model,
    #: or the simulator itself when a time budget (and no evaluation budget)
    #: leaves room for :data:`evolution.search.EXACT_SCREEN_EVALS` of its
    #: estimates; None: the cost model the search is given
    screen: str | None = "auto"
    #: best distinct plans re-ranked, with each seed heuristic's best, by ``final`` (>= 1)
    final_k: int = 12
    #: cost model name of that ranking (None: the given cost model), whose
    #: choice the given cost model then reports
    final: str | None = "simulator"
    #: share of the time and evaluation budget kept for a local search of the
    #: winner scored by ``final`` (not on coarsened graphs), in [0, 1)
    final_share: float = 0.15
    #: worker processes scoring batches (>= 0), or ``"auto"``: the usable CPUs
    #: (up to 4) when the screening model is the simulator under a time
    #: budget (see :func:`placer.search.evaluate.auto_workers`), else none (on a
    #: Ray ``backend``: the cluster's CPUs); plans never depend on it
    workers: int | str = "auto"
    #: where those workers run: ``"local"`` processes, or a Ray cluster
    #: (``"ray"``, ``"auto"``, ``"ray://HOST:PORT"``; see
    #: :mod:`placer.executors`); plans never depend on it either
    backend: str = "local"
    #: graphs with more ops than this are coarsened first ...
    coarsen_above: int = 1500
    #: ... to about this many ops (>= 2), and the plan expanded back
    coarsen_to: int = 400
    #: seed the population with balanced stage/replica layouts too
    layouts: bool = True
    #: at most this many genomes descended from the ``initial`` plans and
    #: ``candidates`` stay in the population (0: they only compete in the
    #: final ranking; None: no limit); the search's own seeds' descendants
    #: keep their ``population`` slots, so plans handed in can add to the
    #: search but not take its population over; the best of those own
    #: descendants joins the final ranking
    given_slots: int | None = None
    #: draw a tqdm bar with the best step time so far
    progress_bar: bool = False
    #: file the search state is saved to (see the module doc of
    #: :mod:`evolution.search`); None: no checkpoints
    checkpoint: str | os.PathLike | None = None
    #: seconds between checkpoint writes
    checkpoint_every: float = 60.0
    #: continue from ``checkpoint`` (or start afresh if there is none)
    resume: bool = False

    def __post_init__(self):
        validate(self)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            coerce = _COERCE.get(f.type)
            if f.name in _OPTIONAL_INT and value is not None:
                coerce = int
            if coerce is not None:
                try:
                    object.__setattr__(self, f.name, coerce(value))
                except (TypeError, ValueError):
                    raise StrategyError(f"{f.name} must be a number, got {value!r}",
                                        field=f.name) from None
        object.__setattr__(self, "mutation_weights", dict(self.mutation_weights or {}))
        object.__setattr__(self, "seeds", tuple(self.seeds or ()))
        if self.checkpoint is not None:
            object.__setattr__(self, "checkpoint", os.fspath(self.checkpoint))

    @property
    def n_offspring(self) -> int:
        """Children bred per generation (``offspring``, else ``population``)."""
        return int(self.offspring or self.population)

    def replace(self, **changes) -> "EvolutionConfig":
        """This config with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes) if changes else self

    def to_dict(self) -> dict:
        """The fields by name (``seeds`` as a list)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["seeds"] = list(self.seeds)
        return data


#: the option names, in order
FIELDS = tuple(f.name for f in dataclasses.fields(EvolutionConfig))


def validate(config: EvolutionConfig) -> None:
    """Raise a :class:`StrategyError` naming the first bad field of ``config``."""
    c = config
    for label, low in _COUNTS.items():
        value = getattr(c, label)
        if int(value) != value or value < low:
            raise StrategyError(f"{label} must be a whole number >= {low}, got {value!r}",
                                field=label)
    for label in ("crossover", "seed_share"):
        value = getattr(c, label)
        if not 0 <= value <= 1:
            raise StrategyError(f"{label} must be in [0, 1], got {value!r}", field=label)
    if c.given_slots is not None and (int(c.given_slots) != c.given_slots or c.given_slots < 0):
        raise StrategyError(f"given_slots must be a whole number >= 0 or None, got "
                            f"{c.given_slots!r}", field="given_slots")
    if not 0 <= c.final_share < 1:
        raise StrategyError(f"final_share must be in [0, 1), got {c.final_share!r}",
                            field="final_share")
    check_workers(c.workers)
    check_backend(c.backend)
    if c.resume and c.checkpoint is None:
        raise StrategyError("resume needs a checkpoint file", field="resume",
                            fix="pass checkpoint=PATH (CLI: --checkpoint PATH)")


def with_config_keywords(init):
    """``init`` (a constructor taking ``**options``) with the config's fields
    shown as its keywords: ``inspect.signature`` reads them, as the CLI does
    to find which strategies take ``backend`` and ``workers``."""
    signature = inspect.signature(init)
    params = list(signature.parameters.values())
    variadic = [p for p in params if p.kind is p.VAR_KEYWORD]
    fields = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                annotation=f.type) for f in dataclasses.fields(EvolutionConfig)]
    init.__signature__ = signature.replace(
        parameters=[p for p in params if p.kind is not p.VAR_KEYWORD] + fields + variadic)
    return init

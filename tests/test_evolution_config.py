"""EvolutionConfig: evolution's options as one frozen dataclass."""

import dataclasses
import inspect
from pathlib import Path

import pytest

pytest.importorskip("deap")

import placer  # noqa: E402
from placer.cost import Problem, get_cost_model  # noqa: E402
from placer.errors import StrategyError  # noqa: E402
from placer.search import Budget, get_strategy  # noqa: E402

from evolution import Evolution  # noqa: E402
from evolution.config import DEFAULT_SEEDS, FIELDS, EvolutionConfig  # noqa: E402


def _search(strategy, problem, evaluations=200, seed=1):
    budget = Budget(evaluations=evaluations)
    return strategy.search(problem, budget.meter(get_cost_model("analytical")), budget, seed)


def test_keywords_and_a_config_search_alike():
    problem = Problem(placer.datasets.layered(40, width=3, seed=1),
                      placer.Cluster.preset("hetero-lab"))
    options = dict(population=8, offspring=12, crossover=0.8, seeds=("heft", "m_sct"),
                   patience=3, restarts=1, final=None)
    by_keywords = get_strategy("evolution", **options)
    by_config = Evolution(config=EvolutionConfig(**options))
    assert by_keywords.config == by_config.config
    a, b = _search(by_keywords, problem), _search(by_config, problem)
    assert (a.placement, a.microbatches, a.schedule) == (b.placement, b.microbatches, b.schedule)
    # a keyword beside a config changes that field only
    mixed = Evolution(config=EvolutionConfig(**options), population=10, microbatches=[2])
    assert mixed.config == by_config.config.replace(population=10)
    assert mixed.microbatches == [2]


def test_fields_are_coerced_and_frozen():
    config = EvolutionConfig(population=16.0, crossover=1, seeds=["heft"], layouts=0,
                             generations=7.0, checkpoint=Path("state.json"))
    assert type(config.population) is int and type(config.crossover) is float
    assert config.seeds == ("heft",) and config.layouts is False
    assert config.generations == 7 and type(config.generations) is int
    assert config.checkpoint == "state.json"
    assert config.n_offspring == 16 and config.replace(offspring=4).n_offspring == 4
    assert EvolutionConfig().seeds == DEFAULT_SEEDS
    assert EvolutionConfig(seeds=None).seeds == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.population = 4
    assert config.to_dict()["seeds"] == ["heft"] and set(config.to_dict()) == set(FIELDS)


@pytest.mark.parametrize("field,value,words", [
    ("population", 1, "population must be a whole number >= 2, got 1"),
    ("tournament", 0, "tournament must be a whole number >= 1"),
    ("patience", 2.5, "patience must be a whole number >= 1, got 2.5"),
    ("final_k", 0, "final_k must be a whole number >= 1"),
    ("coarsen_to", 1, "coarsen_to must be a whole number >= 2"),
    ("crossover", 1.5, r"crossover must be in \[0, 1\], got 1.5"),
    ("seed_share", -0.1, r"seed_share must be in \[0, 1\]"),
    ("given_slots", -1, "given_slots must be a whole number >= 0 or None"),
    ("final_share", 1.0, r"final_share must be in \[0, 1\), got 1.0"),
    ("workers", -1, "workers must be a whole number >= 0 or 'auto'"),
    ("backend", "cloud", "unknown backend 'cloud'"),
    ("resume", True, "resume needs a checkpoint file"),
    ("offspring", "many", "offspring must be a number, got 'many'"),
])
def test_a_bad_field_is_one_error_naming_it(field, value, words):
    for build in (lambda: EvolutionConfig(**{field: value}),
                  lambda: get_strategy("evolution", **{field: value}),
                  lambda: EvolutionConfig().replace(**{field: value})):
        with pytest.raises(StrategyError, match=words) as info:
            build()
        assert info.value.field == field


def test_the_constructor_shows_every_option_as_a_keyword():
    """The CLI reads the constructor's signature to find which strategies
    take ``backend`` and ``workers``."""
    accepts = inspect.signature(Evolution.__init__).parameters
    assert set(FIELDS) <= set(accepts) and {"config", "initial_plans", "candidates"} <= \
        set(accepts)
    assert accepts["population"].default == 48 and accepts["backend"].default == "local"
    with pytest.raises(StrategyError, match="unexpected keyword argument 'populaton'"):
        get_strategy("evolution", populaton=8)


def test_options_read_as_attributes_but_not_set():
    """Other modules read a strategy's ``final``, ``workers`` and ``backend``
    (placer.search.multilevel); setting one would not reach the config."""
    evo = get_strategy("evolution", final=None, workers=0, population=8)
    assert (evo.final, evo.workers, evo.backend, evo.population) == (None, 0, "local", 8)
    with pytest.raises(AttributeError, match="frozen config"):
        evo.population = 4
    with pytest.raises(AttributeError):
        evo.no_such_option

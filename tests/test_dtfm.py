"""dtfm: the bi-level scheduler of Yuan et al. on the paper's scenarios."""

import numpy as np
import pytest

import placer
from placer.cost import Problem, get_cost_model
from placer.search import Budget, get_strategy

from evolution.dtfm import even_allocation, partition_of, scale_batch, shapes_for, tsp_path
from evolution.genome import Space


def test_tsp_path_exact_and_heuristic():
    rng = np.random.default_rng(0)
    pts = rng.random((7, 2))
    C = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    path = tsp_path(C)
    assert sorted(path) == list(range(7))
    import itertools
    best = min(sum(C[p[i], p[i + 1]] for i in range(6)) for p in itertools.permutations(range(7)))
    assert sum(C[path[i], path[i + 1]] for i in range(6)) == pytest.approx(best)
    line = np.abs(np.subtract.outer(np.arange(14.0), np.arange(14.0)))
    order = tsp_path(line[np.ix_(rng.permutation(14), rng.permutation(14))])
    assert sorted(order) == list(range(14))


def test_shapes():
    assert (8, 8) in shapes_for(64, 31) and all(p <= 31 for p, _ in shapes_for(64, 31))


@pytest.fixture(scope="module")
def worldwide():
    graph = scale_batch(placer.datasets.graph("gpt-1.3b.module"), 128)
    return Problem(graph, placer.Cluster.preset("dtfm-worldwide"))


def test_dtfm_beats_even_pipeline_worldwide(worldwide):
    model = get_cost_model("analytical")
    budget = Budget(evaluations=600)
    plan = get_strategy("dtfm").search(worldwide, budget.meter(model), budget, 0)
    plan.validate(worldwide.graph, worldwide.cluster, check_fingerprints=False)
    ours = model.estimate(worldwide, plan)
    assert ours.feasible
    b2 = Budget(evaluations=200)
    even = get_strategy("even_pipeline").search(worldwide, b2.meter(model), b2, 0)
    theirs = model.estimate(worldwide, even)
    assert ours.objective < theirs.objective
    # and much faster than Megatron's even allocation on devices in random order
    rng = np.random.default_rng(0)
    order = rng.permutation(len(worldwide.cluster))
    megatron = model.estimate(worldwide, even_allocation(worldwide, 8, 8, 32, "1f1b", order))
    assert megatron.step_time / ours.step_time > 2.0


@pytest.mark.parametrize("cluster, evaluations, seed, options", [
    ("dtfm-regional", 150, 7, {"seeds": ()}),
    # heuristic seeds and restarts must not bring randomness in either
    ("hetero-lab", 400, 3, {"patience": 2, "restarts": 2}),
])
def test_dtfm_deterministic(cluster, evaluations, seed, options):
    g = placer.datasets.graph("gpt-125m.module")
    p = Problem(g, placer.Cluster.preset(cluster))
    model = get_cost_model("analytical")
    plans = []
    for _ in range(2):
        b = Budget(evaluations=evaluations)
        plans.append(get_strategy("dtfm", **options).search(p, b.meter(model), b, seed))
        assert b.used <= evaluations
    assert plans[0].placement == plans[1].placement
    assert plans[0].microbatches == plans[1].microbatches


def test_partition_of_reads_uniform_layouts_only():
    g = placer.datasets.graph("gpt-125m.module")
    p = Problem(g, placer.Cluster.preset("hetero-lab"))
    space = Space(p, [4])
    plan = even_allocation(p, 2, 3, 4)
    x = partition_of(space, plan)
    assert (x.pp, x.dp, x.microbatches) == (2, 3, 4)
    assert x.groups() == [(0, 1, 2), (3, 4, 5)]
    names = p.devices
    uneven = dict(plan.placement)
    uneven[p.ids[-1]] = [names[9]]
    assert partition_of(space, type(plan)(uneven, 4)) is None


def test_dtfm_screens_with_the_simulator_when_it_fits_the_time(monkeypatch):
    import placer
    import evolution.search as es
    g = placer.datasets.graph("gpt-125m.module")
    c = placer.Cluster.preset("two-sites")
    monkeypatch.setattr(es, "EXACT_SCREEN_EVALS", 1)
    assert placer.optimize(g, c, "dtfm", seed=0, time_budget=2).extra["dtfm"]["screen"] \
        == "simulator"
    counted = placer.optimize(g, c, "dtfm", seed=0, time_budget=None, evaluations=200)
    assert counted.extra["dtfm"]["screen"] == "analytical"

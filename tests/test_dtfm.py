"""dtfm: the bi-level scheduler of Yuan et al. on the paper's scenarios."""

import numpy as np
import pytest

import placer
from placer.cost import Problem, get_cost_model
from placer.search import Budget, get_strategy

from evolution.dtfm import Scheduler, even_allocation, partition_of, scale_batch, tsp_path
from evolution.dtfm_partition import Partition, mutate, transplant
from placer.space import Space, shapes_for


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


def test_partition_of_reads_disjoint_layouts():
    g = placer.datasets.graph("gpt-125m.module")
    p = Problem(g, placer.Cluster.preset("hetero-lab"))
    space = Space(p, [4])
    plan = even_allocation(p, 2, 3, 4)
    x = partition_of(space, plan)
    assert (x.pp, x.dp, x.microbatches) == (2, 3, 4)
    assert x.groups() == [(0, 1, 2), (3, 4, 5)] and x.unused() == [6, 7, 8, 9]
    names = p.devices
    uneven = dict(plan.placement)
    uneven[p.ids[-1]] = [names[9]]
    y = partition_of(space, type(plan)(uneven, 4))
    assert y.sizes == (3, 3, 1) and y.dp is None and y.groups()[-1] == (9,)
    shared = dict(plan.placement)
    shared[p.ids[-1]] = [names[0]]              # device 0 in two sets
    assert partition_of(space, type(plan)(shared, 4)) is None


def _space(cluster="hetero-lab"):
    g = placer.datasets.graph("gpt-125m.module")
    p = Problem(g, placer.Cluster.preset(cluster))
    return p, Space(p, [1, 2, 4, 8], ["1f1b", "gpipe"])


def test_mutations_keep_a_partition_valid():
    p, space = _space()
    D = space.n_devices
    rng = np.random.default_rng(0)
    shapes = shapes_for(D, space.n_ops)
    x = Partition.uniform(np.arange(D), 5, 2, 4)
    sizes = set()
    for _ in range(400):
        y = mutate(space, x.copy(), rng, shapes, 6)
        assert sorted(y.perm.tolist()) == list(range(D))
        assert all(k >= 1 for k in y.sizes) and 1 <= y.pp <= 6 and y.used <= D
        flat = [d for grp in y.groups() for d in grp]
        assert len(flat) == len(set(flat)) == y.used
        assert 1 <= y.chunks and y.chunks * y.pp <= space.n_ops
        sizes.add(y.sizes)
        x = y
    # groups of unequal size and unused devices both occur
    assert any(len(set(s)) > 1 for s in sizes) and any(sum(s) < D for s in sizes)
    child = transplant(Partition.uniform(np.arange(D), 5, 2), x.copy(), rng, 6)
    flat = [d for grp in child.groups() for d in grp]
    assert len(flat) == len(set(flat)) and any(grp in child.groups() for grp in x.groups())


def test_unequal_groups_decode_to_a_valid_plan():
    p, space = _space()
    x = Partition.of_groups([(2,), (3,), (0, 1), (6, 7, 8, 9)], space.n_devices, 4, "gpipe")
    x.chunks = 2
    dtfm = get_strategy("dtfm")
    plan = dtfm.decode(space, x).to_plan(space, "dtfm")
    plan.validate(p.graph, p.cluster, check_fingerprints=False)
    sets = [tuple(plan.placement[o]) for o in p.ids]
    runs = [s for i, s in enumerate(sets) if i == 0 or s != sets[i - 1]]
    names = p.devices
    # every group's devices hold ops; the unused ones (4, 5) none
    for grp in x.groups():
        assert tuple(names[d] for d in grp) in runs
    assert not {names[4], names[5]} & {d for s in sets for d in s}
    # two passes over the four groups (the pipeline interleaved)
    assert runs[:8] == runs[:4] * 2


def test_settle_keeps_near_optimal_orders_only():
    p, space = _space("dtfm-regional")
    sched = Scheduler(space, slack=0.0)
    groups = [tuple(range(k, k + 4)) for k in range(0, 16, 4)]
    rng = np.random.default_rng(1)
    for _ in range(5):
        order = rng.permutation(len(groups))
        x = Partition.of_groups([groups[i] for i in order], space.n_devices, 4)
        y = sched.settle(x.copy())
        C, _, best, idx = sched._path(y.groups(), 4)
        assert sum(C[idx[k], idx[k + 1]] for k in range(len(idx) - 1)) <= best + 1e-12
        assert sorted(y.groups()) == sorted(x.groups())
    loose = Scheduler(space, slack=1e9)
    x = Partition.of_groups(groups[::-1], space.n_devices, 4)
    assert loose.settle(x.copy()).groups() == x.groups()


def test_dtfm_screens_with_the_simulator_when_it_fits_the_time(monkeypatch):
    import placer
    import evolution.dtfm as ed
    g = placer.datasets.graph("gpt-125m.module")
    c = placer.Cluster.preset("two-sites")
    monkeypatch.setattr(ed, "EXACT_SCREEN_EVALS", 1)
    assert placer.optimize(g, c, "dtfm", seed=0, time_budget=2).extra["dtfm"]["screen"] \
        == "simulator"
    counted = placer.optimize(g, c, "dtfm", seed=0, time_budget=None, evaluations=200)
    assert counted.extra["dtfm"]["screen"] == "analytical"


def test_shared_pieces_live_below_the_strategies():
    """``even_allocation`` (the plan space) and ``scale_batch`` (a graph
    transform) live below evolution; its old names are the same objects."""
    from evolution import dtfm
    from placer.graph import scale_batch
    from placer.space import even_allocation
    assert dtfm.even_allocation is even_allocation and dtfm.scale_batch is scale_batch

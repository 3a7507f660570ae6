"""evolution: genomes, operators, the memetic GA and the optuna strategy."""

import numpy as np
import pytest

import placer
from placer.cost import Problem, get_cost_model
from placer.graph import Graph, Op, Edge
from placer.search import Budget, get_strategy

from placer.search.evaluate import Evaluator
from placer.space import MUTATIONS, LayoutGenome, OpGenome, Space, crossover, mutate


@pytest.fixture(scope="module")
def problem():
    g = placer.datasets.layered(60, width=4, seed=2)
    return Problem(g, placer.Cluster.preset("hetero-lab"))


def _run(name, problem, evaluations=300, seed=0, **options):
    budget = Budget(evaluations=evaluations)
    model = budget.meter(get_cost_model("analytical"))
    return get_strategy(name, **options).search(problem, model, budget, seed), budget


def test_registered():
    names = placer.strategies()
    assert {"evolution", "dtfm", "optuna"} <= set(names)


def test_operators_keep_a_valid_genome(problem):
    space = Space(problem, [1, 2, 4], ["1f1b", "gpipe"])
    rng = np.random.default_rng(0)
    g = LayoutGenome.balanced(space, [(0,), (1, 2), (3,)], 2).decode(space)
    for name, (op, _) in MUTATIONS.items():
        for _ in range(20):
            c = op(space, g.copy(), rng)
            plan = c.to_plan(space)
            plan.validate(problem.graph, problem.cluster, check_fingerprints=False)
    a, b = crossover(space, g.copy(), mutate(space, g.copy(), rng), rng)
    a.to_plan(space).validate(problem.graph, problem.cluster, check_fingerprints=False)


def test_colocation_repaired():
    ops = [Op(f"o{i}", flops=1e9 * (i + 1), param_bytes=1e6,
              colocate="w" if i in (1, 5) else None) for i in range(8)]
    g = Graph("c", ops, [Edge(f"o{i}", f"o{i + 1}", 1e6) for i in range(7)])
    p = Problem(g, placer.Cluster.preset("hetero-lab"))
    space = Space(p)
    rng = np.random.default_rng(1)
    genome = OpGenome(np.arange(8) % p.n_devices)
    genome.assign = space.repair(genome.assign)
    for _ in range(50):
        genome = mutate(space, genome, rng, rate=3)
        genome.to_plan(space).validate(g, p.cluster, check_fingerprints=False)


@pytest.mark.parametrize("final", [None, "simulator"])
def test_evolution_valid_deterministic_and_no_worse_than_seeds(problem, final):
    """Never worse than the heuristics it starts from, by the model that
    ranks its finalists (the given one, or the simulator)."""
    a, budget = _run("evolution", problem, seed=4, final=final)
    b, _ = _run("evolution", problem, seed=4, final=final)
    a.validate(problem.graph, problem.cluster, check_fingerprints=False)
    assert a.placement == b.placement and a.microbatches == b.microbatches
    assert budget.used <= 300
    model = get_cost_model(final or "analytical")
    mine = model.estimate(problem, a).objective
    for name in ("heft", "m_sct", "even_pipeline", "pipeline_dp"):
        h, _ = _run(name, problem, evaluations=300)
        assert mine <= model.estimate(problem, h).objective * (1 + 1e-9), name


def test_restarts_and_final_polish_are_deterministic(problem):
    plans = [_run("evolution", problem, evaluations=900, seed=2, patience=2, restarts=3)[0]
             for _ in range(2)]
    assert plans[0].placement == plans[1].placement
    assert plans[0].microbatches == plans[1].microbatches


def test_parallel_evaluation_matches_serial(problem):
    space = Space(problem, [1, 2, 4])
    rng = np.random.default_rng(3)
    base = LayoutGenome.balanced(space, [(0,), (1,), (2,)], 2).decode(space)
    genomes = [mutate(space, base.copy(), rng, rate=3) for _ in range(40)]
    model = get_cost_model("analytical")
    serial = Evaluator(space, model)(genomes)
    with Evaluator(space, model, workers=2, chunk=8) as ev:
        parallel = ev(genomes)
    assert np.array_equal(serial, parallel)


def test_parallel_evaluation_mixed_settings_and_model_switch(problem):
    # one call holding several (microbatches, schedule) settings is scored on
    # the pool in one go; a switch of model restarts the pool with the new one
    space = Space(problem, [1, 2, 4], ["1f1b", "gpipe"])
    rng = np.random.default_rng(4)
    base = LayoutGenome.balanced(space, [(0,), (1,), (2,)], 2).decode(space)
    genomes = [mutate(space, base.copy(), rng, rate=3) for _ in range(30)]
    for i, g in enumerate(genomes):
        g.microbatches, g.schedule = [1, 2, 4][i % 3], ["1f1b", "gpipe"][i % 2]
    analytical, sim = get_cost_model("analytical"), get_cost_model("simulator")
    with Evaluator(space, analytical, workers=2) as ev:
        assert np.array_equal(ev(genomes), Evaluator(space, analytical)(genomes))
        ev.model = sim
        ev.cache.clear()
        assert np.array_equal(ev(genomes), Evaluator(space, sim)(genomes))


def test_auto_workers_only_for_the_simulator_under_a_time_budget(monkeypatch):
    from placer.search import evaluate
    monkeypatch.setattr(evaluate.os, "sched_getaffinity", lambda pid: set(range(16)),
                        raising=False)
    sim, analytical = get_cost_model("simulator"), get_cost_model("analytical")
    assert evaluate.auto_workers(sim, Budget(time=10)) == evaluate.MAX_AUTO_WORKERS
    assert evaluate.auto_workers(analytical, Budget(time=10)) == 0
    assert evaluate.auto_workers(sim, Budget(evaluations=100)) == 0
    # a cheap simulation is scored in this process: a worker would cost more
    assert evaluate.auto_workers(sim, Budget(time=10), seconds=0.001) == 0
    assert evaluate.auto_workers(sim, Budget(time=10), seconds=0.05) == \
        evaluate.MAX_AUTO_WORKERS
    monkeypatch.setattr(evaluate.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert evaluate.auto_workers(sim, Budget(time=10)) == 0
    with pytest.raises(placer.PlacerError, match="workers"):
        get_strategy("evolution", workers=-1)


def test_fresh_starts_only_with_time_left_under_a_time_budget():
    evo = get_strategy("evolution", fresh_starts=2)
    timed = Budget(time=100.0).start()
    assert evo._fresh_start_fits(timed, 0)          # nearly all of it left
    assert not evo._fresh_start_fits(timed, 2)      # used up the allowed starts
    assert not evo._fresh_start_fits(Budget(evaluations=1000).start(), 0)
    spent = Budget(time=1e-9).start()
    assert not evo._fresh_start_fits(spent, 0)


def test_initial_plans_seed_the_population(problem):
    start, _ = _run("pipeline_dp", problem)
    start = placer.Plan(start.placement, start.microbatches, start.schedule)
    plan, _ = _run("evolution", problem, evaluations=120, seeds=(), initial_plans=[start])
    model = get_cost_model("analytical")
    assert model.estimate(problem, plan).objective <= \
        model.estimate(problem, start).objective * (1 + 1e-9)


def test_initial_plans_join_the_population_without_displacing_its_own_seeds(problem):
    """The first population holds the best ``population`` of the search's
    own seeds (heuristics, layouts) and every initial plan besides, even
    initial plans better than all of them (a policy's, hybrid's)."""
    from evolution.search import Evolution
    from evolution.shared import Fitness
    evo = get_strategy("evolution", population=4)
    rng = np.random.default_rng(0)
    own = [OpGenome(np.full(problem.n_ops, d), 1, "1f1b", origin=f"h{d}") for d in range(6)]
    given = [OpGenome(np.arange(problem.n_ops) % (2 + d), 1, "1f1b", origin="initial")
             for d in range(3)]

    def score(genomes):
        for g in genomes:   # the initial plans best, then h0 < h1 < ...
            g.fitness = Fitness((-1.0 if g.origin == "initial" else float(g.origin[1:]),))

    pop = Evolution._populate(evo, own + given, score, rng, None)
    assert sorted(g.origin for g in pop) == ["h0", "h1", "h2", "h3"] + ["initial"] * 3
    assert pop[0].origin == "initial"          # best first


def test_given_slots_bound_the_descendants_of_plans_handed_in(problem):
    """Under ``given_slots`` selection keeps the ``population`` best of the
    search's own lineages and at most that many of the plans handed in
    (and their descendants), even when those are better than all its own."""
    from evolution.search import Evolution
    from evolution.shared import Fitness
    own = [OpGenome(np.full(problem.n_ops, d), 1, "1f1b", origin=f"h{d}") for d in range(6)]
    given = [OpGenome(np.arange(problem.n_ops) % (2 + d), 1, "1f1b", origin="initial")
             for d in range(5)]
    for g in own + given:
        g.fitness = Fitness((-1.0 if g.origin == "initial" else float(g.origin[1:]),))
    capped = get_strategy("evolution", population=4, given_slots=2)
    picked = Evolution._select(capped, own + given)
    assert sorted(g.origin for g in picked) == ["h0", "h1", "h2", "h3"] + ["initial"] * 2
    assert picked[0].origin == "initial"
    # without a cap the better plans handed in take every place
    free = get_strategy("evolution", population=4)
    assert {g.origin for g in Evolution._select(free, own + given)} == {"initial"}


def test_candidates_with_no_slots_leave_the_search_as_it_was(problem):
    """``candidates`` under ``given_slots=0`` only compete in the final
    ranking: the search's own trajectory is the one it has without them,
    so its plan is the same unless a candidate beats it; and ``finalize``
    does not score them again (``initial`` plans it does)."""
    opts = dict(evaluations=100_000, seed=3, final=None, generations=6, population=12)
    plain, _ = _run("evolution", problem, **opts)
    # the search's own plan at another microbatch count: worse, but near
    # enough to steer the search when it joins the population
    model = get_cost_model("analytical")
    worse = [placer.Plan(plain.placement, 4, plain.schedule)]
    assert model.estimate(problem, worse[0]).objective > plain.predicted["objective"]
    alone, b1 = _run("evolution", problem, candidates=worse, given_slots=0, **opts)
    assert alone.placement == plain.placement and alone.microbatches == plain.microbatches
    steered, _ = _run("evolution", problem, candidates=worse, **opts)
    assert steered.placement != plain.placement        # without the cap it does steer
    _, b2 = _run("evolution", problem, initial=worse, given_slots=0, **opts)
    assert b2.used - b1.used == len(worse)
    # a candidate better than anything the search finds is its result
    best = [placer.Plan(plain.placement, plain.microbatches, plain.schedule)]
    short, _ = _run("evolution", problem, candidates=best, given_slots=0,
                    **{**opts, "generations": 1, "seed": 4})
    assert model.estimate(problem, short).objective <= \
        model.estimate(problem, best[0]).objective * (1 + 1e-9)


def test_coarsened_search_expands_to_every_op():
    g = placer.datasets.random_dag(300, width=6, seed=1)
    p = Problem(g, placer.Cluster.preset("two-sites"))
    plan, _ = _run("evolution", p, evaluations=200, coarsen_above=100, coarsen_to=40,
                   seeds=("even_pipeline",))
    plan.validate(g, p.cluster, check_fingerprints=False)
    assert plan.extra["search"]["coarsened"]


def test_optuna_strategy_returns_a_valid_plan(problem):
    plan, budget = _run("optuna", problem, evaluations=200, seed=1, trials=4, generations=2)
    plan.validate(problem.graph, problem.cluster, check_fingerprints=False)
    assert plan.method == "optuna" and plan.predicted["step_time"] > 0
    assert budget.used <= 200


def test_final_ranking_stops_when_the_time_is_spent():
    from placer.search.common import rank
    from placer.search.base import Budget

    class Counting:
        name = "counting"

        def __init__(self):
            self.calls = 0

        def estimate(self, problem, plan):
            self.calls += 1
            return type("R", (), {"objective": float(plan)})()

        def estimate_many(self, problem, plans):
            return [self.estimate(problem, p) for p in plans]

    spent = Budget(time=1e-9)
    model = Counting()
    assert rank(model, None, [3, 1, 2], spent) == 0 and model.calls == 1
    model = Counting()
    assert rank(model, None, [3, 1, 2], Budget(time=60.0)) == 1 and model.calls == 3
    model = Counting()
    assert rank(model, None, [3, 1, 2]) == 1 and model.calls == 3


def test_screens_with_the_simulator_when_it_fits_the_time(monkeypatch):
    import placer
    import evolution.search as es
    g = placer.datasets.graph("gpt-125m.module")
    c = placer.Cluster.preset("two-sites")
    monkeypatch.setattr(es, "EXACT_SCREEN_EVALS", 1)        # any simulator fits
    timed = placer.optimize(g, c, "evolution", seed=0, time_budget=2)
    assert timed.extra["search"]["screen"] == "simulator"
    monkeypatch.setattr(es, "EXACT_SCREEN_EVALS", 10 ** 9)  # none does
    assert placer.optimize(g, c, "evolution", seed=0,
                           time_budget=2).extra["search"]["screen"] == "analytical"
    counted = placer.optimize(g, c, "evolution", seed=0, time_budget=None, evaluations=300)
    assert counted.extra["search"]["screen"] == "analytical"   # deterministic budgets keep it


def test_neighbourhood_shifts_chains_of_boundaries(problem):
    # stage 0 gains one op and stage 2 gives one up while stage 1 keeps its
    # size: two boundaries move together, which no single shift does
    from placer.space import neighbourhood
    space = Space(problem)
    g = LayoutGenome([10, 20], [(0,), (1,), (2,)]).decode(space)
    sizes = {tuple(np.bincount(c.assign, minlength=3)[:3].tolist())
             for c in neighbourhood(space, g, np.random.default_rng(0), limit=10_000)}
    n = space.n_ops
    assert (11, 10, n - 21) in sizes and (9, 10, n - 19) in sizes


class _SlowRows:
    """A cost model scoring row by row that takes ``delay`` seconds per row."""

    name = "slow"
    batched = False

    def __init__(self, delay):
        self.delay = delay
        self.rows = 0

    def step_times(self, problem, assignments, **kwargs):
        import time
        rows = np.atleast_2d(assignments)
        self.rows += len(rows)
        time.sleep(self.delay * len(rows))
        return rows.sum(axis=1).astype(float)


def test_a_batch_stops_at_the_deadline_and_keeps_the_rest_unscored(problem):
    import time
    space = Space(problem, [1])
    rng = np.random.default_rng(5)
    base = LayoutGenome.balanced(space, [(0,), (1,), (2,)], 1).decode(space)
    genomes = [mutate(space, base.copy(), rng, rate=3) for _ in range(40)]
    model = _SlowRows(0.02)
    budget = Budget(time=0.2)
    ev = Evaluator(space, budget.meter(model), budget)
    start = time.perf_counter()
    values = ev(genomes)
    took = time.perf_counter() - start
    assert took < 0.2 + 0.02 + 0.15            # the budget, one row, some slack
    scored = np.isfinite(values)
    assert 0 < scored.sum() < len(genomes) and model.rows == scored.sum() == budget.used
    assert len(ev.cache) == scored.sum()       # the rows left were not cached as inf
    # an evaluation budget scores the whole batch, as before
    counted = Evaluator(space, _SlowRows(0.0), Budget(evaluations=1000))(genomes)
    assert np.isfinite(counted).all()


@pytest.mark.parametrize("screen", ["auto", "simulator"])
def test_time_budget_holds_when_some_plans_are_slow_to_simulate(monkeypatch, screen):
    # plans holding a data-parallel op take 0.4 s to simulate here, the
    # first seeds (one device per op) are cheap: "auto" picks the simulator
    # on those, then falls back to the analytical model; an explicit
    # simulator screen is stopped by the deadline alone
    import time
    import evolution.search as es
    from placer.cost.simulator import Simulator
    delay = 0.4
    step_times, estimate = Simulator.step_times, Simulator.estimate

    def slow_step_times(self, problem, assignments, *, groups=(), **kw):
        rows = np.atleast_2d(assignments)
        time.sleep(delay * int((rows >= problem.n_devices).any(axis=1).sum()))
        return step_times(self, problem, rows, groups=groups, **kw)

    def slow_estimate(self, problem, plan):
        if any(len(d) > 1 for d in plan.placement.values()):
            time.sleep(delay)
        return estimate(self, problem, plan)

    monkeypatch.setattr(Simulator, "step_times", slow_step_times)
    monkeypatch.setattr(Simulator, "estimate", slow_estimate)
    monkeypatch.setattr(es, "EXACT_SCREEN_EVALS", 20)
    g = placer.datasets.layered(60, width=4, seed=2)
    c = placer.Cluster.preset("hetero-lab")
    budget = 3.0
    start = time.perf_counter()
    plan = placer.optimize(g, c, "evolution", seed=0, time_budget=budget, screen=screen,
                           final_cost_model="analytical")
    took = time.perf_counter() - start
    assert took <= 1.1 * budget + delay + 0.3
    search = plan.extra["search"]
    if screen == "auto":
        assert search["screen"] == "analytical" and search["screen_fallbacks"] == 1
    else:
        assert search["screen"] == "simulator" and search["screen_fallbacks"] == 0

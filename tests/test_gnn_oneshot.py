"""``rl``'s one-shot candidates: site baselines, the cut descent, distinct
finalists and the final ranking's pool."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch_geometric")
pytest.importorskip("deap")

from placer import datasets  # noqa: E402
from placer.cost import Problem, get_cost_model  # noqa: E402
from placer.search import Budget  # noqa: E402
from placer.search.arrays import PlanArrays  # noqa: E402

from gnn import strategies  # noqa: E402
from gnn.problems import site_devices, site_pipelines, site_replicas, times_at  # noqa: E402


def test_site_baselines_reach_the_fast_pair_of_a_small_site():
    """classes-d12-s1: four fast GPUs at 26 GB/s in one site, two joined at
    86 GB/s in another; the global order starts at the bigger site, the
    site baselines also hold the pair (replicated and as a pipeline)."""
    problem = Problem(datasets.graph("layered-n50-w4-s0"), datasets.cluster("classes-d12-s1"))
    sites = site_devices(problem)
    assert sorted(d for ds in sites for d in ds) == list(range(problem.n_devices))
    for ds in sites:                        # fastest first inside a site
        assert list(problem.rate[ds]) == sorted(problem.rate[ds], reverse=True)
    pair = (8, 10)
    assert problem.rate[8] == problem.rate[10] == problem.rate.max()
    assert pair in site_replicas(problem)
    assert all(len(set(problem.site[list(g)])) == 1 for g in site_replicas(problem))
    pipes = site_pipelines(problem, 8)
    assert any(set(np.unique(r)) == set(pair) for r in pipes)
    space = strategies._space(problem, [1, 2, 4, 8], ["1f1b"])
    _, layouts, stages = strategies.baseline_rows(problem, space)
    whole = np.full(problem.n_ops, space.table.id(pair))
    assert any((row == whole).all() and s == 1 for row, s in zip(layouts, stages))


def test_cut_descent_finds_the_best_two_stage_cut_by_brute_force():
    """A 2-stage pipeline of 42 ops: every position fits in one round, so
    the descent's result is the best cut of all (brute force), from an
    even split that is not."""
    problem = Problem(datasets.graph("experts-e4-l2-s0"), datasets.cluster("regions-d8-r4-s0"))
    n = problem.n_ops
    assert n - 1 <= strategies.CUT_ROWS
    cost = get_cost_model("analytical")
    space = strategies._space(problem, [8], ["1f1b"])
    a, b = 4, 5
    cuts = np.stack([np.r_[np.full(k, a), np.full(n - k, b)] for k in range(1, n)])
    brute = times_at(cost, problem, cuts, [8] * len(cuts), "1f1b")
    even = cuts[n // 2 - 1]
    start = PlanArrays(even, (), 8, "1f1b", "baseline", float(brute[n // 2 - 1]))
    assert brute.min() < start.objective
    v = strategies._cut_descent(space, cost, problem, Budget(), start)
    assert v.origin == "polished" and (v.microbatches, v.schedule) == (8, "1f1b")
    assert v.objective == pytest.approx(brute.min(), rel=1e-12)
    assert v.objective == pytest.approx(
        float(times_at(cost, problem, v.assign[None], [8], "1f1b")[0]))
    # from the best cut, nothing improves: the start comes back
    best = v.replace(origin="baseline")
    assert strategies._cut_descent(space, cost, problem, Budget(), best) is best


def test_distinct_finalists_skip_equal_objectives():
    rows = [PlanArrays(np.zeros(1, dtype=np.int64), origin=o, objective=t)
            for t, o in ((1.0, "a"), (1.0 + 1e-12, "b"), (1.5, "c"), (2.0, "d"))]
    assert [v.origin for v in strategies._distinct(rows, 3)] == ["a", "c", "d"]
    assert [v.origin for v in strategies._distinct(rows, 1)] == ["a"]


def test_final_ranking_pool_is_bounded_by_simulated_tasks():
    """The simulator ranks the first ``at_least`` finalists, then more while
    their op replicas x microbatches fit :data:`FINAL_TASKS`; the pick is
    the simulator's best of those it scored."""
    problem = Problem(datasets.graph("experts-e4-l2-s0"), datasets.cluster("classes-d8-s0"))
    sim = get_cost_model("simulator")
    from gnn.problems import even_pipelines
    rows = even_pipelines(problem, range(1, 7))
    found = [strategies.Candidate(r, (), 4, "1f1b", "baseline", float(k))
             for k, r in enumerate(rows)]
    truth = times_at(sim, problem, rows, [4] * len(rows), "1f1b")
    from placer.search.ranker import RankPolicy, rank_finalists

    def rank(at_least, max_tasks=strategies.FINAL_TASKS):
        budget = Budget()
        policy = RankPolicy(at_least=at_least, max_tasks=max_tasks)
        return rank_finalists(budget.meter(sim), problem, found, budget, policy=policy).index
    assert rank(len(found)) == int(np.argmin(truth))
    # every task fits: the whole pool; none beyond the first two: only those
    assert rank(2) == int(np.argmin(truth))
    assert rank(2, max_tasks=0) == int(np.argmin(truth[:2]))
    assert found[0].tasks(problem.n_devices) == problem.n_ops * 4

"""placer.search.ranker: the one finalist ranker and its time policy."""

import time

import numpy as np
import pytest

from placer import Cluster, datasets
from placer.cost import Problem, get_cost_model
from placer.search.arrays import PlanArrays
from placer.search.base import Budget
from placer.search.ranker import (RankPolicy, Ranked, hold_back, rank, rank_finalists,
                                  reserve)


@pytest.fixture(scope="module")
def problem():
    return Problem(datasets.graph("layered-n20-w2-s0"), Cluster.preset("two-sites"))


def _finalists(problem):
    """Six plans: one device, then even pipelines over 2-4 devices at two counts."""
    n, D = problem.n_ops, problem.n_devices
    out = [PlanArrays(np.zeros(n, dtype=np.int64), (), 4, "1f1b", "single")]
    for k in (2, 3, 4):
        for m in (1, 8):
            row = np.minimum(np.arange(n) * k // n, D - 1).astype(np.int64)
            out.append(PlanArrays(row, (), m, "1f1b", f"{k} stages"))
    return out


def test_the_pick_is_the_models_best_of_all_without_a_time_limit(problem):
    sim = get_cost_model("simulator")
    found = _finalists(problem)
    plans = [f.to_plan(problem, "test") for f in found]
    truth = [sim.estimate(problem, p).objective for p in plans]
    by_arrays = rank_finalists(sim, problem, found, Budget())
    by_plans = rank_finalists(sim, problem, plans, Budget())
    assert by_arrays.index == by_plans.index == int(np.argmin(truth))
    assert by_arrays.value == pytest.approx(min(truth), rel=1e-9)
    assert rank(sim, problem, plans) == int(np.argmin(truth))
    # the search's own model: its first stands, nothing scored
    assert rank_finalists(None, problem, found, Budget()) == Ranked(0, None)


def test_evaluations_left_bound_the_finalists(problem):
    sim = get_cost_model("simulator")
    found = _finalists(problem)
    truth = [sim.estimate(problem, f.to_plan(problem, "t")).objective for f in found]
    budget = Budget(evaluations=4)
    metered = budget.meter(sim)
    # 4 left, 1 kept for the report: the first 3 only
    assert RankPolicy(keep=1).room(budget, len(found)) == 3
    assert rank_finalists(metered, problem, found, budget).index == int(np.argmin(truth[:3]))
    assert budget.used == 3
    # none left: the first stands unscored
    assert rank_finalists(metered, problem, found, budget) == Ranked(0, None)


def test_beyond_at_least_only_while_the_tasks_fit(problem):
    sim = get_cost_model("simulator")
    found = _finalists(problem)
    truth = [sim.estimate(problem, f.to_plan(problem, "t")).objective for f in found]
    best_two = int(np.argmin(truth[:2]))
    assert rank_finalists(sim, problem, found, policy=RankPolicy(at_least=2, max_tasks=0)
                          ).index == best_two
    every = sum(f.tasks(problem.n_devices) for f in found)
    assert rank_finalists(sim, problem, found, policy=RankPolicy(at_least=2, max_tasks=every)
                          ).index == int(np.argmin(truth))


def test_scoring_stops_when_the_time_left_is_under_the_longest_estimate():
    """(tests/test_evolution.py checks the first is scored with no time left)"""
    class Slow:
        name = "slow"

        def __init__(self):
            self.calls = 0

        def estimate(self, problem, plan):
            self.calls += 1
            time.sleep(0.05)
            return type("R", (), {"objective": float(plan)})()

    model = Slow()
    budget = Budget(time=0.12)
    # 0.05 s or more each: after two at most ~0.02 s is left, under the longest
    i = rank(model, None, [3.0, 2.0, 1.0, 0.0], budget)
    assert model.calls in (1, 2) and i == model.calls - 1


def test_hold_reserves_then_holds_back_a_share_of_the_rest():
    budget = Budget(time=10.0, evaluations=100)
    with RankPolicy(reserve=10, share=0.5).hold(budget) as inner:
        held = (inner.evaluations, inner.time)
    expect = Budget(time=10.0, evaluations=100)
    with reserve(expect, 10), hold_back(expect, 0.5):
        assert (expect.evaluations, expect.time) == held == (45, 5.0)
    assert (budget.evaluations, budget.time) == (100, 10.0)


def test_after_the_first_only_while_more_than_keep_evaluations_are_left(problem):
    from placer.search.ranker import score_finalists
    found = _finalists(problem)
    sim = get_cost_model("simulator")
    budget = Budget(evaluations=10)
    budget.charge(7)                # 3 left, 1 kept: two scored
    assert len(score_finalists(budget.meter(sim), problem, found, budget)) == 2
    assert budget.used == 9
    # a model metered elsewhere charges nothing here: the budget never says stop
    other = Budget(evaluations=10)
    other.charge(7)
    assert len(score_finalists(sim, problem, found, other)) == len(found)
    spent = Budget(evaluations=1)
    spent.charge(1)
    assert len(score_finalists(sim, problem, found, spent)) == 1    # the first always

"""Searches keep their time budget and never return a plan their own cost
model scored worse than one they had already seen, even when that model is
slow and erratic (sleeps at random, answers NaN now and then)."""

import math
import time

import numpy as np
import pytest

import placer
from placer.search import optimize_with_report
from placer.cost import Problem, get_cost_model
from placer.cost.base import CostModel

#: seconds outside the search clock: building the problem, the final scoring
#: by the simulator and binding the plan (kernels are compiled beforehand)
START_UP = 1.5


class Erratic(CostModel):
    """The analytical model, but slow (2 ms a plan, 30 ms every fifth) and
    wrong now and then (NaN every seventh plan); it records every finite
    objective it gave."""

    name = "erratic"

    def __init__(self, seed: int = 0):
        self.inner = get_cost_model("analytical")
        self.rng = np.random.default_rng(seed)
        self.calls = 0
        self.scores: list[float] = []

    def estimate(self, problem, plan):
        self.calls += 1
        time.sleep(0.03 if self.rng.random() < 0.2 else 0.002)
        report = self.inner.estimate(problem, plan)
        if self.calls % 7 == 0:
            report.objective = report.step_time = float("nan")
        else:
            self.scores.append(report.objective)
        return report


@pytest.fixture(scope="module")
def problem():
    from placer.cost.warmup import warm_up
    warm_up()
    return placer.datasets.layered(40, width=4, seed=0), placer.Cluster.preset("two-sites")


@pytest.mark.parametrize("method", placer.strategies())
def test_budget_kept_and_no_worse_than_seen_under_an_erratic_model(problem, method):
    graph, cluster = problem
    model = Erratic()
    budget = 2.0
    start = time.perf_counter()
    plan, report = optimize_with_report(
        graph, cluster, method, seed=0, time_budget=budget, cost_model=model,
        final_cost_model="analytical")
    wall = time.perf_counter() - start
    search = plan.predicted["search"]
    assert search["search_seconds"] <= 1.1 * budget, search
    assert wall <= 1.1 * budget + START_UP, wall
    # never worse (under the search's own model, finite answers) than the
    # best plan that model scored during the search
    clean = get_cost_model("analytical").estimate(
        Problem(graph, cluster), plan).objective
    assert math.isfinite(clean)
    assert model.scores and clean <= min(model.scores) * (1 + 1e-9), (clean, min(model.scores))


class NaNFirst(Erratic):
    """Answers NaN for the first plan it scores, then the truth."""

    name = "nan-first"

    def estimate(self, problem, plan):
        self.calls += 1
        report = self.inner.estimate(problem, plan)
        if self.calls == 1:
            report.objective = report.step_time = float("nan")
        return report


def _register_slowest(label: str) -> None:
    """Register strategy ``label``: it scores each one-device plan and
    returns the slowest by its cost model."""
    from placer import Plan
    from placer.search import Strategy, register_strategy

    @register_strategy
    class Slowest(Strategy):
        name = label

        def search(self, problem, cost_model, budget, seed=0, progress=None):
            plans = [Plan({op: [d.name] for op in problem.graph.ids})
                     for d in problem.cluster.devices]
            reports = cost_model.estimate_many(problem, plans)
            worst = max(range(len(plans)), key=lambda i: reports[i].objective)
            return self.finalize(problem, cost_model, budget, plans[worst], reports[worst])


def test_a_careless_strategy_still_returns_the_best_plan_its_model_scored(problem):
    """A strategy that scores each one-device plan and returns the slowest
    (after a NaN for the first): optimize keeps the best it scored instead."""
    from placer import Plan
    from placer.search import unregister_strategy
    _register_slowest("careless-test")
    graph, cluster = problem
    try:
        plan = optimize_with_report(graph, cluster, "careless-test", time_budget=None,
                                    cost_model=NaNFirst(), final_cost_model="analytical")[0]
    finally:
        unregister_strategy("careless-test")
    clean = get_cost_model("analytical")
    p = Problem(graph, cluster)
    singles = [clean.estimate(p, Plan({op: [d.name] for op in graph.ids})).objective
               for d in cluster.devices]
    assert clean.estimate(p, plan).objective == pytest.approx(min(singles))
    assert plan.method == "careless-test" and plan.predicted["search"]["kept_seen"]


class Flipped(CostModel):
    """The analytical model's objectives inverted: the slowest plan by it is
    the fastest by this one."""

    name = "flipped"

    def __init__(self):
        self.inner = get_cost_model("analytical")

    def estimate(self, problem, plan):
        report = self.inner.estimate(problem, plan)
        report.objective = report.step_time = 1.0 / report.objective
        return report


def test_the_final_model_keeps_a_plan_it_prefers_to_the_best_seen(problem):
    """A strategy that returns the slowest one-device plan by its search
    model, which the final model prices best: the swap to the search
    model's best seen plan needs the final model's agreement."""
    from placer import Plan
    from placer.search import unregister_strategy
    _register_slowest("slowest-test")
    graph, cluster = problem
    clean = get_cost_model("analytical")
    p = Problem(graph, cluster)
    singles = [clean.estimate(p, Plan({op: [d.name] for op in graph.ids})).objective
               for d in cluster.devices]
    assert max(singles) > min(singles) * 1.01
    try:
        kept = optimize_with_report(graph, cluster, "slowest-test", time_budget=None,
                                    final_cost_model=Flipped())[0]
        swapped = optimize_with_report(graph, cluster, "slowest-test", time_budget=None,
                                       final_cost_model="analytical")[0]
    finally:
        unregister_strategy("slowest-test")
    assert clean.estimate(p, kept).objective == pytest.approx(max(singles))
    assert "kept_seen" not in kept.predicted["search"]
    assert clean.estimate(p, swapped).objective == pytest.approx(min(singles))
    assert swapped.predicted["search"]["kept_seen"]


@pytest.mark.slow
@pytest.mark.parametrize("method", placer.strategies())
def test_budget_kept_on_a_5000_op_graph_on_64_devices(method):
    """The same on a graph big enough to be coarsened inside evolution and
    to make each seeding heuristic take a sizeable part of the budget."""
    from placer.cost.warmup import warm_up
    warm_up()
    graph = placer.datasets.graph("random_dag-n5000-w8-s0")
    budget = 4.0
    plan = placer.optimize(graph, placer.Cluster.preset("dtfm-worldwide"), method, seed=0,
                           time_budget=budget)
    assert plan.predicted["search"]["search_seconds"] <= 1.1 * budget

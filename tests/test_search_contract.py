"""Shared contract of every registered strategy (parametrized over
placer.strategies(), so strategies added later are covered too)."""

import time

import numpy as np
import pytest

import placer
from placer import Cluster, Device, Graph, Op, Plan
from placer.cost import Problem, get_cost_model
from placer.search import Budget, get_strategy, strategies

NAMES = strategies()


def _graph():
    g = placer.datasets.layered(48, width=4, seed=2)
    ops = []
    ids = g.topological_order()
    for op in g:
        # tie a weight between an early and a late op, like shared embeddings
        colocate = "tied" if op.id in (ids[1], ids[-2]) else None
        ops.append(Op(op.id, op.op, op.flops, op.bwd_flops, op.param_bytes, op.output_bytes,
                      colocate))
    return Graph("contract", ops, g.edges, meta=dict(g.meta))


def _tight_cluster(graph):
    """Three fast devices too small for the model and one slow device that
    holds all of it: feasible plans exist, careless ones overflow."""
    problem = Problem(graph, Cluster.preset("two-sites"))
    total = float((problem.param_bytes * 4 + problem.output_bytes).sum()
                  + problem.workspace_bytes.max() + problem.edge_bytes.sum())
    devices = [Device(f"f{i}", 3e14, 0.3 * total, site="x") for i in range(3)]
    devices.append(Device("big", 6e13, 1.6 * total, site="y"))
    return Cluster.from_rules("tight", devices, default=(1e10, 1e-5),
                              sites=[("x", "y", 1e9, 1e-3)])


@pytest.fixture(scope="module")
def graph():
    return _graph()


@pytest.fixture(scope="module")
def problem(graph):
    return Problem(graph, Cluster.preset("hetero-lab"))


def _run(name, problem, budget=None, seed=0, **options):
    budget = budget or Budget(evaluations=60)
    model = budget.meter(get_cost_model("analytical"))
    plan = get_strategy(name, **options).search(problem, model, budget, seed, None)
    return plan, budget


@pytest.mark.parametrize("name", NAMES)
def test_valid_plan_with_predictions(name, problem):
    plan, _ = _run(name, problem)
    assert isinstance(plan, Plan)
    plan.validate(problem.graph, problem.cluster, check_fingerprints=False)
    assert plan.method == name
    assert plan.predicted["step_time"] > 0
    assert isinstance(plan.predicted["feasible"], bool)
    assert plan.schedule in ("1f1b", "gpipe") and plan.microbatches >= 1


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_for_a_seed(name, problem):
    a, _ = _run(name, problem, Budget(evaluations=40), seed=3)
    b, _ = _run(name, problem, Budget(evaluations=40), seed=3)
    assert a.placement == b.placement
    assert (a.microbatches, a.schedule) == (b.microbatches, b.schedule)


@pytest.mark.parametrize("name", NAMES)
def test_colocation_and_memory_when_feasible(name, graph):
    cluster = _tight_cluster(graph)
    problem = Problem(graph, cluster)
    everything_on_big = Plan({op: ["big"] for op in graph.ids}, microbatches=8)
    assert get_cost_model("simulator").estimate(problem, everything_on_big).feasible
    plan, _ = _run(name, problem, Budget(evaluations=200))
    plan.validate(graph, cluster, check_fingerprints=False)     # colocation kept
    tied = {tuple(v) for op, v in plan.placement.items() if graph.op(op).colocate}
    assert len(tied) == 1
    assert get_cost_model("analytical").estimate(problem, plan).feasible, name


@pytest.mark.parametrize("name", NAMES)
def test_respects_the_evaluation_budget(name, problem):
    plan, budget = _run(name, problem, Budget(evaluations=25))
    assert budget.used <= 25
    assert plan.predicted["evaluations"] <= 25


@pytest.mark.parametrize("name", NAMES)
def test_respects_the_time_budget(name, problem):
    start = time.perf_counter()
    _run(name, problem, Budget(time=0.5))
    assert time.perf_counter() - start <= 0.5 * 1.5 + 1.0


@pytest.mark.parametrize("name", NAMES)
def test_no_worse_than_the_initial_plan(name, problem):
    model = get_cost_model("analytical")
    good, _ = _run("pipeline_dp", problem)
    good = Plan(good.placement, good.microbatches, good.schedule)
    target = model.estimate(problem, good).objective
    plan, _ = _run(name, problem, Budget(evaluations=60), initial=[good])
    assert model.estimate(problem, plan).objective <= target * (1 + 1e-9)

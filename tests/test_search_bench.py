"""The search benchmark's lower bound and its simulator column."""

import numpy as np
import pytest

import placer
from placer import Cluster, Device
from placer.bench.search_evolution import lower_bound, run_case, work_speed_bound
from placer.cost import Problem, get_cost_model
from placer.search import Budget, get_strategy


def _cluster(overhead_free=False):
    devs = [Device(f"g{i}", 1e13 * (1 + i % 2), 1e12, efficiency=1.0) for i in range(4)]
    return Cluster.from_rules("four", devs, default=(1e10, 1e-5))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lower_bound_is_below_every_simulated_plan(seed):
    g = placer.datasets.layered(40, width=3, seed=seed)
    p = Problem(g, _cluster())
    lb = lower_bound(p)
    assert lb >= work_speed_bound(p) * (1 - 1e-12)
    sim = get_cost_model("simulator")
    model = get_cost_model("analytical")
    for name in ("single", "even_pipeline", "heft", "pipeline_dp", "round_robin"):
        plan = get_strategy(name).search(p, model, Budget(evaluations=40))
        assert sim.estimate(p, plan).step_time >= lb * (1 - 1e-9), name


def test_lower_bound_is_work_over_speed_without_launch_overhead():
    g = placer.datasets.layered(30, width=2, seed=3)
    p = Problem(g, _cluster(), op_overhead=0.0)
    assert lower_bound(p) == pytest.approx(work_speed_bound(p), rel=1e-12)


def test_lower_bound_counts_launches_on_a_chain():
    """A chain of n ops with overhead c per launch and phase: one sample
    crosses every op, so the step is at least 2 n c."""
    ops = [placer.Op(f"o{i}", flops=1.0) for i in range(50)]
    edges = [placer.Edge(f"o{i}", f"o{i + 1}", 1.0) for i in range(49)]
    g = placer.Graph("chain", ops, edges)
    p = Problem(g, _cluster(), op_overhead=1e-5)
    assert lower_bound(p) >= 2 * 50 * 1e-5 * (1 - 1e-9)


def test_run_case_reports_both_models():
    row = run_case("layered-n60-w4-s0@two-sites", ["even_pipeline", "pipeline_dp"], 2.0,
                   log=lambda *a: None)
    for v in row["strategies"].values():
        assert v["sim_step_time"] > 0 and "sim_ratio_best_strong" in v
        assert v["ratio_lower_bound"] >= 1 - 1e-9 or not v["feasible"]
    assert np.isfinite(row["lower_bound"]) and row["lower_bound"] >= row["work_speed_bound"]

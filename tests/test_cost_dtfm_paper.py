"""DT-FM's communication-only cost model (``dtfm-paper``) against the
paper's scheduler figures and hand-computed small cases."""

import itertools

import numpy as np
import pytest

import placer
from evolution.dtfm import even_allocation, scale_batch
from placer.cost import Problem, get_cost_model
from placer.cost.dtfm_paper import PAPER_SIZES, bottleneck_assignment

#: the even 8 x 8 allocation (devices in rank order) of GPT-3 XL at a batch of
#: about 1e6 tokens, in DT-FM's own model (issue 29's table)
EVEN_8X8 = {"worldwide": 75.29, "regional": 39.98, "multi-universities": 17.65,
            "datacenter-spot": 49.50, "datacenter-ondemand": 16.98}


@pytest.fixture(scope="module")
def gpt():
    # 8 x 1024 tokens traced, x122: 999,424 tokens (the paper's 488 x 2048)
    return scale_batch(placer.datasets.graph("gpt-1.3b.module"), 122)


@pytest.mark.parametrize("scenario", sorted(EVEN_8X8))
def test_even_8x8_reproduces_the_paper_table(gpt, scenario):
    problem = Problem(gpt, placer.Cluster.preset(f"dtfm-{scenario}"))
    report = get_cost_model("dtfm-paper", sizes="paper").estimate(
        problem, even_allocation(problem, 8, 8))
    assert report.feasible and report.model == "dtfm-paper"
    assert round(report.step_time, 2) == pytest.approx(EVEN_8X8[scenario], abs=0.006)
    assert report.step_time == pytest.approx(report.extra["data_parallel"]
                                             + report.extra["pipeline"])
    assert len(report.extra["stages"]) == 8       # the tied head is no ninth stage


def _chain(n_layers=4, param=1e8, act=4e8):
    ops = [placer.Op(f"l{i}", flops=1e9, param_bytes=param, output_bytes=act)
           for i in range(n_layers)]
    edges = [placer.Edge(f"l{i}", f"l{i + 1}", act) for i in range(n_layers - 1)]
    return placer.Graph("chain", ops, edges)


def _cluster(bw, lat):
    devices = [placer.Device(f"d{i}", 1e12, 1e10) for i in range(len(bw))]
    return placer.Cluster("m", devices, bandwidth=bw, latency=lat)


def test_two_by_two_by_hand():
    # devices 0,1 stage one, 2,3 stage two; gradients 2e8 B per stage
    bw = np.full((4, 4), 1e9)
    bw[0, 2] = bw[2, 0] = 1e8           # slow: the matching must avoid 0->2
    lat = np.full((4, 4), 0.01)
    np.fill_diagonal(lat, 0.0)
    g, c = _chain(), _cluster(bw.tolist(), lat.tolist())
    problem = Problem(g, c)
    plan = placer.Plan({"l0": ["d0", "d1"], "l1": ["d0", "d1"],
                        "l2": ["d2", "d3"], "l3": ["d2", "d3"]})
    r = get_cost_model("dtfm-paper").estimate(problem, plan)
    dp = 2 * (0.01 + 2e8 / (2 * 1e9))                  # one peer each
    pp = 0.01 + (4e8 / 2) / 1e9                        # match 0->3, 1->2
    assert r.extra["data_parallel"] == pytest.approx(dp)
    assert r.extra["pipeline"] == pytest.approx(2 * pp)
    assert r.step_time == pytest.approx(dp + 2 * pp)
    assert get_cost_model("dtfm-paper").step_times(
        problem, problem.compile(plan).op_group[None, :],
        groups=[(0, 1), (2, 3)])[0] == pytest.approx(r.objective)


def test_layouts_outside_the_paper_are_infeasible():
    g = _chain()
    c = _cluster(np.full((4, 4), 1e9).tolist(), np.zeros((4, 4)).tolist())
    problem = Problem(g, c)
    model = get_cost_model("dtfm-paper")
    one = model.estimate(problem, placer.Plan({op: ["d0"] for op in g.ids}))
    assert not one.feasible and "3 of 4 devices unused" in one.extra["not_paper_layout"]
    good = placer.Plan({"l0": ["d0", "d1"], "l1": ["d0", "d1"],
                        "l2": ["d2", "d3"], "l3": ["d2", "d3"]})
    assert model.estimate(problem, good).objective < one.objective
    shaped = get_cost_model("dtfm-paper", shape=(4, 1)).estimate(problem, good)
    assert not shaped.feasible and "not 4x1" in shaped.extra["not_paper_layout"]
    uneven = placer.Plan({"l0": ["d0"], "l1": ["d0"], "l2": ["d1", "d2", "d3"],
                          "l3": ["d1", "d2", "d3"]})
    assert "unequal" in model.estimate(problem, uneven).extra["not_paper_layout"]


def test_bottleneck_assignment_is_brute_force_min_max():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 5, 6):
        for _ in range(20):
            C = rng.integers(0, 9, size=(n, n)).astype(float)
            brute = min(max(C[i, p[i]] for i in range(n))
                        for p in itertools.permutations(range(n)))
            assert bottleneck_assignment(C) == brute


def test_paper_sizes_are_the_schedulers():
    # 0.65 GB of fp32 gradients per stage of 8, and 0.47125 "GB" of fp16
    # activations per replica of 8 (GPT-3 XL, DT-FM's scheduler)
    assert PAPER_SIZES["gradient_bytes"] / 8 == pytest.approx(0.65e9)
    assert PAPER_SIZES["activation_bytes"] / 8 == pytest.approx(0.47125e9, rel=1e-4)


def test_dtfm_matches_the_papers_solver_in_its_own_model(gpt):
    # DT-FM's solver (population 100, 4,900 trials) finds 49.22 s on
    # worldwide; placer's dtfm restricted to its 8 x 8 layout and scoring
    # with its model does as well within 200 evaluations
    from placer.bench.dtfm_paper import PAPER_DTFM, paper_model
    from placer.search import Budget, get_strategy
    problem = Problem(gpt, placer.Cluster.preset("dtfm-worldwide"))
    model = paper_model()
    budget = Budget(evaluations=200)
    plan = get_strategy("dtfm", **PAPER_DTFM).search(problem, budget.meter(model), budget, 0)
    report = model.estimate(problem, plan)
    assert report.feasible and report.step_time <= 49.22 + 0.005

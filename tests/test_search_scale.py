"""Plans at the scale of the DT-FM paper: every heuristic's plan fits,
pipeline_dp is never worse than the even split, microbatch counts reach
the batch."""

import pytest

import placer
from evolution.dtfm import scale_batch
from placer.cost import Problem
from placer.search import get_strategy
from placer.search.base import batch_microbatches


@pytest.fixture(scope="module")
def regional_1m():
    # 999,424 tokens (the paper's 488 x 2048) on 64 V100s in four regions
    return scale_batch(placer.datasets.graph("gpt-1.3b.module"), 122), \
        placer.Cluster.preset("dtfm-regional")


def test_batch_microbatches_reach_the_batch():
    assert batch_microbatches(976) == [1, 2, 4, 8, 16, 61, 122, 244, 488, 976]
    assert batch_microbatches(1024)[-1] == 1024
    assert batch_microbatches(7) == [1, 7]
    assert batch_microbatches(976, limit=100) == [1, 2, 4, 8, 16, 61]
    for b in (1, 6, 97, 360, 976):
        ms = batch_microbatches(b)
        assert all(b % m == 0 for m in ms) and ms[-1] == b
        assert all(y >= 2 * x for x, y in zip(ms, ms[1:]))


def test_strategies_search_microbatches_up_to_the_batch(regional_1m):
    g, c = regional_1m
    problem = Problem(g, c)
    assert get_strategy("even_pipeline").microbatch_choices(problem)[-1] == 976
    assert get_strategy("even_pipeline", microbatches=[4]).microbatch_choices(problem) == [4]


@pytest.mark.parametrize("method", ["even_pipeline", "pipeline_dp"])
def test_heuristics_fit_at_a_million_tokens(regional_1m, method):
    g, c = regional_1m
    plan = placer.optimize(g, c, method=method, seed=0, time_budget=10.0)
    assert plan.predicted["feasible"], plan.predicted.get("infeasible")
    assert plan.microbatches > 16          # 16 microbatches do not fit here
    assert placer.simulate(g, c, plan).feasible


def test_pipeline_dp_no_worse_than_even_pipeline_by_the_simulator():
    # examples/geo_gpt.py's case: the DP alone chose a 10-device plan of
    # 4.99 s where the even split takes 0.87 s
    g, c = placer.datasets.graph("gpt-1.3b.module"), placer.Cluster.preset("dtfm-regional")
    dp, even = (placer.optimize(g, c, method=m, seed=0, time_budget=10.0)
                for m in ("pipeline_dp", "even_pipeline"))
    t_dp, t_even = (placer.simulate(g, c, p).step_time for p in (dp, even))
    assert t_dp <= t_even * (1 + 1e-9)
    assert t_dp < 1.0


@pytest.mark.parametrize("method", ["even_pipeline", "pipeline_dp"])
def test_a_clear_line_when_nothing_fits(method):
    # GPT-1.3B's weights and Adam state alone need 21 GB; two 2 GB devices
    devices = [placer.Device(f"t{i}", 1e13, 2e9, site="lab") for i in range(2)]
    cluster = placer.Cluster.from_rules("tiny", devices, default=(1e9, 1e-3))
    g = placer.datasets.graph("gpt-1.3b.module")
    plan = placer.optimize(g, cluster, method=method, seed=0, time_budget=5.0)
    assert not plan.predicted["feasible"]
    first, fix = plan.predicted["infeasible"][:2]
    assert "runs out of memory first" in first and first.split()[0] in ("t0", "t1")
    assert "more device(s)" in fix

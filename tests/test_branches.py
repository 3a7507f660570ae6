"""Branch-spread candidates of rl's one-shot plan (gnn/branches.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch_geometric")
pytest.importorskip("deap")

from placer import datasets, generators  # noqa: E402
from placer.cost import Problem, get_cost_model  # noqa: E402

from gnn.branches import branch_regions, branch_rows, spread_rows  # noqa: E402
from gnn.problems import site_replicas  # noqa: E402


def _space(problem):
    from evolution.genome import Space
    return Space(problem, [1, 2, 4, 8], ["1f1b", "gpipe"])


def test_regions_are_the_expert_branches_between_router_and_combine():
    problem = Problem(generators.expert_layers(6, 3), datasets.cluster("classes-d8-s0"))
    regions = branch_regions(problem)
    assert [(problem.ids[f], problem.ids[j]) for f, _, j in regions] == \
        [(f"b{b}.router", f"b{b}.combine") for b in range(3)]
    for f, branches, j in regions:
        assert len(branches) == 6
        for b, chain in enumerate(branches):
            names = [problem.ids[i] for i in chain]
            assert names == [f"{problem.ids[f][:3]}e{b}.{k}" for k in ("up", "gelu", "down")]
    # a chain of ops has no branches; nor has a fork whose branches end apart
    chain = Problem(datasets.graph("layered-n30-w1-s0"), datasets.cluster("classes-d8-s0"))
    assert branch_regions(chain) == []


def test_spread_moves_only_branches_onto_the_forks_site_and_class():
    problem = Problem(generators.expert_layers(8, 2), datasets.cluster("classes-d12-s1"))
    space = _space(problem)
    regions = branch_regions(problem)
    branch_ops = np.concatenate([b for _, bs, _ in regions for b in bs])
    other = np.setdiff1d(np.arange(problem.n_ops), branch_ops)
    fast = int(np.argmax(problem.rate))
    base = np.full(problem.n_ops, fast, dtype=np.int64)
    rows = spread_rows(problem, space, base, regions, sizes=(2, 3, 4))
    assert len(rows) == 3 * (1 + len(regions))        # all regions, then each alone
    for row in rows:
        assert (row[other] == fast).all()
        used = np.unique(row[branch_ops])
        assert len(used) > 1
        assert (problem.site[used] == problem.site[fast]).all()
        assert np.allclose(problem.rate[used], problem.rate[fast], rtol=0.01)
    # longest first onto the device that finishes first: with every region
    # spread over k equal devices, the busiest one ends below the one-device load
    work = problem.flops + problem.bwd_flops
    for row in rows[:3]:
        loads = np.bincount(row, work, minlength=problem.n_devices)
        assert loads.max() < work.sum() * 0.75


def test_branch_rows_put_the_tail_on_the_body_or_another_sites_pair():
    problem = Problem(datasets.graph("experts-e16-l2-s1"), datasets.cluster("classes-d12-s1"))
    space = _space(problem)
    rows = branch_rows(problem, space)
    assert len(rows) and len({r.tobytes() for r in rows}) == len(rows)
    join = branch_regions(problem)[-1][2]
    tails = {space.table.devices(int(r[-1])) for r in rows}
    allowed = set(site_replicas(problem)) | {(d,) for d in range(problem.n_devices)}
    assert tails <= allowed and any(len(t) > 1 for t in tails)
    for r in rows:
        assert (r[join:] == r[-1]).all()          # the tail is one group
    # no regions, no rows
    chain = Problem(datasets.graph("layered-n30-w1-s0"), datasets.cluster("classes-d8-s0"))
    assert len(branch_rows(chain, _space(chain))) == 0


def test_one_shot_rl_finds_the_expert_parallel_plan():
    """experts-e16-l2 on classes-d12: every chain of stages is >= 29.8 ms by
    the simulator; the branch-spread plan (experts over site 0's A100s, the
    head data-parallel on site 2's pair) is 19.8 ms, below evolution's 10 s
    plan (21.5 ms). Without the family rl returns a chain."""
    from placer.search import Budget, get_strategy
    problem = Problem(datasets.graph("experts-e16-l2-s1"), datasets.cluster("classes-d12-s1"))
    cost = get_cost_model("analytical")
    sim = get_cost_model("simulator")
    plan = get_strategy("rl").search(problem, cost, Budget())
    t = sim.estimate(problem, plan).step_time
    assert plan.extra["source"] == "branches" and t < 0.0215
    chain = get_strategy("rl", branches=False).search(problem, cost, Budget())
    assert sim.estimate(problem, chain).step_time > 0.029
    # hybrid hands evolution the policy's plans without them
    assert get_strategy("hybrid").branches is False

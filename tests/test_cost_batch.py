"""The analytical model's batched Plan path: the same figures as one plan at
a time and as the array path, and its per-plan cache sees every change."""

import gc
import random

import numpy as np
import pytest

from placer import Plan
from placer.bench.cost import bench_cluster, bench_graph, random_plans
from placer.cost import Analytical, Problem, Simulator
from placer.errors import PlanError
from placer.groups import GroupTable


def _problem(n=300, devices=16, seed=2):
    g = bench_graph(n, seed=seed)
    c = bench_cluster(devices)
    return g, c, Problem(g, c)


def _figures(r):
    return (r.step_time, r.objective, r.feasible, r.bottleneck, r.peak_memory,
            r.memory_excess, r.busy, r.compute, r.comm, r.idle, r.bytes_per_link)


@pytest.mark.parametrize("devices", [4, 16, 64])
def test_estimate_many_equals_estimate_and_step_times(devices):
    g, c, p = _problem(devices=devices)
    plans = random_plans(g, c, 40, seed=devices, microbatches=4)
    ana = Analytical()
    batch = ana.estimate_many(p, plans)
    for plan, r in zip(plans, batch):
        assert _figures(r) == _figures(ana.estimate(p, plan))
    # again (cached compilation) and in another order: identical
    again = ana.estimate_many(p, plans[::-1])[::-1]
    assert [_figures(r) for r in again] == [_figures(r) for r in batch]
    A, groups, m, schedules = p.compile_many(plans)
    for schedule in ("gpipe", "1f1b"):
        pick = [i for i, s in enumerate(schedules) if s == schedule]
        fast = ana.step_times(p, A[pick], groups=groups[p.n_devices:], microbatches=4,
                              schedule=schedule)
        assert fast.tolist() == [batch[i].objective for i in pick]


def test_compile_many_matches_compile():
    g, c, p = _problem()
    plans = random_plans(g, c, 30, seed=7)
    A, groups, m, schedules = p.compile_many(plans)
    table = GroupTable(p.n_devices)
    rows = [p.compile(plan, table) for plan in plans]
    assert np.array_equal(A, np.stack([r.op_group for r in rows]))
    assert groups == rows[-1].groups
    # each Compiled keeps the table as it was: later plans extend only the shared one
    assert [len(r.groups) for r in rows] == sorted(len(r.groups) for r in rows)
    assert all(r.groups == groups[:len(r.groups)] for r in rows)
    assert len(table) == len(groups)
    assert m.tolist() == [plan.microbatches for plan in plans]
    assert schedules == [plan.schedule for plan in plans]


def test_placement_in_any_key_order():
    g, c, p = _problem()
    plan = random_plans(g, c, 1, seed=3)[0]
    keys = list(plan.placement)
    random.Random(0).shuffle(keys)
    shuffled = Plan({k: plan.placement[k] for k in keys}, plan.microbatches, plan.schedule)
    ana = Analytical()
    assert _figures(ana.estimate(p, shuffled)) == _figures(ana.estimate(p, plan))


def test_cached_plan_sees_replaced_lists_and_keys():
    g, c, p = _problem()
    plan = random_plans(g, c, 1, seed=4)[0]
    ana = Analytical()
    before = ana.estimate(p, plan).step_time
    op = p.ids[len(p.ids) // 2]
    other = next(d for d in c.names if d not in plan.placement[op])
    plan.placement[op] = [other]                      # a new list: seen
    fresh = Plan(dict(plan.placement), plan.microbatches, plan.schedule)
    after = ana.estimate(p, plan).step_time
    assert after == ana.estimate(p, fresh).step_time
    assert after != before
    plan.placement["renamed"] = plan.placement.pop(p.ids[-1])
    with pytest.raises(PlanError, match="not placed"):
        ana.estimate(p, plan)
    plan.placement = {}
    with pytest.raises(PlanError):
        ana.estimate_many(p, [plan])


def test_cache_entries_go_with_their_plans():
    g, c, p = _problem()
    plans = random_plans(g, c, 20, seed=5)
    Simulator().estimate(p, random_plans(g, c, 1, seed=9)[0])
    assert not p._plan_arrays.entries           # compile() keeps nothing
    Analytical().estimate_many(p, plans)
    assert len(p._plan_arrays.entries) == 20
    del plans
    gc.collect()
    assert not p._plan_arrays.entries and p._plan_arrays.ops == 0


def test_bad_pipeline_settings_are_plan_errors():
    g, c, p = _problem(n=50, devices=4)
    plan = random_plans(g, c, 1, seed=1)[0]
    for field, value in (("schedule", "zigzag"), ("microbatches", 0)):
        bad = Plan(plan.placement, plan.microbatches, plan.schedule)
        setattr(bad, field, value)
        with pytest.raises(PlanError):
            Analytical().estimate_many(p, [plan, bad])


def test_problem_still_pickles_and_copies_after_estimates():
    import copy
    import pickle
    g, c, p = _problem(n=60, devices=4)
    plans = random_plans(g, c, 3, seed=6)
    ana = Analytical()
    before = [r.step_time for r in ana.estimate_many(p, plans)]
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
        assert not q._plan_arrays.entries
        assert [r.step_time for r in ana.estimate_many(q, plans)] == before


def test_overlapping_groups_batch_equals_one_by_one():
    # data-parallel groups sharing devices (their all-reduces queue on the
    # shared ones): a batch prices each plan as it prices it alone
    g, c, p = _problem(n=200, devices=8)
    names = c.names
    rng = np.random.default_rng(0)
    plans = []
    for k in range(12):
        sets = [sorted(rng.choice(names, size=int(rng.integers(1, 5)), replace=False).tolist())
                for _ in range(3)]
        cuts = np.sort(rng.choice(np.arange(1, len(p.ids)), size=2, replace=False))
        stage = np.searchsorted(cuts, np.arange(len(p.ids)), side="right")
        plans.append(Plan({op: list(sets[s]) for op, s in zip(p.ids, stage.tolist())},
                          microbatches=4, schedule=("gpipe", "1f1b")[k % 2]))
    ana = Analytical()
    batch = ana.estimate_many(p, plans)
    for plan, r in zip(plans, batch):
        alone = ana.estimate(p, plan)
        assert r.step_time == pytest.approx(alone.step_time, rel=1e-12)
        assert r.objective == pytest.approx(alone.objective, rel=1e-12)


def test_cache_check_on_placement_versions_and_plain_dicts():
    import copy
    import pickle
    from placer.plan import Placement
    g, c, p = _problem()
    plan = random_plans(g, c, 1, seed=6)[0]
    assert isinstance(plan.placement, Placement)
    ana = Analytical()
    before = ana.estimate(p, plan).step_time
    op = p.ids[len(p.ids) // 3]
    other = next(d for d in c.names if d not in plan.placement[op])
    view = plan.placement                             # edited through another name
    view.update({op: [other]})
    after = ana.estimate(p, plan).step_time
    assert after != before
    assert after == ana.estimate(p, Plan(dict(plan.placement), plan.microbatches,
                                         plan.schedule)).step_time
    # a plain dict put there behind the dataclass's back: the two-scan check
    object.__setattr__(plan, "placement", dict(plan.placement))
    assert ana.estimate(p, plan).step_time == after
    plan.placement[op] = [next(d for d in c.names if d != other)]
    assert ana.estimate(p, plan).step_time == ana.estimate(
        p, Plan(dict(plan.placement), plan.microbatches, plan.schedule)).step_time
    # copies and pickles keep the type and the items
    for clone in (pickle.loads(pickle.dumps(Placement(a=["x"]))), copy.deepcopy(Placement(a=["x"]))):
        assert isinstance(clone, Placement) and clone == {"a": ["x"]}

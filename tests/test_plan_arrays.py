"""placer.search.arrays: one array form of a plan for every search."""

import numpy as np
import pytest

from placer import Cluster, Plan, datasets
from placer.cost import Problem, get_cost_model
from placer.search.arrays import GroupTable, PlanArrays, compact_rows


@pytest.fixture(scope="module")
def problem():
    return Problem(datasets.graph("layered-n20-w2-s0"), Cluster.preset("two-sites"))


def test_compact_renumbers_only_the_sets_used_in_id_order():
    D = 4
    A = np.array([[0, 6, 6, 1], [4, 6, 0, 0]])
    rows, used = compact_rows(A, [(0, 1), (1, 2), (2, 3)], D)
    assert rows.tolist() == [[0, 5, 5, 1], [4, 5, 0, 0]]
    assert used == [(0, 1), (2, 3)]
    single = np.array([0, 1, 2])
    same, none = compact_rows(single, [(0, 1)], D)
    assert same is single and none == []
    c = PlanArrays(np.array([6, 6, 0]), ((0, 1), (1, 2), (2, 3)), 2, "1f1b")
    assert c.compact(D).assign.tolist() == [4, 4, 0] and c.compact(D).groups == ((2, 3),)
    # one plan under two numberings is one key
    other = PlanArrays(np.array([5, 5, 0]), ((0, 1), (2, 3)), 2, "1f1b")
    assert c.key(D) == other.key(D) != other.replace(schedule="gpipe").key(D)


def test_to_plan_round_trips_through_the_cost_models_form(problem):
    D = problem.n_devices
    assign = np.zeros(problem.n_ops, dtype=np.int64)
    assign[problem.n_ops // 2:] = D + 1
    c = PlanArrays(assign, ((0, 1), (2, 3)), 4, "gpipe", "layout", objective=1.5)
    plan = c.to_plan(problem, "test", extra={"source": c.source})
    names = problem.devices
    assert plan.placement[problem.ids[0]] == [names[0]]
    assert plan.placement[problem.ids[-1]] == [names[2], names[3]]
    assert (plan.microbatches, plan.schedule, plan.method) == (4, "gpipe", "test")
    assert plan.extra["source"] == "layout" and c.label == "layout"
    assert plan.placement == c.placement(problem)
    back = PlanArrays.from_plan(problem, plan)
    assert back.key(D) == c.key(D)
    # the array path and the plan path score it alike
    sim = get_cost_model("simulator")
    k = c.compact(D)
    row = sim.step_times(problem, k.assign[None], groups=k.groups, microbatches=4,
                         schedule="gpipe")
    assert float(row[0]) == pytest.approx(sim.estimate(problem, plan).objective, rel=1e-9)


def test_tasks_count_replicas_times_microbatches(problem):
    D = problem.n_devices
    assign = np.zeros(problem.n_ops, dtype=np.int64)
    assign[:5] = D                  # five ops on two devices
    c = PlanArrays(assign, ((0, 1),), [2, 8])
    assert c.tasks(D) == (problem.n_ops + 5) * 8
    with pytest.raises(Exception, match="microbatch"):
        PlanArrays(assign).count()


def test_group_table_numbers_sets_as_first_seen():
    t = GroupTable(4)
    assert t.id([3]) == 3 and t.id([2, 1]) == 4 and t.id((1, 2)) == 4 and t.id([0, 3]) == 5
    assert t.extra() == [(1, 2), (0, 3)] and t.size(5) == 2
    with pytest.raises(Exception, match="bad device set"):
        t.id([1, 1])
    # the batch path: new sets numbered in order, known ones looked up
    assert t.ids([(0, 1, 2), (1, 2), (0, 1, 2), (2, 3)]) == [6, 4, 6, 7]
    sets = t.sets()
    assert sets == [(0,), (1,), (2,), (3,), (1, 2), (0, 3), (0, 1, 2), (2, 3)]
    sets.append((9,))
    assert len(t) == 8              # a copy: the table is not extended through it
    assert t.compact(np.array([5, 5, 0]))[1] == [(0, 3)]
    from placer.groups import GroupTable as Low
    assert Low is GroupTable        # one numbering, below the cost models


def test_old_names_are_the_one_type(problem):
    from placer.search.common import Candidate as Heuristic
    gnn = pytest.importorskip("gnn.strategies")
    assert Heuristic is PlanArrays and gnn.Candidate is PlanArrays
    from evolution.genome import GroupTable as Genomes, OpGenome, Space
    assert Genomes is GroupTable
    space = Space(problem, [1, 2], ["1f1b"])
    D = problem.n_devices
    assign = np.zeros(problem.n_ops, dtype=np.int64)
    assign[3:] = space.table.id([1, 2])
    g = OpGenome(assign, 2, "1f1b", "seed")
    plan = g.to_plan(space, "evolution")
    assert plan.placement[problem.ids[-1]] == [problem.devices[1], problem.devices[2]]
    assert isinstance(plan, Plan) and plan.method == "evolution"
    assert OpGenome.from_plan(space, plan).key() == g.key()
    assert g.arrays(space).key(D) == PlanArrays.from_plan(problem, plan).key(D)

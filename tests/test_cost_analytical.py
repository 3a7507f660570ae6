"""The analytical model: hand-computed cases, batching, the array fast path,
and agreement with the simulator on small random plans."""

import numpy as np
import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import Analytical, Problem, Simulator, cost_models, get_cost_model
from placer.cost.problem import INFEASIBLE
from placer.errors import PlanError
from placer.groups import GroupTable

RATE = 1e12


def cluster(n=2, bw=1e9, lat=0.0, memory=1e12):
    devices = [Device(f"d{i}", RATE, memory, efficiency=1.0) for i in range(n)]
    return Cluster.from_rules("test", devices, default=(bw, lat))


def chain(S, flops=8e9, training=True, nbytes=0.0, params=0.0):
    ops = [Op(f"o{i}", flops=flops, param_bytes=params) for i in range(S)]
    edges = [Edge(f"o{i}", f"o{i + 1}", nbytes) for i in range(S - 1)]
    return Graph("chain", ops, edges, training=training)


def test_registered_names():
    assert cost_models() == ["analytical", "dtfm-paper", "simulator"]
    assert get_cost_model("analytical").name == "analytical"


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_equal_stages_training(schedule):
    # (m + S - 1) x (forward t + backward 2t), no transfers
    S, m = 4, 8
    t = 8e9 / m / RATE
    p = Problem(chain(S), cluster(S), op_overhead=0.0)
    plan = Plan({f"o{i}": [f"d{i}"] for i in range(S)}, microbatches=m, schedule=schedule)
    assert Analytical().estimate(p, plan).step_time == pytest.approx((m + S - 1) * 3 * t)


def test_transfer_and_latency_in_fill():
    # one microbatch: 8 ms + (1 ms transfer + 2 ms latency) + 8 ms forward only
    g = chain(2, training=False, nbytes=1e6)
    p = Problem(g, cluster(2, lat=2e-3), op_overhead=0.0)
    r = Analytical().estimate(p, Plan({"o0": ["d0"], "o1": ["d1"]}))
    assert r.step_time == pytest.approx(8e-3 + 1e-3 + 2e-3 + 8e-3)
    assert r.bytes_per_link == {"d0->d1": pytest.approx(1e6)}


def test_batch_equals_single_and_array_path():
    S, m = 4, 4
    g = chain(S, nbytes=1e7, params=1e8)
    p = Problem(g, cluster(S, lat=1e-4, memory=2e9))
    plans = [Plan({f"o{i}": [f"d{i % k}"] for i in range(S)}, microbatches=m)
             for k in (1, 2, 4)]
    plans.append(Plan({f"o{i}": ["d0", "d1"] if i < 2 else ["d2"] for i in range(S)},
                      microbatches=m))
    ana = Analytical()
    batch = ana.estimate_many(p, plans)
    single = [ana.estimate(p, plan) for plan in plans]
    for a, b in zip(batch, single):
        assert a.to_dict() == b.to_dict()
    rows = np.array([[i % k for i in range(S)] for k in (1, 2, 4)] + [[4, 4, 2, 2]])
    fast = ana.step_times(p, rows, groups=[(0, 1)], microbatches=m)
    assert fast == pytest.approx([r.objective for r in batch])


def test_infeasible_objective_ranks_after_feasible():
    g = chain(2, params=3e8)
    p = Problem(g, cluster(2, memory=2e9))
    over = Analytical().estimate(p, Plan({"o0": ["d0"], "o1": ["d0"]}))
    fits = Analytical().estimate(p, Plan({"o0": ["d0"], "o1": ["d1"]}))
    assert not over.feasible and fits.feasible
    assert over.objective >= INFEASIBLE > fits.objective
    # both ops' parameters + gradients + 2 Adam states on d0: 2.4e9 > 2e9
    assert over.memory_excess == {"d0": pytest.approx(2 * 3e8 * 4 - 2e9)}


def test_unknown_device_and_missing_op_are_plan_errors():
    p = Problem(chain(2), cluster(2))
    with pytest.raises(PlanError):
        Analytical().estimate(p, Plan({"o0": ["d0"]}))
    with pytest.raises(PlanError):
        Analytical().estimate(p, Plan({"o0": ["d0"], "o1": ["zz"]}))


def test_ranks_like_the_simulator_on_random_plans():
    from placer.bench.cost import bench_cluster, bench_graph, kendall_tau, random_plans
    g = bench_graph(200, seed=3)
    c = bench_cluster(8)
    p = Problem(g, c)
    plans = random_plans(g, c, 40, seed=3, microbatches=4)
    sim = [Simulator().estimate(p, plan).step_time for plan in plans]
    ana = [r.step_time for r in Analytical().estimate_many(p, plans)]
    assert kendall_tau(sim, ana) > 0.75


def test_reports_pickle_and_match_the_simulator_layout():
    import pickle
    g = chain(2, nbytes=1e6)
    p = Problem(g, cluster(2))
    r = Analytical().estimate(p, Plan({"o0": ["d0"], "o1": ["d1"]}))
    back = pickle.loads(pickle.dumps(r))
    assert back.to_dict() == r.to_dict()
    assert r.bytes_per_link == {"d0->d1": pytest.approx(1e6), "d1->d0": pytest.approx(1e6)}


def test_objectives():
    g = chain(2)
    plan = Plan({"o0": ["d0"], "o1": ["d1"]})
    step = Analytical().estimate(Problem(g, cluster(2)), plan).step_time
    thr = Analytical().estimate(Problem(g, cluster(2), objective="throughput"), plan)
    assert thr.objective == pytest.approx(-1.0 / step)
    mem = Simulator().estimate(Problem(g, cluster(2), objective="memory"), plan)
    assert 0 <= mem.objective < 1


def test_problem_options_round_trip():
    p = Problem(chain(2), cluster(2), recompute=True, op_overhead=1e-6, bucket_bytes=1e6)
    q = Problem(chain(3), cluster(3), **p.options)
    assert q.options == p.options


def test_array_path_matches_plans_on_random_plans():
    # runs, cut edges and data-parallel groups: both paths give the same objectives
    from placer.bench.cost import bench_cluster, bench_graph, random_plans
    g = bench_graph(120, seed=5)
    c = bench_cluster(8)
    p = Problem(g, c)
    plans = random_plans(g, c, 30, seed=5, microbatches=4)
    ana = Analytical()
    reports = ana.estimate_many(p, plans)
    table = GroupTable(p.n_devices)
    rows = np.stack([p.compile(plan, table).op_group for plan in plans])
    groups = p.compile(plans[-1], table).groups[p.n_devices:]
    for schedule in ("gpipe", "1f1b"):
        pick = [i for i, plan in enumerate(plans) if plan.schedule == schedule]
        fast = ana.step_times(p, rows[pick], groups=groups, microbatches=4,
                              schedule=schedule)
        assert fast.tolist() == [reports[i].objective for i in pick]
        single = [ana.estimate(p, plans[i]).objective for i in pick]
        assert fast == pytest.approx(single, rel=1e-12)


def test_compiled_passes_match_plain_python(monkeypatch):
    """The numba-compiled crossing-edge, longest-path, crossing-cost and
    link-load passes give the same estimates as the same functions run as
    plain Python."""
    from placer.bench.cost import bench_cluster, bench_graph, random_plans
    from placer.cost import analytical_loops
    g = bench_graph(150, seed=3)
    c = bench_cluster(6)
    p = Problem(g, c)
    plans = random_plans(g, c, 40, seed=3, microbatches=4)
    compiled = Analytical().estimate_many(p, plans)
    for name in ("crossing_edges", "run_paths", "crossing_costs", "links_dense"):
        monkeypatch.setattr(analytical_loops, name, getattr(analytical_loops, name).py_func)
    plain = Analytical().estimate_many(Problem(g, c), plans)
    assert [r.step_time for r in compiled] == [r.step_time for r in plain]
    assert [r.peak_memory for r in compiled] == [r.peak_memory for r in plain]
    assert len({round(r.step_time, 12) for r in compiled}) > 5


@pytest.mark.parametrize("o1_params, faster_first", [(1e3, True), (1e7, False)])
def test_infeasible_plans_rank_by_excess_then_step_time(o1_params, faster_first):
    """Where nothing fits (o0 alone overflows d0), plans whose largest
    relative excess is the same to EXCESS_RESOLUTION rank by step time (the
    faster first), and a plan further over ranks after one less over,
    however fast: in the analytical model and the simulator alike."""
    from placer.cost.problem import EXCESS_RESOLUTION, infeasible_objective
    ops = [Op("o0", flops=8e9, param_bytes=6.0025e8), Op("o1", flops=8e9, param_bytes=o1_params),
           Op("o2", flops=8e9, param_bytes=1e3)]
    edges = [Edge("o0", "o1", 1e3), Edge("o1", "o2", 1e3)]
    p = Problem(Graph("big", ops, edges), cluster(2, bw=1e3, memory=2e9))
    alone = Plan({"o0": ["d0"], "o1": ["d0"], "o2": ["d0"]})      # no transfers: fast
    split = Plan({"o0": ["d0"], "o1": ["d1"], "o2": ["d0"]})      # 1 s transfers: slow
    for model in (Analytical(), Simulator()):
        a, s = model.estimate(p, alone), model.estimate(p, split)
        assert not a.feasible and not s.feasible
        assert a.step_time < s.step_time and a.objective >= INFEASIBLE
        assert (a.objective < s.objective) == faster_first
    assert infeasible_objective(0.2 + EXCESS_RESOLUTION / 2, 100.0) < \
        infeasible_objective(0.2 + 3 * EXCESS_RESOLUTION / 2, 0.0)
    np.testing.assert_array_equal(infeasible_objective(np.array([0.1, 0.1]), np.array([2.0, 1.0])),
                                  [INFEASIBLE * 1.1 + 2.0, INFEASIBLE * 1.1 + 1.0])

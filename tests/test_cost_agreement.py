"""Cases where the analytical model used to disagree with the simulator:
each would have caught the formula it pins down."""

import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.bench.cost import bench_cluster, bench_graph
from placer.cost import Analytical, Problem, Simulator


def _both(graph, cluster, plan, **options):
    p = Problem(graph, cluster, **options)
    return Simulator().estimate(p, plan).step_time, Analytical().estimate(p, plan).step_time


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_one_device_is_m_times_a_microbatch(schedule):
    # nothing overlaps on one device: every microbatch pays all its ops (the
    # fill is the device's whole share, not the graph's critical path)
    g = bench_graph(100)
    plan = Plan({op: ["g1"] for op in g.topological_order()}, 8, schedule)
    sim, ana = _both(g, bench_cluster(4), plan)
    assert ana == pytest.approx(sim, rel=1e-9)


def _chain(n, flops=4e9, nbytes=4e6):
    ops = [Op(f"o{i}", flops=flops, output_bytes=nbytes) for i in range(n)]
    return Graph("chain", ops, [Edge(f"o{i}", f"o{i + 1}", nbytes) for i in range(n - 1)])


def test_1f1b_cap_of_a_later_stage_bounds_the_rate():
    # d2 sits across a 20 ms link: d1 may hold only 2 microbatches, so its
    # round trip through d2, not the first device's, sets the pace
    devices = [Device(f"d{i}", 1e14, 1e11, efficiency=1.0, site="a" if i < 2 else "b")
               for i in range(3)]
    c = Cluster.from_rules("c", devices, default=(1e11, 1e-6), sites=[("a", "b", 1e9, 0.02)])
    plan = Plan({f"o{i}": [f"d{i // 3}"] for i in range(9)}, 8, "1f1b")
    sim, ana = _both(_chain(9), c, plan)
    assert ana == pytest.approx(sim, rel=0.15)


@pytest.mark.parametrize("schedule,tolerance", [("gpipe", 0.05), ("1f1b", 0.2)])
def test_parallel_branches_pay_one_latency(schedule, tolerance):
    # six branches on six far-apart devices run at once: a microbatch waits
    # for one hop out and one back, not for a hop per branch in op order
    k = 6
    ops = ([Op("src", flops=1e9, output_bytes=1e5)]
           + [Op(f"b{i}", flops=2e11, output_bytes=1e5) for i in range(k)]
           + [Op("join", flops=1e9)])
    edges = [Edge("src", f"b{i}", 1e5) for i in range(k)] + \
        [Edge(f"b{i}", "join", 1e5) for i in range(k)]
    devices = [Device(f"d{i}", 1e14, 1e11, efficiency=1.0, site=f"s{i}") for i in range(k)]
    c = Cluster.from_rules("far", devices, default=(1e9, 0.05))
    plan = Plan({"src": ["d0"], "join": ["d0"], **{f"b{i}": [f"d{i}"] for i in range(k)}},
                4, schedule)
    sim, ana = _both(Graph("branches", ops, edges), c, plan)
    assert ana == pytest.approx(sim, rel=tolerance)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_interleaved_branches_overlap_their_latencies(schedule):
    # branches a_i -> b_i side by side, their ops interleaved in topological
    # order and cut in blocks of three over two far-apart devices (like
    # DLRM's embedding tables): every other block boundary cuts a branch,
    # but those cuts run at once, so the fill pays about one round trip
    k = 8
    ops = [Op("src", flops=1e9, output_bytes=1e5)]
    edges = []
    for i in range(k):
        ops += [Op(f"a{i}", flops=1e9, output_bytes=1e5), Op(f"b{i}", flops=1e9,
                                                             output_bytes=1e5)]
        edges += [Edge("src", f"a{i}", 1e5), Edge(f"a{i}", f"b{i}", 1e5),
                  Edge(f"b{i}", "join", 1e5)]
    ops.append(Op("join", flops=1e9))
    g = Graph("interleaved", ops, edges)
    devices = [Device(f"d{i}", 1e14, 1e11, efficiency=1.0, site=f"s{i}") for i in range(2)]
    c = Cluster.from_rules("far", devices, default=(1e9, 0.05))
    order = g.topological_order()
    plan = Plan({op: [f"d{(i // 3) % 2}"] for i, op in enumerate(order)}, 4, schedule)
    sim, ana = _both(g, c, plan)
    assert ana == pytest.approx(sim, rel=0.1)


@pytest.mark.parametrize("training", [True, False])
def test_a_device_runs_its_parallel_branches_one_after_another(training):
    # four parallel branches on d0, their join (as heavy as all four) on
    # d1: one microbatch, so d1 waits for all of d0's work. A run weighed by
    # its share of the critical path (one branch) put the fill at 5 of the
    # 8 units of work the two devices do one after the other.
    ops = [Op("src", flops=1e6, output_bytes=1e3)]
    ops += [Op(f"b{i}", flops=1e11, output_bytes=1e3) for i in range(4)]
    ops.append(Op("join", flops=4e11))
    edges = [Edge("src", f"b{i}", 1e3) for i in range(4)]
    edges += [Edge(f"b{i}", "join", 1e3) for i in range(4)]
    devices = [Device(f"d{i}", 1e14, 1e11, efficiency=1.0) for i in range(2)]
    c = Cluster.from_rules("two", devices, default=(1e11, 0.0))
    plan = Plan({"src": ["d0"], **{f"b{i}": ["d0"] for i in range(4)}, "join": ["d1"]}, 1)
    sim, ana = _both(Graph("branches", ops, edges, training=training), c, plan)
    serial = (8e11 + 1e6) * (3 if training else 1) / 1e14     # backward: twice the forward
    assert sim == pytest.approx(serial, rel=0.02)
    assert ana == pytest.approx(sim, rel=0.02)


def _four_devices(flops=1e12, bandwidth=1e9):
    devices = [Device(f"d{i}", flops, 1e12, efficiency=1.0) for i in range(4)]
    return Cluster.from_rules("four", devices, default=(bandwidth, 0.0))


def test_allreduce_longer_than_the_backward_it_hides_behind():
    # 2 stages x 2 replicas, one microbatch, 1 TFLOP/s, 1 GB/s, no latency:
    # forward a 10 ms, a->b 10 MB per replica pair 10 ms, forward b 10 ms,
    # backward b 20 ms, then b's ring all-reduce of 100 MB over 2 devices
    # (2 (k-1)/k x 100 MB / 1 GB/s = 100 ms) outlasts what is left of the
    # step (gradients back 10 ms, backward a 20 ms): 10+10+10+20+100 ms
    g = Graph("two", [Op("a", flops=2e10, output_bytes=2e7),
                      Op("b", flops=2e10, param_bytes=1e8)], [Edge("a", "b", 2e7)])
    plan = Plan({"a": ["d0", "d1"], "b": ["d2", "d3"]}, 1, "1f1b")
    sim, ana = _both(g, _four_devices(), plan, op_overhead=0.0, bucket_bytes=1e9)
    assert sim == pytest.approx(0.150, rel=1e-9)
    assert ana == pytest.approx(0.150, rel=1e-9)


def test_allreduces_sharing_devices_run_one_after_another():
    # b's group {d0, d1} lies inside a's {d0..d3}: forward a 10 ms, forward
    # b 10 ms, backward b 20 ms (t = 40 ms), b's all-reduce 50 MB / 1 GB/s
    # = 50 ms; backward a 20 ms is done at 60 ms, but a's all-reduce
    # (2 x 3/4 x 20 MB / 1 GB/s = 30 ms) waits for d0 and d1 until 90 ms:
    # 120 ms, not the 95 ms of pricing each group alone
    g = Graph("nested", [Op("a", flops=4e10, param_bytes=2e7),
                         Op("b", flops=2e10, param_bytes=5e7)], [Edge("a", "b", 0.0)])
    plan = Plan({"a": ["d0", "d1", "d2", "d3"], "b": ["d0", "d1"]}, 1, "1f1b")
    sim, ana = _both(g, _four_devices(), plan, op_overhead=0.0, bucket_bytes=1e9)
    assert sim == pytest.approx(0.120, rel=1e-9)
    assert ana == pytest.approx(0.120, rel=1e-9)


def test_agreement_script_on_one_case():
    """scripts/cost_agreement.py (the figures in docs/BENCHMARKS.md) on one
    case: every neighbourhood gets a rank correlation and a move ratio."""
    import importlib.util
    from pathlib import Path
    pytest.importorskip("torch_geometric")
    from gnn.checkpoint import default_checkpoint
    if not default_checkpoint().with_suffix(".pt").exists():
        pytest.skip("no shipped checkpoint")
    path = Path(__file__).resolve().parents[1] / "scripts" / "cost_agreement.py"
    spec = importlib.util.spec_from_file_location("cost_agreement", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    result = module.measure(["inception.op"], ["hetero-lab"])
    rows = result["cases"]["inception.op@hetero-lab"]
    assert rows and result["summary"]["neighbourhoods"] == len(rows)
    for row in rows:
        assert -1 <= row["tau"] <= 1 and row["move"] > 0 and row["plans"] >= 4

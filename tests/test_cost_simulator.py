"""Hand-computed answers for the event simulator (and the analytical model
where its closed form is exact). Devices run at efficiency 1.0 and ops have
no launch overhead, so every number below is arithmetic on the inputs."""

import json
import math

import numpy as np
import pytest

from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import (Analytical, Problem, Simulator, get_cost_model, simulate)
from placer.cost.collectives import allreduce, hierarchical_time, ring_time
from placer.errors import PlanError, StrategyError

RATE = 1e12


def cluster(n=2, bw=1e9, lat=0.0, memory=1e12, sites=None, **links):
    sites = sites or ["s"] * n
    devices = [Device(f"d{i}", RATE, memory, site=sites[i], efficiency=1.0) for i in range(n)]
    return Cluster.from_rules("test", devices, default=(bw, lat), **links)


def problem(graph, clus, **options):
    options.setdefault("op_overhead", 0.0)
    return Problem(graph, clus, **options)


def sim(graph, clus, plan, **options):
    return Simulator().estimate(problem(graph, clus, **options), plan)


def two_ops(training):
    return Graph("two", [Op("a", flops=1e9), Op("b", flops=2e9)], [Edge("a", "b", 1e6)],
                 training=training)


def test_two_ops_one_transfer_inference():
    # a: 1e9/1e12 = 1 ms; 1e6 B at 1e9 B/s = 1 ms + 0.5 ms latency; b: 2 ms
    r = sim(two_ops(False), cluster(lat=5e-4), Plan({"a": ["d0"], "b": ["d1"]}))
    assert r.step_time == pytest.approx(4.5e-3)
    assert r.bytes_per_link == {"d0->d1": pytest.approx(1e6)}
    assert r.compute["d0"] == pytest.approx(1e-3)
    assert r.compute["d1"] == pytest.approx(2e-3)
    assert r.comm["d0"] == pytest.approx(1e-3)          # sending, latency not held
    assert r.busy["d0"] == pytest.approx(2e-3)
    assert r.idle["d1"] == pytest.approx(4.5e-3 - 3e-3)
    assert r.feasible


def test_two_ops_one_transfer_training():
    # forward 4.5 ms; backward: b 4 ms, gradient 1 ms + 0.5 ms, a 2 ms
    clus = cluster(lat=5e-4)
    plan = Plan({"a": ["d0"], "b": ["d1"]})
    r = sim(two_ops(True), clus, plan)
    assert r.step_time == pytest.approx(12e-3)
    assert r.bytes_per_link == {"d0->d1": pytest.approx(1e6), "d1->d0": pytest.approx(1e6)}
    a = Analytical().estimate(problem(two_ops(True), clus), plan)
    assert a.step_time == pytest.approx(12e-3)


def test_no_gradient_goes_back_for_a_value_that_requires_none():
    # a's output is integer (indices): forward 4.5 ms as above; b's backward
    # (4 ms) sends nothing back, and a's (2 ms) runs right after its forward
    g = Graph("two", [Op("a", flops=1e9, extra={"dtype": "int64"}),
                      Op("b", flops=2e9, param_bytes=4.0, extra={"dtype": "float32"})],
              [Edge("a", "b", 1e6)], training=True)
    clus = cluster(lat=5e-4)
    r = sim(g, clus, Plan({"a": ["d0"], "b": ["d1"]}))
    assert r.step_time == pytest.approx(8.5e-3)
    assert r.bytes_per_link == {"d0->d1": pytest.approx(1e6)}
    assert [e.name for e in r.events() if e.category == "transfer"] == ["activation a mb0"]
    # a float input without parameters upstream requires none either; a
    # float op reading b's output does, and so do ops of graphs without dtypes
    from placer.cost.problem import output_gradients
    h = Graph("h", [Op("x", extra={"dtype": "float32"}),
                    Op("w", param_bytes=4.0, extra={"dtype": "float32"}),
                    Op("i", extra={"dtype": ["float32", "int64"]}), Op("n")],
              [Edge("x", "w", 1.0), Edge("w", "i", 1.0), Edge("i", "n", 1.0)], training=True)
    p = problem(h, clus)
    assert dict(zip(p.ids, p.output_grad.tolist())) == {"x": False, "w": True, "i": True,
                                                         "n": True}
    assert output_gradients([], np.zeros(0, np.int64), np.zeros(0, np.int64)).size == 0


def test_a_link_burst_passes_free_then_refills_at_the_link_rate():
    # 1e6 B with a 4e5 B bucket: 0.6 ms on the link instead of 1 ms
    clus = cluster(lat=5e-4)
    r = sim(two_ops(False), clus, Plan({"a": ["d0"], "b": ["d1"]}), link_burst=4e5)
    assert r.step_time == pytest.approx(1e-3 + 0.6e-3 + 0.5e-3 + 2e-3)
    # training: the gradient goes the other way, through a full bucket of its own
    r = sim(two_ops(True), clus, Plan({"a": ["d0"], "b": ["d1"]}), link_burst=4e5)
    assert r.step_time == pytest.approx(12e-3 - 2 * 0.4e-3)
    # two tensors back to back on one link: a's leaves at 1 ms (0.6 ms), b's
    # (ready at 1.1 ms) waits for the link and finds the bucket empty (1 ms):
    # c starts at 2.6 + 0.5 ms instead of 3.0 + 0.5 ms
    g = Graph("two-in", [Op("a", flops=1e9), Op("b", flops=1e8), Op("c", flops=1e9)],
              [Edge("a", "c", 1e6), Edge("b", "c", 1e6)], training=False)
    plan = Plan({"a": ["d0"], "b": ["d0"], "c": ["d1"]})
    assert sim(g, clus, plan).step_time == pytest.approx(4.5e-3)
    assert sim(g, clus, plan, link_burst=4e5).step_time == pytest.approx(4.1e-3)
    with pytest.raises(StrategyError, match="link_burst"):
        problem(two_ops(False), clus, link_burst=-1.0)


def test_same_device_costs_no_transfer():
    r = sim(two_ops(False), cluster(), Plan({"a": ["d0"], "b": ["d0"]}))
    assert r.step_time == pytest.approx(3e-3)
    assert r.bytes_per_link == {}


def chain(S, flops=8e9, training=False, nbytes=0.0):
    ops = [Op(f"o{i}", flops=flops) for i in range(S)]
    edges = [Edge(f"o{i}", f"o{i + 1}", nbytes) for i in range(S - 1)]
    return Graph("chain", ops, edges, training=training)


@pytest.mark.parametrize("S,m", [(4, 8), (3, 1), (2, 5)])
def test_gpipe_forward_pipeline(S, m):
    # each stage: 8e9 FLOP / m per microbatch at 1e12 FLOP/s
    t = 8e9 / m / RATE
    plan = Plan({f"o{i}": [f"d{i}"] for i in range(S)}, microbatches=m, schedule="gpipe")
    g, c = chain(S), cluster(S)
    assert sim(g, c, plan).step_time == pytest.approx((m + S - 1) * t)
    assert Analytical().estimate(problem(g, c), plan).step_time == pytest.approx((m + S - 1) * t)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_training_pipeline(schedule):
    # forward t, backward 2t per microbatch and stage: (m + S - 1) * 3t
    S, m = 4, 8
    t = 8e9 / m / RATE
    plan = Plan({f"o{i}": [f"d{i}"] for i in range(S)}, microbatches=m, schedule=schedule)
    r = sim(chain(S, training=True), cluster(S), plan)
    assert r.step_time == pytest.approx((m + S - 1) * 3 * t)


def test_stashed_activations_gpipe_vs_1f1b():
    # each op outputs 8 MB for the batch (1 MB per microbatch); the first of
    # 4 stages keeps 8 microbatches under GPipe and 4 under 1F1B
    S, m = 4, 8
    ops = [Op(f"o{i}", flops=1e9, output_bytes=8e6) for i in range(S)]
    edges = [Edge(f"o{i}", f"o{i + 1}", 8e6) for i in range(S - 1)]
    g = Graph("c", ops, edges)
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        plan = Plan({f"o{i}": [f"d{i}"] for i in range(S)}, microbatches=m, schedule=schedule)
        peaks[schedule] = sim(g, cluster(S), plan).peak_memory
    # d0: kept activations + workspace (its input 0 + output 1 MB per microbatch)
    assert peaks["gpipe"]["d0"] == pytest.approx(8 * 1e6 + 1e6)
    assert peaks["1f1b"]["d0"] == pytest.approx(4 * 1e6 + 1e6)
    # d3: own output + received input, kept for 1 microbatch under 1F1B;
    # workspace = input + output of one microbatch
    assert peaks["1f1b"]["d3"] == pytest.approx(1 * 2e6 + 2e6)


def test_ring_allreduce_formula():
    P, k, bw, lat = 4e9, 4, 1e9, 1e-3
    c = cluster(k, bw=bw, lat=lat)
    p = problem(Graph("g", [Op("w")]), c)
    expected = 2 * (k - 1) / k * P / bw + 2 * (k - 1) * lat
    assert ring_time(list(range(k)), P, p.bandwidth, p.latency, p.nic_bandwidth) == \
        pytest.approx(expected)
    seconds, links, algo = allreduce(range(k), P, p.bandwidth, p.latency, p.nic_bandwidth,
                                     p.site)
    assert (seconds, algo) == (pytest.approx(expected), "ring")
    assert len(links) == k and links[0][2] == pytest.approx(2 * (k - 1) / k * P)


def test_data_parallel_allreduce_in_simulation():
    # one op without compute, replicated on 4 devices: the step is its all-reduce
    P, k, bw, lat = 4e9, 4, 1e9, 1e-3
    g = Graph("g", [Op("w", param_bytes=P)])
    r = sim(g, cluster(k, bw=bw, lat=lat), Plan({"w": [f"d{i}" for i in range(k)]}),
            bucket_bytes=1e12)
    assert r.step_time == pytest.approx(2 * (k - 1) / k * P / bw + 2 * (k - 1) * lat)
    assert r.bytes_per_link["d0->d1"] == pytest.approx(2 * (k - 1) / k * P)
    assert r.extra["allreduces"][0]["algorithm"] == "ring"
    a = Analytical().estimate(problem(g, cluster(k, bw=bw, lat=lat), bucket_bytes=1e12),
                              Plan({"w": [f"d{i}" for i in range(k)]}))
    assert a.step_time == pytest.approx(r.step_time)


def test_allreduce_in_buckets():
    # 3 ops of 1 GB parameters each, buckets of 1 GB: three all-reduces, one
    # after the other on the same interfaces, each paying the latency
    k, bw, lat = 2, 1e9, 1e-2
    g = Graph("g", [Op(f"w{i}", param_bytes=1e9) for i in range(3)],
              [Edge("w0", "w1", 0.0), Edge("w1", "w2", 0.0)])
    plan = Plan({f"w{i}": ["d0", "d1"] for i in range(3)})
    r = sim(g, cluster(k, bw=bw, lat=lat), plan, bucket_bytes=1e9)
    one = 2 * (k - 1) / k * 1e9 / bw + 2 * (k - 1) * lat
    assert r.step_time == pytest.approx(3 * one)
    assert len(r.extra["allreduces"]) == 3


def test_hierarchical_allreduce_across_sites():
    # 2 sites x 2 devices; intra 1e10 B/s 10 us, inter 1e9 B/s 10 ms
    P = 4e9
    c = Cluster.from_rules(
        "t", [Device(f"d{i}", RATE, 1e12, site=s, efficiency=1.0)
              for i, s in enumerate("aabb")],
        default=(1e10, 1e-5), sites=[("a", "b", 1e9, 1e-2)])
    p = problem(Graph("g", [Op("w")]), c)
    intra = 1 * (1e-5 + P / 2 / 1e10)               # reduce-scatter, then all-gather
    inter = 2 * 1 * (1e-2 + P / 2 / 2 / 1e9)        # ring of 2 sites on P/2
    seconds, links, algo = allreduce([0, 1, 2, 3], P, p.bandwidth, p.latency,
                                     p.nic_bandwidth, p.site)
    assert algo == "hierarchical"
    assert seconds == pytest.approx(2 * intra + inter)
    ring = 2 * 3 * (1e-2 + P / 4 / 1e9)
    assert ring_time([0, 1, 2, 3], P, p.bandwidth, p.latency, p.nic_bandwidth) == \
        pytest.approx(ring)
    t, _ = hierarchical_time([[0, 1], [2, 3]], P, p.bandwidth, p.latency, p.nic_bandwidth)
    assert t == pytest.approx(2 * intra + inter)


def test_link_shared_by_two_transfers_takes_twice_as_long():
    # two producers on d0 without compute send 1 GB each to one consumer on d1
    B, bw = 1e9, 1e9
    one = Graph("one", [Op("a1"), Op("b")], [Edge("a1", "b", B)], training=False)
    two = Graph("two", [Op("a1"), Op("a2"), Op("b")],
                [Edge("a1", "b", B), Edge("a2", "b", B)], training=False)
    c = cluster(2, bw=bw)
    r1 = sim(one, c, Plan({"a1": ["d0"], "b": ["d1"]}))
    r2 = sim(two, c, Plan({"a1": ["d0"], "a2": ["d0"], "b": ["d1"]}))
    assert r1.step_time == pytest.approx(B / bw)
    assert r2.step_time == pytest.approx(2 * B / bw)
    assert r2.bytes_per_link["d0->d1"] == pytest.approx(2 * B)
    assert r2.bottleneck.startswith("link d0->d1")


def test_fan_out_shares_the_network_interface():
    # one output to two devices: two transfers on different links, one NIC
    B = 1e9
    g = Graph("fan", [Op("a"), Op("b"), Op("c")], [Edge("a", "b", B), Edge("a", "c", B)],
              training=False)
    plan = Plan({"a": ["d0"], "b": ["d1"], "c": ["d2"]})
    assert sim(g, cluster(3), plan).step_time == pytest.approx(2 * B / 1e9)
    assert sim(g, cluster(3), plan, nic="none").step_time == pytest.approx(B / 1e9)


def test_output_sent_once_per_device():
    B = 1e9
    g = Graph("fan", [Op("a"), Op("b"), Op("c")], [Edge("a", "b", B), Edge("a", "c", B)],
              training=False)
    r = sim(g, cluster(2), Plan({"a": ["d0"], "b": ["d1"], "c": ["d1"]}))
    assert r.step_time == pytest.approx(B / 1e9)
    assert r.bytes_per_link == {"d0->d1": pytest.approx(B)}


def test_memory_infeasible_plan():
    # 3e8 parameter bytes, training with Adam: params + grads + 2 states = 1.2e9 > 1e9
    g = Graph("big", [Op("w", flops=1e9, param_bytes=3e8), Op("x", flops=1e9)],
              [Edge("w", "x", 0.0)])
    c = cluster(2, memory=1e9)
    plan = Plan({"w": ["d0"], "x": ["d1"]})
    r = sim(g, c, plan)
    assert not r.feasible
    assert r.memory_excess == {"d0": pytest.approx(2e8)}
    assert r.peak_memory["d0"] == pytest.approx(1.2e9)
    assert r.objective > 1e9 > r.step_time
    assert "d0" in r.summary() and "INFEASIBLE" in r.summary()
    a = Analytical().estimate(problem(g, c), plan)
    assert not a.feasible and a.memory_excess == {"d0": pytest.approx(2e8)}
    # inference keeps only the parameters: fits
    inf = Graph("big", [Op("w", flops=1e9, param_bytes=3e8)], training=False)
    assert sim(inf, c, Plan({"w": ["d0"]})).feasible


def test_recompute_trades_time_for_memory():
    S, m = 2, 4
    ops = [Op(f"o{i}", flops=4e9, output_bytes=4e8) for i in range(S)]
    g = Graph("c", ops, [Edge("o0", "o1", 4e8)])
    plan = Plan({"o0": ["d0"], "o1": ["d1"]}, microbatches=m, schedule="gpipe")
    plain = sim(g, cluster(S, bw=1e12), plan)
    again = sim(g, cluster(S, bw=1e12), plan, recompute=True)
    assert again.step_time > plain.step_time
    assert again.peak_memory["d0"] < plain.peak_memory["d0"]


def test_chrome_trace_and_gantt(tmp_path):
    S, m = 3, 4
    plan = Plan({f"o{i}": [f"d{i}"] for i in range(S)}, microbatches=m, schedule="1f1b")
    r = sim(chain(S, training=True, nbytes=1e6), cluster(S), plan)
    path = tmp_path / "trace.json"
    r.to_chrome_trace(path)
    doc = json.loads(path.read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"device d0", "device d2", "link d0->d1", "link d1->d0"} <= names
    bars = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sum(e["cat"] == "forward" for e in bars) == S * m
    assert sum(e["cat"] == "transfer" for e in bars) == 2 * (S - 1) * m
    assert max(e["ts"] + e["dur"] for e in bars) == pytest.approx(r.step_time * 1e6)
    png = tmp_path / "gantt.png"
    r.plot_gantt(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulator_report_pickles_with_its_timeline(tmp_path):
    import pickle
    S = 2
    plan = Plan({f"o{i}": [f"d{i}"] for i in range(S)}, microbatches=2)
    r = sim(chain(S, training=True, nbytes=1e6), cluster(S), plan)
    back = pickle.loads(pickle.dumps(r))
    assert back.to_dict() == r.to_dict()
    assert len(back.events()) == len(r.events()) > 0


def test_simulate_validates_the_plan():
    g = two_ops(True)
    with pytest.raises(PlanError):
        simulate(g, cluster(), Plan({"a": ["d0"]}))
    with pytest.raises(PlanError):
        simulate(g, cluster(), Plan({"a": ["d0"], "b": ["nope"]}))
    r = simulate(g, cluster(), Plan({"a": ["d0"], "b": ["d1"]}), op_overhead=0.0)
    assert r.model == "simulator" and r.step_time > 0


def test_registry_and_options():
    assert isinstance(get_cost_model("simulator"), Simulator)
    assert isinstance(get_cost_model("analytical"), Analytical)
    with pytest.raises(StrategyError):
        get_cost_model("nope")
    with pytest.raises(StrategyError):
        Problem(two_ops(True), cluster(), objective="nope")


def test_op_overhead_makes_zero_flop_ops_cost():
    g = Graph("z", [Op("a"), Op("b")], [Edge("a", "b", 0.0)], training=False)
    r = Simulator().estimate(Problem(g, cluster(), op_overhead=1e-5),
                             Plan({"a": ["d0"], "b": ["d0"]}))
    assert r.step_time == pytest.approx(2e-5)


def test_data_parallel_stage_splits_the_microbatch():
    # o1 on two devices: each replica does half of the work; the 1 GB tensor
    # is split, d0 keeps its half and sends the other half to d1
    g = Graph("dp", [Op("o0", flops=2e9), Op("o1", flops=2e9)], [Edge("o0", "o1", 1e9)],
              training=False)
    r = sim(g, cluster(2), Plan({"o0": ["d0"], "o1": ["d0", "d1"]}))
    # d0: o0 2 ms then o1 half 1 ms; d1 waits for 0.5 GB at 1 GB/s: 2 ms + 0.5 s + 1 ms
    assert r.step_time == pytest.approx(2e-3 + 0.5 + 1e-3)
    assert r.bytes_per_link == {"d0->d1": pytest.approx(5e8)}


def test_deterministic_and_step_times_match():
    S, m = 4, 4
    g = chain(S, training=True, nbytes=1e7)
    c = cluster(S, lat=1e-4)
    p = problem(g, c)
    plan = Plan({f"o{i}": [f"d{i % 2}"] for i in range(S)}, microbatches=m)
    a = Simulator().estimate(p, plan)
    b = Simulator().estimate(p, plan)
    assert a.to_dict() == b.to_dict()
    rows = np.array([[i % 2 for i in range(S)], [0] * S])
    fast = Simulator().step_times(p, rows, microbatches=m, schedule="1f1b")
    assert fast[0] == pytest.approx(a.step_time)
    ana = Analytical().step_times(p, rows, microbatches=m)
    assert ana.shape == (2,) and np.all(np.isfinite(ana))
    assert math.isfinite(Analytical().estimate_many(p, [plan, plan])[1].step_time)


def test_compiled_event_loop_matches_plain_python():
    """The numba-compiled loop gives bit-identical results to the same code
    run as plain Python (NUMBA_DISABLE_JIT), over random plans of both
    schedules, data-parallel groups (all-reduces) and shared links."""
    import os
    import subprocess
    import sys
    script = (
        "import json, sys\n"
        "from placer.bench.cost import bench_graph, bench_cluster, random_plans\n"
        "from placer.cost import Problem, Simulator\n"
        "out = []\n"
        "for n, d, mb in ((40, 4, 1), (80, 6, 4)):\n"
        "    g, c = bench_graph(n, 1), bench_cluster(d)\n"
        "    p = Problem(g, c, resume_overhead=2e-5 if mb > 1 else 0.0)\n"
        "    for plan in random_plans(g, c, 12, seed=mb, microbatches=mb):\n"
        "        r = Simulator().estimate(p, plan)\n"
        "        out.append([r.step_time, sorted(r.busy.items())])\n"
        "json.dump(out, sys.stdout)\n")
    results = []
    for disable in ("0", "1"):
        env = dict(os.environ, NUMBA_DISABLE_JIT=disable)
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=600, check=True)
        results.append(json.loads(proc.stdout))
    compiled, plain = results
    assert len(compiled) == 24
    assert compiled == plain
    assert len({round(x[0], 12) for x in compiled}) > 5       # the plans differ


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_task_overhead_is_charged_per_run_microbatch_and_phase(schedule):
    # four ops in two runs (o0 o1 on d0, o2 o3 on d1), one microbatch: the
    # critical path crosses both runs forward and backward, so it gains
    # four tasks; both models agree
    g, c = chain(4, training=True), cluster(2)
    plan = Plan({"o0": ["d0"], "o1": ["d0"], "o2": ["d1"], "o3": ["d1"]}, schedule=schedule)
    task = 1e-3
    for model in (Simulator(), Analytical()):
        base = model.estimate(problem(g, c), plan).step_time
        more = model.estimate(problem(g, c, task_overhead=task), plan).step_time
        assert more - base == pytest.approx(4 * task)
    # one run: one task per phase
    one = Plan({f"o{i}": ["d0"] for i in range(4)})
    assert (sim(g, c, one, task_overhead=task).step_time - sim(g, c, one).step_time
            == pytest.approx(2 * task))


def test_collective_efficiency_scales_the_allreduce():
    P, k, bw, lat = 4e9, 4, 1e9, 1e-3
    g = Graph("g", [Op("w", param_bytes=P)])
    plan = Plan({"w": [f"d{i}" for i in range(k)]})
    full = 2 * (k - 1) / k * P / bw + 2 * (k - 1) * lat
    for model in (Simulator(), Analytical()):
        r = model.estimate(problem(g, cluster(k, bw=bw, lat=lat), bucket_bytes=1e12,
                                   collective_efficiency=0.25), plan)
        assert r.step_time == pytest.approx(full / 0.25)
    with pytest.raises(StrategyError, match="collective_efficiency"):
        problem(g, cluster(k), collective_efficiency=0.0)


def test_the_loss_runs_whole_on_the_first_replica():
    """An op's ``loss_flops`` run, forward and backward, on its group's first
    device (as the runtime's sink computes the loss), not split over the
    replicas; both models, against hand-computed times."""
    F, Bw, Lf, Lb = 4e9, 8e9, 1e9, 2e9
    loss = Graph("loss", [Op("out", flops=F, bwd_flops=Bw, extra={"loss_flops": [Lf, Lb]})])
    plain = Graph("plain", [Op("out", flops=F, bwd_flops=Bw)])
    split = Plan({"out": ["d0", "d1"]})
    # replica 0: (F - Lf) / 2 + Lf + Lb forward, (Bw - Lb) / 2 backward
    first = ((F - Lf) / 2 + Lf + Lb + (Bw - Lb) / 2) / RATE
    for model in (Simulator(), Analytical()):
        with_loss = model.estimate(problem(loss, cluster(2)), split)
        without = model.estimate(problem(plain, cluster(2)), split)
        assert without.step_time == pytest.approx((F + Bw) / 2 / RATE)
        assert with_loss.step_time == pytest.approx(first), model.name
        # on one device the loss only moves between the phases
        one = model.estimate(problem(loss, cluster(2)), Plan({"out": ["d0"]}))
        assert one.step_time == pytest.approx((F + Bw) / RATE)
    # the simulator's tasks say where it ran: at the start of the first
    # replica's backward
    events = Simulator().estimate(problem(loss, cluster(2)), split).events()
    fwd = {e.lane: e.duration for e in events if e.category == "forward"}
    bwd = {e.lane: e.duration for e in events if e.category == "backward"}
    assert fwd["d0"] == fwd["d1"] == pytest.approx((F - Lf) / 2 / RATE)
    assert bwd["d0"] == pytest.approx((Lf + Lb + (Bw - Lb) / 2) / RATE)
    assert bwd["d1"] == pytest.approx((Bw - Lb) / 2 / RATE)


def test_the_loss_fixed_part_is_paid_by_every_microbatch():
    """``loss_fixed`` (part of ``loss_flops``) does not shrink with a
    microbatch's rows: with m microbatches on one device the step pays it
    m times, once more per extra microbatch than the rows-scaled loss."""
    F, Bw, Lf, Lb, Xf, Xb = 4e9, 8e9, 1e9, 2e9, 0.5e9, 1e9
    fixed = Graph("fixed", [Op("out", flops=F, bwd_flops=Bw,
                               extra={"loss_flops": [Lf, Lb], "loss_fixed": [Xf, Xb]})])
    scaled = Graph("scaled", [Op("out", flops=F, bwd_flops=Bw, extra={"loss_flops": [Lf, Lb]})])
    for model in (Simulator(), Analytical()):
        for m in (1, 2, 4):
            plan = Plan({"out": ["d0"]}, microbatches=m)
            base = model.estimate(problem(scaled, cluster(1)), plan).step_time
            assert base == pytest.approx((F + Bw) / RATE), model.name
            more = model.estimate(problem(fixed, cluster(1)), plan).step_time
            assert more == pytest.approx((F + Bw + (Xf + Xb) * (m - 1)) / RATE), (model.name, m)
    # at most the loss itself; malformed entries name the node and the key
    over = Graph("over", [Op("out", flops=F, bwd_flops=Bw,
                             extra={"loss_flops": [Lf, Lb], "loss_fixed": [9e9, 9e9]})])
    assert problem(over, cluster(1)).loss_fixed[0].tolist() == [Lf, Lb]
    from placer.errors import GraphError
    bad = Graph("bad", [Op("out", flops=F, extra={"loss_flops": [Lf, 0], "loss_fixed": "x"})])
    with pytest.raises(GraphError, match="node 'out': loss_fixed"):
        problem(bad, cluster(1))


def test_malformed_loss_flops_name_the_node():
    from placer.errors import GraphError
    g = Graph("bad", [Op("out", flops=1e9, extra={"loss_flops": "lots"})])
    with pytest.raises(GraphError, match="node 'out': loss_flops"):
        problem(g, cluster(1))


def test_the_loss_waits_for_every_replica_of_the_output():
    """The loss on the first replica reads the other replicas' rows: a slow
    second replica (half the speed) delays it, and the gradient goes back."""
    F, Bw, Lf, Lb = 4e9, 8e9, 1e9, 2e9
    g = Graph("loss", [Op("out", flops=F, bwd_flops=Bw, output_bytes=1e6,
                          extra={"loss_flops": [Lf, Lb]})])
    devices = [Device("d0", RATE, 1e12, efficiency=1.0), Device("d1", RATE, 1e12, efficiency=0.5)]
    c = Cluster.from_rules("slow", devices, default=(1e9, 0.0))
    r = Simulator().estimate(problem(g, c), Plan({"out": ["d0", "d1"]}))
    # d1's rows (0.5 MB at 1 GB/s) reach d0 after d1's forward; d0 runs the
    # loss and sends the gradient of d1's rows back at once; d1's backward
    # waits for it (d0's own backward runs meanwhile)
    f1 = (F - Lf) / 2 / (RATE / 2)
    x = 0.5e6 / 1e9
    grad_back = f1 + x + (Lf + Lb) / RATE + x
    b1 = (Bw - Lb) / 2 / (RATE / 2)
    assert r.step_time == pytest.approx(grad_back + b1, rel=1e-6)


def test_the_gradient_of_a_replicas_rows_leaves_after_the_loss_also_in_a_piece():
    """At the runtime's granularity (a piece per device) the first replica
    runs the loss, sends the other replica the gradient of its rows at once
    (the runtime's sink task) and only then its own piece's backward: the
    other replica's backward does not wait for that whole piece."""
    Fa, Ba, F, Bw, Lf, Lb = 2e9, 4e9, 4e9, 8e9, 1e9, 2e9
    g = Graph("loss", [Op("a", flops=Fa, bwd_flops=Ba, output_bytes=1e6),
                       Op("out", flops=F, bwd_flops=Bw, output_bytes=1e6,
                          extra={"loss_flops": [Lf, Lb]})], [Edge("a", "out", 1e6)])
    devices = [Device("d0", RATE, 1e12, efficiency=1.0), Device("d1", RATE, 1e12, efficiency=0.5)]
    c = Cluster.from_rules("slow", devices, default=(1e9, 0.0))
    plan = Plan({"a": ["d0", "d1"], "out": ["d0", "d1"]})
    f1 = (Fa / 2 + (F - Lf) / 2) / (RATE / 2)
    x = 0.5e6 / 1e9
    b1 = ((Bw - Lb) / 2 + Ba / 2) / (RATE / 2)
    expected = f1 + x + (Lf + Lb) / RATE + x + b1
    for granularity in ("op", "piece"):
        r = sim(g, c, plan, granularity=granularity)
        assert r.step_time == pytest.approx(expected, rel=1e-6), granularity


def test_message_overhead_costs_both_ends():
    """Each message costs its sender and its receiver ``message_overhead``
    (per microbatch and phase): two ops on two devices, one tensor."""
    s = 1e-3
    for training in (False, True):
        g = two_ops(training)
        plan = Plan({"a": ["d0"], "b": ["d1"]})
        for model in (Simulator(), Analytical()):
            base = model.estimate(problem(g, cluster(2)), plan).step_time
            more = model.estimate(problem(g, cluster(2), message_overhead=s), plan).step_time
            # on the path: the sender's and the receiver's share, per phase
            phases = 2 if training else 1
            assert more - base == pytest.approx(2 * s * phases, rel=1e-6), (model.name, training)
    with pytest.raises(StrategyError, match="message_overhead"):
        problem(two_ops(False), cluster(2), message_overhead=-1.0)


def test_allreduce_overlap_off_starts_after_each_members_last_task():
    # x on d0, then y data-parallel on d0 and d1: y's gradients are ready
    # before d0 runs x's backward. Overlapping (DDP), the all-reduce runs
    # beside that backward; not overlapping (placer's runtime), after it.
    P, bw = 1.5e6, 1e9
    g = Graph("g", [Op("x", flops=1e9), Op("y", flops=1e9, param_bytes=P)],
              [Edge("x", "y", 1e3)])
    plan = Plan({"x": ["d0"], "y": ["d0", "d1"]})
    reports = {flag: sim(g, cluster(2, bw=bw), plan, bucket_bytes=1e12,
                         allreduce_overlap=flag) for flag in (True, False)}
    seconds = P / bw                      # a ring of two moves P each way
    for flag, r in reports.items():
        events = r.events()
        ar = [e for e in events if e.category == "allreduce"]
        assert ar and all(e.duration == pytest.approx(seconds) for e in ar)
        last_end = {d: max(e.start + e.duration for e in events
                           if e.lane == d and e.category in ("forward", "backward"))
                    for d in ("d0", "d1")}
        if flag:
            assert min(e.start for e in ar) < last_end["d0"]
        else:
            assert min(e.start for e in ar) == pytest.approx(max(last_end.values()))
            assert r.step_time == pytest.approx(max(last_end.values()) + seconds)
    assert reports[False].step_time > reports[True].step_time
    assert Problem(g, cluster(2), allreduce_overlap=False).options["allreduce_overlap"] is False


def test_message_copy_rate_charges_the_payload_at_both_ends():
    """A message's bytes cost each end ``bytes / message_copy_rate`` of its
    own time, per microbatch: two ops on two devices, 1 MB crossing, with
    the fixed part and without."""
    rate = 1e9
    for training in (False, True):
        g = two_ops(training)
        for m in (1, 2):
            plan = Plan({"a": ["d0"], "b": ["d1"]}, microbatches=m)
            for model in (Simulator(), Analytical()):
                base = model.estimate(problem(g, cluster(2)), plan).step_time
                more = model.estimate(problem(g, cluster(2), message_copy_rate=rate,
                                              message_overhead=1e-4), plan).step_time
                phases = 2 if training else 1
                # the path holds both ends' costs of one microbatch's message
                # per phase (the other microbatch's overlap compute)
                per_end = 1e-4 + 1e6 / m / rate
                assert more - base >= 2 * per_end * phases * (1 - 1e-6), (model.name, m)
                if m == 1:
                    assert more - base == pytest.approx(2 * per_end * phases, rel=1e-6)
    with pytest.raises(StrategyError, match="message_copy_rate"):
        problem(two_ops(False), cluster(2), message_copy_rate=0.0)


def test_resume_overhead_delays_a_task_that_waited():
    """A device pays ``resume_overhead`` before a task that does not follow
    its previous one at once: its first task, and one that waited for a
    message. Two ops on two devices (a on d0 sends to b on d1) and the same
    two on one device (b follows a at once): hand sums."""
    r = 1e-3
    g = two_ops(False)
    lat, bw = 1e-4, 1e9
    clus = cluster(2, bw=bw, lat=lat)
    t_a, t_b, x = 1e9 / RATE, 2e9 / RATE, 1e6 / bw
    two = Plan({"a": ["d0"], "b": ["d1"]})
    base = sim(g, clus, two).step_time
    assert base == pytest.approx(t_a + x + lat + t_b)
    assert sim(g, clus, two, resume_overhead=r).step_time == pytest.approx(base + 2 * r)
    one = Plan({"a": ["d0"], "b": ["d0"]})
    assert sim(g, clus, one, resume_overhead=r).step_time == pytest.approx(t_a + t_b + r)
    with pytest.raises(StrategyError, match="resume_overhead"):
        problem(g, clus, resume_overhead=-1.0)

"""placer profile: measured per-op times and a calibrated cluster."""

from __future__ import annotations

import statistics

import pytest
import torch

import placer
from placer import zoo
from placer.runtime.profile import calibrated_graph, profile

from runtime_helpers import one_thread  # noqa: F401


def test_profile_writes_measurements_and_efficiency(tmp_path):
    model, inputs = zoo.build("gpt-125m", tiny=True, batch=4)
    cluster = placer.Cluster.from_rules("one", [placer.Device("cpu", 1e11, 1e10)],
                                        default=(1e9, 1e-4))
    graph, calibrated = profile(model, inputs, cluster=cluster, repeats=2)
    timed = [op for op in graph if "measured" in op.extra]
    assert len(timed) >= len(graph) - 1
    assert all(op.extra["measured"]["cpu"]["fwd"] >= 0 for op in timed)
    dev = calibrated.device("cpu")
    assert 0 < dev.efficiency <= 1 and dev.extra["op_overhead"] >= 0
    # the files round-trip and the calibrated graph predicts the measured sum
    graph.save(tmp_path / "g.json")
    calibrated.save(tmp_path / "c.yaml")
    again = placer.Graph.load(tmp_path / "g.json")
    cg = calibrated_graph(again, placer.Cluster.load(tmp_path / "c.yaml"))
    plan = placer.Plan({op: ["cpu"] for op in cg.ids})
    report = placer.simulate(cg, calibrated, plan, op_overhead=dev.extra["op_overhead"])
    assert report.step_time > 0
    # each op's fixed part (its intercept over the rows) is within its time,
    # and the calibrated graph states it in FLOPs within the op's
    for op in timed:
        m = op.extra["measured"]["cpu"]
        assert 0 <= m["fwd_fixed"] <= m["fwd"] and 0 <= m["bwd_fixed"] <= max(m["bwd"], 0)
        ff, fb = cg.op(op.id).extra["fixed_flops"]
        assert 0 <= ff <= cg.op(op.id).flops and 0 <= fb <= cg.op(op.id).bwd_flops
    assert any(cg.op(op.id).extra["fixed_flops"][0] > 0 for op in timed)
    # a plan of 4 microbatches pays them 4 times: slower than at one
    four = placer.Plan({op: ["cpu"] for op in cg.ids}, microbatches=4)
    assert placer.simulate(cg, calibrated, four, op_overhead=dev.extra["op_overhead"]) \
        .step_time > report.step_time
    assert cluster.device("cpu").efficiency is None  # input untouched
    assert torch.is_tensor(inputs[0])


def test_fit_link_recovers_latency_and_bandwidth():
    from placer.runtime.profile import fit_link
    points = {n: 2e-4 + n / 1e9 for n in (256, 16 << 10, 1 << 20, 4 << 20)}
    bw, lat = fit_link(points)
    assert abs(bw / 1e9 - 1) < 1e-6 and abs(lat / 2e-4 - 1) < 1e-6


def test_launch_overhead_fit_matches_the_cost_models_form():
    from placer.runtime.profile import _fit_launch
    # every phase: 30 us fixed + 100 us per full batch of 8 rows
    phases = [{r: 30e-6 + 100e-6 * r / 8 for r in (2, 4, 8)} for _ in range(10)]
    assert abs(_fit_launch(phases, 8) - 30e-6) < 1e-6


def test_calibrated_launch_predicts_from_its_own_measurements():
    import functools
    from placer.runtime.dist import launch
    build = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=4)
    model, inputs = build()
    graph = placer.trace(model, inputs)
    order = graph.topological_order()
    half = len(order) // 2
    plan = placer.Plan({op: ["a" if i < half else "b"] for i, op in enumerate(order)},
                       microbatches=2)
    for members in graph.colocation_groups().values():
        for op in members[1:]:
            plan.placement[op] = list(plan.placement[members[0]])
    result = launch(plan, build, steps=1, warmup=0, timeout=120, calibrate=True, threads=1)
    cal = result["calibration"]
    assert result["report"]["predicted"] > 0
    # the ranks ran the simulator's order on their first calibration round
    # (not the dispatch rule's), and the ops' fixed parts were measured
    assert result["schedule_source"] == "simulator"
    assert any(node.get("fixed_flops", [0, 0])[0] > 0 for node in cal["graph"]["nodes"])
    link = cal["links"]["a-b"]
    assert link["bandwidth"] > 0 and link["latency"] >= 0 and len(link["points"]) >= 2
    assert cal["op_overhead"] >= 0 and cal["allreduce"]
    cluster = placer.Cluster.from_dict(cal["cluster"])
    assert cluster.names == ["a", "b"]
    # every message pays the measured synchronisation delay on top of the
    # link's latency (negative: less than the blocking ping-pong read)
    assert link["sync_delay"] >= -link["latency"]
    assert cluster.link("a", "b")[1] == pytest.approx(
        max(0.0, link["latency"] + link["sync_delay"]))
    # the shares of a core alone and with both ranks busy, and those used
    assert 0 < cal["cpu_share"] <= 1 and 0 < cal["cpu_share_all"] <= 1
    assert set(cal["cpu_shares"]) == {"a", "b"}
    # each rank's measured timeline: a bar per task of its pieces
    lanes = {e[0] for e in result["events"]}
    assert lanes == {"a", "b"}
    assert cal["resume_overhead"] >= 0
    # messages cost a fixed part and (maybe) a per-byte part
    assert cal["message_overhead"] >= 0
    assert cal["message_copy_rate"] is None or cal["message_copy_rate"] > 0
    # the reference pipeline and the message plan ran on both ranks and
    # scaled the prediction by their measured steps over their predicted
    # ones, within the bounds
    from placer.runtime.dist import REFERENCE_FACTOR_BOUNDS
    assert set(cal["reference_compute"]) == {"a", "b"} and cal["reference_step"] > 0
    assert cal["reference_messages_step"] > 0 and cal["reference_messages_predicted"] > 0
    samples = cal["reference_samples"]
    assert set(samples["pipeline"]) == set(samples["messages"]) == set(samples["one"]) \
        == {"a", "b"}
    # the one-device plan ran beside too, on the first rank, and the compute
    # was fitted on it
    assert cal["reference_one_step"] == max(
        statistics.median(samples["one"][d]["step"]) for d in "ab")
    lo, hi = REFERENCE_FACTOR_BOUNDS
    # the fitted graph predicts the one-device plan's measured step, or
    # stops short of it at a bound of the factor
    from placer.runtime.calibration import calibrated_options, one_device_plan
    from placer.runtime.contention import predict_shared
    cg = placer.Graph.from_dict(cal["graph"])
    cc = placer.Cluster.from_dict(cal["cluster"])
    alone = predict_shared(cg, cc, one_device_plan(cg, ["a", "b"]),
                           **calibrated_options(cal)).step_time
    factor, one_step = cal["reference_compute_factor"], cal["reference_one_step"]
    assert lo <= factor <= hi
    if factor == pytest.approx(hi):
        assert alone <= one_step * (1 + 1e-6)
    elif factor == pytest.approx(lo):
        assert alone >= one_step * (1 - 1e-6)
    else:
        assert alone == pytest.approx(one_step, rel=1e-3)
    # the step: the slowest rank's median
    assert max(x for d in "ab" for x in samples["messages"][d]["step"]) >= \
        cal["reference_messages_step"]
    raw = (cal["reference_step"] + cal["reference_messages_step"]) / (
        cal["reference_predicted"] + cal["reference_messages_predicted"])
    assert cal["reference_factor_raw"] == pytest.approx(raw)
    lo, hi = REFERENCE_FACTOR_BOUNDS
    assert cal["reference_factor"] == pytest.approx(min(hi, max(lo, raw)))
    assert result["report"]["predicted"] == pytest.approx(
        cal["predicted_model"] * cal["reference_factor"])
    # how much the host's speed moved between the op timings and the steps
    from placer.runtime.dist import SPEED_DRIFT_BOUNDS
    assert SPEED_DRIFT_BOUNDS[0] <= cal["speed_drift"] <= SPEED_DRIFT_BOUNDS[1]
    # `placer launch --calibrate` says how the prediction was made
    from placer.runtime.dist import calibration_line
    line = calibration_line(cal)
    assert f"simulator {cal['predicted_model'] * 1e3:.2f} ms" in line
    assert f"reference factor {cal['reference_factor']:.2f}" in line
    if cal["reference_compute_factor"] != 1.0:
        assert f"op times x{cal['reference_compute_factor']:.2f}" in line
    assert f"{cal['speed_drift']:.2f}x as long" in line


def test_speed_drift_is_the_calibration_rate_over_the_steps_rate_within_bounds():
    from placer.runtime.dist import SPEED_DRIFT_BOUNDS, speed_drift
    # the work ran at 100/s in the calibration rounds, at 80/s before the
    # steps: the steps' ops take 1.25x the calibrated times
    assert speed_drift([90.0, 100.0, 110.0], [80.0, 70.0, 90.0]) == pytest.approx(1.25)
    assert speed_drift([100.0], [400.0]) == SPEED_DRIFT_BOUNDS[0]
    assert speed_drift([100.0], [10.0]) == SPEED_DRIFT_BOUNDS[1]
    # no samples (CUDA ranks time no probe), or only failed ones: no drift
    assert speed_drift([], [80.0]) == 1.0 and speed_drift([0.0], [0.0]) == 1.0


def test_reference_plan_is_a_contiguous_pipeline_keeping_colocated_ops_together():
    from placer.runtime.dist import reference_plan
    model, inputs = zoo.build("gpt-125m", tiny=True, batch=4)
    graph = placer.trace(model, inputs)
    plan = reference_plan(graph, ["a", "b", "c"], microbatches=2)
    assert set(plan.placement) == set(graph.ids)
    assert plan.microbatches == 2 and plan.devices_used() == {"a", "b", "c"}
    groups = graph.colocation_groups()
    colocated = {op for members in groups.values() for op in members[1:]}
    devices = [plan.placement[op][0] for op in graph.topological_order() if op not in colocated]
    # every device's ops form one run of the order, in device order
    runs = [d for i, d in enumerate(devices) if i == 0 or devices[i - 1] != d]
    assert runs == ["a", "b", "c"]
    for members in groups.values():
        assert len({tuple(plan.placement[op]) for op in members}) == 1


def test_profile_charges_the_loss_to_the_output_op():
    import time as _time
    from placer.runtime.run import default_loss

    def slow_loss(out):
        _time.sleep(0.02)   # a loss far slower than any op of the tiny model
        return default_loss(out)

    model, inputs = zoo.build("gpt-125m", tiny=True, batch=2)
    cluster = placer.Cluster.from_rules("one", [placer.Device("cpu", 1e11, 1e10)],
                                        default=(1e9, 1e-4))
    graph, calibrated_cluster = profile(model, inputs, cluster=cluster, repeats=1, warmup=0,
                                        loss_fn=slow_loss, share=1.0)
    last = graph.op(graph.topological_order()[-1])
    assert last.extra["measured"]["cpu"]["fwd"] >= 0.02
    assert all(op.extra["measured"]["cpu"]["fwd"] < 0.02 for op in graph
               if op is not last and "measured" in op.extra)
    # the loss's share is recorded beside, and the calibrated graph states
    # it as the op's loss_flops (the cost model runs it on one replica)
    assert last.extra["measured"]["cpu"]["loss_fwd"] >= 0.02
    cg = calibrated_graph(graph, calibrated_cluster, "cpu")
    lf, lb = cg.op(last.id).extra["loss_flops"]
    rate = calibrated_cluster.device("cpu").flops * calibrated_cluster.device("cpu").efficiency
    assert lf / rate >= 0.02 and lf <= cg.op(last.id).flops and 0 <= lb
    assert all("loss_flops" not in op.extra for op in cg if op.id != last.id)
    # a sleep does not shrink with the rows: it is the loss's fixed part
    assert 0.015 <= last.extra["measured"]["cpu"]["loss_fwd_fixed"] \
        <= last.extra["measured"]["cpu"]["loss_fwd"]
    xf, xb = cg.op(last.id).extra["loss_fixed"]
    assert 0.015 <= xf / rate and xf <= lf and 0 <= xb <= lb
    untimed, _ = profile(model, inputs, cluster=cluster, repeats=1, warmup=0, loss_fn=False,
                         share=1.0)
    assert untimed.op(last.id).extra["measured"]["cpu"]["fwd"] < 0.02


def test_loss_fixed_is_the_intercept_over_rows_within_bounds():
    from placer.runtime.profile import _loss_fixed
    line = {r: (0.002 + 0.001 * r, 0.004 + 0.0005 * r) for r in (8, 4, 2)}
    assert _loss_fixed(line, 8) == pytest.approx((0.002, 0.004))
    # a loss that grows faster than its rows has no fixed part
    assert _loss_fixed({8: (0.008, 0.0), 4: (0.002, 0.0)}, 8) == (0.0, 0.0)
    assert _loss_fixed({8: (0.01, 0.02)}, 8) == (0.0, 0.0)     # one row count: unknown


def test_resume_cost_is_what_a_chunk_loses_after_a_wait():
    import time as _time
    from placer.runtime.profile import resume_cost
    last = [0.0]

    def spin(seconds):
        end = _time.perf_counter() + seconds
        while _time.perf_counter() < end:
            pass

    def work():   # 0.5 ms, and 1 ms more when the last call ended over 1 ms ago
        if _time.perf_counter() - last[0] > 0.001:
            spin(0.001)
        spin(0.0005)
        last[0] = _time.perf_counter()

    assert resume_cost(work, idle=0.002) == pytest.approx(0.001, abs=4e-4)
    assert resume_cost(None) == 0.0

"""What the runtime pays for its pieces (placer.runtime.piece_costs), the
reference factor in parts (compute, messaging, the rest) and predictions
of a plan as the runtime runs it (placer.runtime.common.as_run)."""

from __future__ import annotations

import math

import pytest
import torch

import placer
from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.runtime.common import RUNTIME_OPTIONS, as_run
from placer.runtime.calibration import _compute_bars
from placer.runtime.contention import predict_shared
from placer.runtime.piece_costs import (PIECE_RUNS, fit_piece_costs, measure_pieces,
                                        piece_plans, scale_graph)


def _chain(n: int = 24, batch: int = 4) -> Graph:
    ops = [Op(f"o{i}", flops=1e7 * (1 + i % 3), bwd_flops=2e7, param_bytes=4.0,
              extra={"fixed_flops": [2e6, 4e6]}) for i in range(n)]
    edges = [Edge(f"o{i}", f"o{i + 1}", 4e3) for i in range(n - 1)]
    return Graph("chain", ops, edges, training=True, meta={"batch": batch})


DEVICE = Device("cpu", 1e11, 1e10, efficiency=0.1)


def _bars(graph, plan, **options) -> tuple[float, int]:
    pair = Cluster("pair", [Device(n, 1e11, 1e10, efficiency=0.1) for n in "ab"],
                   [[math.inf] * 2] * 2, [[0.0] * 2] * 2)
    bars = [e for e in placer.simulate(graph, pair, plan, **RUNTIME_OPTIONS, **options).events()
            if e.category in ("forward", "backward")]
    return sum(e.duration for e in bars), len(bars)


def test_piece_plans_are_one_piece_and_many():
    g = _chain()
    one, many = piece_plans(g)
    assert one.microbatches == 1 and one.devices_used() == {"a"}
    assert many.microbatches == 2 and many.devices_used() == {"a", "b"}
    order = g.topological_order()
    switches = sum(many.placement[x] != many.placement[y] for x, y in zip(order, order[1:]))
    assert switches == PIECE_RUNS - 1


def test_the_fit_finds_the_scale_and_the_cost_per_task_that_made_the_runs():
    g = _chain()
    # "measured": the ops at 0.7 of their predicted time, 150 us a task
    runs = []
    for plan in piece_plans(g):
        ops, tasks = _bars(scale_graph(g, 0.7), plan, op_overhead=7e-6)
        runs.append({"compute": ops + 150e-6 * tasks, "tasks": tasks})
    scale, task = fit_piece_costs(g, DEVICE, runs, {**RUNTIME_OPTIONS, "op_overhead": 1e-5},
                                  70e-6)
    assert scale == pytest.approx(0.7, rel=1e-6)
    assert task == pytest.approx(150e-6, rel=1e-6)
    # pieces that cost nothing extra: all of it is the ops' scale; no runs:
    # the op times and the default task cost stand
    free = [{"compute": _bars(g, p, op_overhead=1e-5)[0] * 0.9, "tasks": 1}
            for p in piece_plans(g)]
    scale, task = fit_piece_costs(g, DEVICE, free, {"op_overhead": 1e-5}, 70e-6)
    assert task >= 0 and scale == pytest.approx(0.9, rel=0.05)
    assert fit_piece_costs(g, DEVICE, [], {}, 70e-6) == (1.0, 70e-6)


def test_scale_graph_scales_every_op_time():
    g = _chain()
    plan = Plan({op: ["a"] for op in g.ids})
    base, _ = _bars(g, plan, op_overhead=0.0)
    half, _ = _bars(scale_graph(g, 0.5), plan, op_overhead=0.0)
    assert half == pytest.approx(base * 0.5, rel=1e-9)


def test_measure_pieces_times_the_model_as_the_runtime_runs_it():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(6)
                                  for m in (torch.nn.Linear(8, 8), torch.nn.ReLU())])
    inputs = (torch.randn(4, 8),)
    graph = placer.trace(model, inputs)
    runs = measure_pieces(model, inputs, graph, torch.device("cpu"), repeats=2, warmup=1)
    assert len(runs) == 2 and all(r["compute"] > 0 for r in runs)
    # the many-piece plan runs more tasks (each piece's forward and
    # backward per microbatch, and the loss)
    assert runs[1]["tasks"] > runs[0]["tasks"] >= 3


def _calibration(graph):
    devs = [Device(n, 1e11, 1e10, efficiency=0.1, extra={"cpu_share": 1.0}) for n in ("r0", "r1")]
    cluster = Cluster.from_rules("ranks", devs, default=(1e8, 2e-4))
    return {"graph": graph, "cluster": cluster}


def test_the_reference_factor_in_parts_matches_the_reference_and_is_stable():
    from placer.runtime.calibration import reference_factor, reference_plan
    g = _chain()
    cal = _calibration(g)
    ref = reference_plan(g, ["r0", "r1"], 2)
    options = {**RUNTIME_OPTIONS, "op_overhead": 1e-5, "task_overhead": 1e-4,
               "message_overhead": 5e-5}
    quiet = predict_shared(g, cal["cluster"], ref, **{**options, "message_overhead": 0.0})
    compute = dict(_compute_bars(quiet))
    # the ranks computed 1.2x the prediction; the step took 1.3x
    step = predict_shared(g, cal["cluster"], ref, **options).step_time
    cal.update(reference_compute={d: 1.2 * v for d, v in compute.items()},
               reference_step=1.3 * step, op_overhead=1e-5, task_overhead=1e-4)
    first = dict(options)
    factor = reference_factor(cal, ref, first)
    assert cal["reference_compute_factor"] == pytest.approx(1.2, rel=1e-6)
    assert first["op_overhead"] == pytest.approx(1.2e-5) and cal["task_overhead"] == \
        pytest.approx(1.2e-4)
    # the rest is the factor; messages cost what was measured
    assert first["message_overhead"] == 5e-5
    fitted = predict_shared(cal["graph"], cal["cluster"], ref, **first).step_time
    assert 1.0 < factor < 1.3
    assert factor * fitted == pytest.approx(1.3 * step, rel=1e-6)
    assert cal["reference_predicted"] == pytest.approx(fitted)
    # applied again (a kept calibration predicted again): the same
    again = {**options, "op_overhead": cal["op_overhead"], "task_overhead": cal["task_overhead"]}
    graph = cal["graph"]
    assert reference_factor(cal, ref, again) == pytest.approx(factor, rel=1e-9)
    assert cal["graph"] is graph and again == pytest.approx(first)


def test_the_compute_is_fitted_on_the_one_device_plan_when_it_was_measured():
    from placer.runtime.calibration import one_device_plan, reference_factor, reference_plan
    g = _chain()
    ref, one = reference_plan(g, ["r0", "r1"], 2), one_device_plan(g, ["r0", "r1"])
    assert one.devices_used() == {"r0"} and one.microbatches == 1
    options = {**RUNTIME_OPTIONS, "op_overhead": 1e-5, "task_overhead": 1e-4}
    cal = _calibration(g)
    alone = predict_shared(g, cal["cluster"], one, **options).step_time
    quiet = predict_shared(g, cal["cluster"], ref, **options)
    bars = dict(_compute_bars(quiet))
    # the plan that sends nothing ran 1.1x its prediction; the pipeline's
    # ranks computed 1.1x that again: the ops follow the former only
    cal.update(reference_compute={d: 1.21 * v for d, v in bars.items()},
               reference_step=1.3 * quiet.step_time, reference_one_step=1.1 * alone,
               op_overhead=1e-5, task_overhead=1e-4)
    fitted = dict(options)
    reference_factor(cal, ref, fitted, None, one)
    assert cal["reference_compute_factor"] == pytest.approx(1.1, rel=1e-3)
    assert predict_shared(cal["graph"], cal["cluster"], one, **fitted).step_time == \
        pytest.approx(1.1 * alone, rel=1e-3)
    assert fitted["op_overhead"] == pytest.approx(1.1e-5, rel=1e-3)
    # the shares stay as measured (see reference_factor's doc)
    assert "reference_share_factor" not in cal
    again = _compute_bars(predict_shared(cal["graph"], cal["cluster"], ref,
                                        **{**fitted, "message_overhead": 0.0}))
    assert sum(again.values()) == pytest.approx(1.1 * sum(bars.values()), rel=0.01)
    assert all(d.extra["cpu_share"] == 1.0 for d in cal["cluster"].devices)


def test_unfitted_restores_the_shares_of_a_calibration_fitted_with_them():
    # calibrations kept by earlier versions divided cpu_share_all by a factor
    from placer.runtime.calibration import unfitted
    from placer.runtime.contention import slower_together
    cal = _calibration(_chain())
    cal.update(cluster=slower_together(cal["cluster"], 1.25), reference_share_factor=1.25)
    back = unfitted(cal)
    assert "reference_share_factor" not in back
    assert all(d.extra["cpu_share_all"] == pytest.approx(1.0) for d in back["cluster"].devices)


def test_unfitted_undoes_the_reference_fit_so_it_can_be_fitted_again():
    from placer.runtime.calibration import FIT_KEYS, reference_factor, reference_plan, unfitted
    g = _chain()
    cal = _calibration(g)
    ref = reference_plan(g, ["r0", "r1"], 2)
    options = {**RUNTIME_OPTIONS, "op_overhead": 1e-5, "task_overhead": 1e-4}
    quiet = predict_shared(g, cal["cluster"], ref, **options)
    compute = dict(_compute_bars(quiet))
    # a slow phase beside: compute 1.3x; the fit scales the graph and costs
    cal.update(reference_compute={d: 1.3 * v for d, v in compute.items()},
               reference_step=1.3 * quiet.step_time, op_overhead=1e-5, task_overhead=1e-4)
    reference_factor(cal, ref, dict(options))
    assert cal["reference_compute_factor"] == pytest.approx(1.3, rel=1e-3)
    for kept in (cal, {**cal, "graph": cal["graph"].to_dict()}):
        back = unfitted(kept)
        assert not set(FIT_KEYS) & set(back)
        graph = back["graph"] if isinstance(back["graph"], Graph) else \
            Graph.from_dict(back["graph"])
        assert type(back["graph"]) is type(kept["graph"])
        for op in g:
            assert graph.op(op.id).flops == pytest.approx(op.flops, rel=1e-9)
        assert (back["op_overhead"], back["task_overhead"]) == pytest.approx((1e-5, 1e-4))
    assert cal["reference_compute_factor"] == pytest.approx(1.3, rel=1e-3)   # a copy
    # fitted again on other measurements: the first fit's factor is gone
    again = unfitted(cal)
    again["reference_compute"] = dict(compute)
    reference_factor(again, ref, dict(options))
    assert again["reference_compute_factor"] == pytest.approx(1.0, abs=1e-3)
    assert unfitted(again) is not again and unfitted({"graph": g})["graph"] is g


def test_the_factor_is_fitted_over_the_message_plan_too():
    from placer.runtime.calibration import (MESSAGE_SEGMENTS, message_plan, reference_factor,
                                            reference_plan)
    g = scale_graph(_chain(40), 0.1)     # steps of ~14 ms, as the bench's models
    ref, heavy = reference_plan(g, ["r0", "r1"], 2), message_plan(g, ["r0", "r1"], 2)
    order = g.topological_order()
    cuts = sum(heavy.placement[x] != heavy.placement[y] for x, y in zip(order, order[1:]))
    assert cuts == MESSAGE_SEGMENTS - 1 and heavy.devices_used() == {"r0", "r1"}
    options = {**RUNTIME_OPTIONS, "op_overhead": 1e-5, "task_overhead": 1e-4,
               "message_overhead": 5e-5}
    steps = [predict_shared(g, _calibration(g)["cluster"], p, **options).step_time
             for p in (ref, heavy)]
    # the host ran 5% slow on both; the pipeline's step came out 20% slow
    # on top (a slow moment of the host)
    fits = []
    for with_heavy in (False, True):
        cal = _calibration(g)
        cal.update(reference_step=1.25 * steps[0], reference_messages_step=1.05 * steps[1],
                   reference_compute_factor=1.0)
        opts = dict(options)
        fits.append(reference_factor(cal, ref, opts, heavy if with_heavy else None))
        assert opts["message_overhead"] == 5e-5      # messages cost what was measured
        assert (cal["reference_messages_predicted"] is not None) == with_heavy
    assert fits[0] == pytest.approx(1.25, rel=1e-6)
    # over both plans, weighted by their steps: the pipeline's moment weighs less
    assert fits[1] == pytest.approx((1.25 * steps[0] + 1.05 * steps[1]) / sum(steps), rel=1e-6)
    assert abs(fits[1] - 1.05) < 0.5 * abs(fits[0] - 1.05)


def test_a_data_parallel_group_wider_than_the_rows_runs_unsharded():
    g = _chain(batch=4)
    both = Plan({op: ["r0", "r1"] for op in g.ids}, microbatches=4)
    run = as_run(g, both)
    assert all(devs == ["r0"] for devs in run.placement.values()) and run.microbatches == 4
    halves = Plan({op: ["r0", "r1"] for op in g.ids}, microbatches=2)
    assert as_run(g, halves) is halves
    assert as_run(Graph("nobatch", [Op("x")]), Plan({"x": ["r0", "r1"]}, 4)).placement["x"] \
        == ["r0", "r1"]
    # the runtime's prediction is that of the plan it runs
    cal = _calibration(g)
    options = {**RUNTIME_OPTIONS, "op_overhead": 1e-5}
    assert predict_shared(g, cal["cluster"], both, **options).step_time == pytest.approx(
        predict_shared(g, cal["cluster"], run, **options).step_time)

"""placer profile: measured per-op times and a calibrated cluster."""

from __future__ import annotations

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
    assert cluster.device("cpu").efficiency is None  # input untouched
    assert torch.is_tensor(inputs[0])

"""Policy training's sampled rollouts on workers: each problem draws from
its own random streams, so a few iterations give bit-identical weights in
this process, on a local pool of two and on Ray."""

from __future__ import annotations

import faulthandler

import numpy as np
import pytest
import torch

from gnn.train import TrainConfig, problem_streams, train

CFG = dict(seed=2, iterations=3, problems=3, samples=4, max_units=12, val_every=0,
           refine=0.5, imitation=0.5, graphs=["layered-n16-w3-s1", "layered-n30-w4-s0"],
           clusters=["two-sites"], policy={"hidden": 8, "layers": 1})


def _weights(**where) -> dict:
    trainer = train(TrainConfig(**CFG), None, progress=False, validate=False, **where)
    return {k: v.clone() for k, v in trainer.policy.state_dict().items()}, trainer.history


_HERE: list = []


def _in_process():
    """The in-process run (once per pytest run: the tests compare with it)."""
    if not _HERE:
        _HERE.append(_weights())
    return _HERE[0]


def _same(a, b) -> None:
    (wa, ha), (wb, hb) = a, b
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert [r["loss"] for r in ha] == [r["loss"] for r in hb]


def test_problem_streams_are_their_own():
    a = problem_streams(2, 5, 0)
    b = problem_streams(2, 5, 1)
    again = problem_streams(2, 5, 0)
    assert a[0].random() == again[0].random() != b[0].random()
    assert torch.equal(torch.rand(3, generator=a[2]), torch.rand(3, generator=again[2]))
    assert a[1].random() != a[0].random()


def test_rollouts_on_a_local_pool_give_the_in_process_weights():
    faulthandler.dump_traceback_later(240, exit=True)   # a hang fails, not blocks CI
    try:
        here = _in_process()
        _same(_weights(backend="local", workers=2), here)
    finally:
        faulthandler.cancel_dump_traceback_later()
    # the run learned something, and a refinement was among the rollouts
    assert any(not torch.equal(v, w) for v, w in zip(
        here[0].values(), _initial().values()))
    assert np.isfinite([r["loss"] for r in here[1]]).all()


def _initial() -> dict:
    from gnn.train import Trainer
    return Trainer(TrainConfig(**CFG)).policy.state_dict()


def test_rollouts_on_ray_give_the_in_process_weights():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    here = _in_process()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING")
    faulthandler.dump_traceback_later(240, exit=True)
    try:
        _same(_weights(backend="ray", workers=2), here)
    finally:
        faulthandler.cancel_dump_traceback_later()
        ray.shutdown()


@pytest.mark.slow
def test_rollouts_on_a_two_node_ray_cluster_give_the_in_process_weights(monkeypatch):
    """A real cluster: a head and a second node (``ray start``, one CPU each)."""
    ray = pytest.importorskip("ray")
    from placer.bench.raycluster import local_cluster
    if ray.is_initialized():
        ray.shutdown()
    here = _in_process()
    faulthandler.dump_traceback_later(240, exit=True)
    try:
        with local_cluster(nodes=2, cpus=1) as address:
            monkeypatch.setenv("RAY_ADDRESS", address)
            _same(_weights(backend="auto", workers=2), here)
    finally:
        faulthandler.cancel_dump_traceback_later()

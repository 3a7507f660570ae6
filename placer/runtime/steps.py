"""The step loop both runtimes share: one process (:func:`placer.runtime.run.run`)
and each rank (:func:`placer.runtime.rank_loop.run_rank`)::

    for each of warmup + steps:
        before(step)                       # a rank's calibration hook
        seconds, last, kept = step(keep_gradients on the last)
        after warm-up: figures.add(seconds, last, comm, events)

:func:`timed_step` times one engine step, :class:`StepFigures` keeps what the
measured steps (after warm-up) say, :func:`run_steps` is the loop. A rank
passes its own step function (the step barrier starts it, the slowest
rank's time ends it) and calibration as ``before``."""

from __future__ import annotations

import statistics
import time
from typing import Callable, NamedTuple

import torch


class Step(NamedTuple):
    """One timed step: wall and process CPU seconds, the engine's step
    result, and the gradients kept before the optimizer stepped (or None)."""

    seconds: float
    cpu: float
    last: dict
    kept: dict | None


def timed_step(engine, params, devices, transport, inputs, targets, offsets, *,
               training: bool, optimizer, keep_gradients: bool,
               start: Callable[[], tuple] | None = None) -> Step:
    """One step of ``engine``, timed from ``start()`` (``(wall, cpu)``
    clocks; default: now) to the end of its work on every CUDA device of
    ``devices``. Gradients, the transport's communication times and the
    CUDA devices' peak memory start afresh."""
    for p in params:
        p.grad = None
    transport.comm_time.clear()
    cuda = {d for d in devices if d.type == "cuda"}
    for d in cuda:
        torch.cuda.synchronize(d)
        torch.cuda.reset_peak_memory_stats(d)
    began, cpu_began = start() if start is not None else (time.perf_counter(),
                                                          time.process_time())
    last, kept = engine.train_step(inputs, targets, offsets, training=training,
                                   optimizer=optimizer, keep_gradients=keep_gradients)
    for d in cuda:
        torch.cuda.synchronize(d)
    return Step(time.perf_counter() - began, time.process_time() - cpu_began, last, kept)


class StepFigures:
    """What the measured steps say: ``times`` and ``losses`` per step, per
    device the mean ``compute``, ``comm`` and ``cpu`` (process CPU time) per
    step and the activations' ``peak_act``, and the ``timeline`` (engine
    events) of a typical step, not the slowest."""

    def __init__(self, steps: int):
        self.steps = steps
        self.times: list = []
        self.losses: list = []
        self.timeline: list = []
        self.compute: dict = {}
        self.comm: dict = {}
        self.peak_act: dict = {}
        self.cpu = 0.0

    def add(self, step: Step, comm_time: dict, events: list) -> None:
        """Count one measured step."""
        if not self.times or step.seconds <= statistics.median(self.times):
            self.timeline = list(events)
        self.times.append(step.seconds)
        self.losses.append(step.last["loss"])
        for d, v in step.last["stats"].peak_act.items():
            self.peak_act[d] = max(self.peak_act.get(d, 0.0), v)
        for d, v in step.last["stats"].compute.items():
            self.compute[d] = self.compute.get(d, 0.0) + v / self.steps
        for d, v in comm_time.items():
            self.comm[d] = self.comm.get(d, 0.0) + v / self.steps
        self.cpu += step.cpu / self.steps


class Measured(NamedTuple):
    """What :func:`run_steps` returns: the figures, the last step's engine
    result and the gradients kept in the last step."""

    figures: StepFigures
    last: dict
    gradients: dict


def run_steps(steps: int, warmup: int, step: Callable[[bool], Step], engine, transport,
              before: Callable[[int], None] | None = None) -> Measured:
    """``warmup`` then ``steps`` measured steps of ``step(keep_gradients)``
    (True on the last), ``before(index)`` ahead of each; the measured ones
    counted in :class:`StepFigures` with ``transport``'s communication times
    and ``engine``'s events."""
    figures = StepFigures(steps)
    last, grads = None, {}
    for index in range(steps + warmup):
        if before is not None:
            before(index)
        done = step(index == steps + warmup - 1)
        last = done.last
        grads = done.kept if done.kept is not None else grads
        if index >= warmup:
            figures.add(done, transport.comm_time, engine.events)
    return Measured(figures, last, grads)

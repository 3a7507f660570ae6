"""The step loop both runtimes share (placer.runtime.steps) and the rank
status every module holds (placer.runtime.status), on hand-made steps."""
import json
from types import SimpleNamespace

from placer.runtime.status import STATUS, read_status
from placer.runtime.steps import Step, StepFigures, run_steps


def _last(loss, compute, peak):
    return {"loss": loss, "stats": SimpleNamespace(compute=compute, peak_act=peak)}


def test_run_steps_counts_only_measured_steps_and_calls_the_hook_first():
    calls, seconds = [], [9.0, 1.0, 3.0, 2.0]     # the warm-up step is the slowest
    transport = SimpleNamespace(comm_time={})
    engine = SimpleNamespace(events=[])

    def before(index):
        calls.append(("before", index))

    def step(keep):
        k = len([c for c in calls if c[0] == "step"])
        calls.append(("step", k, keep))
        transport.comm_time = {"a": 0.5 * k}
        engine.events = [f"event of step {k}"]
        return Step(seconds[k], 0.1, _last(float(k), {"a": 1.0, "b": 2.0 * k}, {"a": k}),
                    {"w": k} if keep else None)

    measured = run_steps(3, 1, step, engine, transport, before)
    assert calls == [("before", 0), ("step", 0, False), ("before", 1), ("step", 1, False),
                     ("before", 2), ("step", 2, False), ("before", 3), ("step", 3, True)]
    fig = measured.figures
    assert fig.times == [1.0, 3.0, 2.0] and fig.losses == [1.0, 2.0, 3.0]
    # means per measured step, the warm-up step left out
    assert fig.compute == {"a": 1.0, "b": (2 + 4 + 6) / 3}
    assert fig.comm == {"a": (0.5 + 1.0 + 1.5) / 3}
    assert abs(fig.cpu - 0.1) < 1e-12
    assert fig.peak_act == {"a": 3}
    # the typical step (at or below the median so far), not the slowest: step 3
    assert fig.timeline == ["event of step 3"]
    assert measured.gradients == {"w": 3} and measured.last["loss"] == 3.0


def test_step_figures_keep_the_first_step_when_later_ones_are_slower():
    fig = StepFigures(2)
    fig.add(Step(1.0, 0.0, _last(0.0, {}, {}), None), {}, ["first"])
    fig.add(Step(5.0, 0.0, _last(0.0, {}, {}), None), {}, ["slow"])
    assert fig.timeline == ["first"] and fig.times == [1.0, 5.0]


def test_status_reopens_in_place_for_every_module(tmp_path):
    import placer.runtime.transport as transport_module
    path = tmp_path / "rank3.status"
    held = transport_module.STATUS          # what another module imported
    try:
        STATUS.reopen(str(path), 3)
        assert held is STATUS and held.rank == 3
        held.set("step 2")
        with held.wait(1):
            assert read_status(str(path))["stage"] == "step 2: waiting for rank 1"
        record = read_status(str(path))
        assert record["stage"] == "step 2" and record["rank"] == 3
        assert len(path.read_bytes()) == STATUS.SIZE            # one record, rewritten
        assert json.loads(path.read_text())["count"] == 3
    finally:
        STATUS.reopen(None, 0)
    assert STATUS.fd is None and STATUS.count == 0

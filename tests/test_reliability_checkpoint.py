"""Interrupted searches: checkpoint on Ctrl-C/SIGTERM, resume to the same answer."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import placer
from placer import Plan
from placer.cli import main
from placer.errors import StrategyError
from placer.search.base import SearchInterrupted

GRAPH, CLUSTER = "layered-n200-w8-s2", "a100x8"
KW = dict(method="evolution", seed=3, time_budget=None, evaluations=3000, population=16)


@pytest.fixture(scope="module")
def problem():
    return placer.datasets.graph(GRAPH), placer.Cluster.preset(CLUSTER)


@pytest.fixture(scope="module")
def reference(problem):
    graph, cluster = problem
    plan = placer.optimize(graph, cluster, **KW)
    assert plan.extra["search"]["generations"] >= 10   # long enough to interrupt
    return plan


def interrupt_at(*gens):
    """A progress callback that raises KeyboardInterrupt at these generations."""
    def callback(event):
        if event.message in {f"generation {g}" for g in gens}:
            raise KeyboardInterrupt
    return callback


@pytest.mark.parametrize("share", [(0,), (0.25,), (0.9,), (0.25, 0.7)])
def test_interrupt_saves_plan_and_resume_matches(tmp_path, problem, reference, share):
    graph, cluster = problem
    state = tmp_path / "state.json"
    # generations as shares of the reference run, which changes with the search
    last = reference.extra["search"]["generations"]
    gens = [int(f * last) for f in share]
    for g in gens:     # interrupted (perhaps again after a resume) at each of gens
        with pytest.raises(SearchInterrupted) as info:
            placer.optimize(graph, cluster, checkpoint=state, resume=True,
                            progress=interrupt_at(g), **KW)
        exc = info.value
        assert exc.checkpoint == str(state) and f"generation {g}" in exc.message
        exc.plan.validate(graph, cluster)            # bound, valid, scored
        assert exc.plan.predicted["step_time"] > 0 and exc.plan.method == "evolution"
        data = json.loads(state.read_text())
        assert data["format"] == "placer.evolution-state/v1" and data["gen"] == g
        Plan.from_dict(data["best_plan"]).validate(graph, cluster, check_fingerprints=False)
    done = placer.optimize(graph, cluster, checkpoint=state, resume=True, **KW)
    assert done.placement == reference.placement
    assert done.predicted["step_time"] == reference.predicted["step_time"]
    assert done.predicted["search"]["evaluations"] == reference.predicted["search"]["evaluations"]


def test_resume_checks_identity(tmp_path, problem):
    graph, cluster = problem
    state = tmp_path / "state.json"
    with pytest.raises(SearchInterrupted):
        placer.optimize(graph, cluster, checkpoint=state, progress=interrupt_at(2), **KW)
    with pytest.raises(StrategyError, match="checkpoint is of another search"):
        placer.optimize(graph, cluster, checkpoint=state, resume=True,
                        **{**KW, "seed": 4})
    state.write_text('{"format": "something/v1"}')
    with pytest.raises(StrategyError, match="not a search checkpoint"):
        placer.optimize(graph, cluster, checkpoint=state, resume=True, **KW)
    with pytest.raises(StrategyError, match="resume needs a checkpoint"):
        placer.optimize(graph, cluster, resume=True, **KW)


SIGTERM_DRIVER = textwrap.dedent("""
    import os, signal, sys
    import evolution.search as es
    emit = es.Evolution._emit
    def killing_emit(self, progress, budget, best, gen, bar):
        emit(self, progress, budget, best, gen, bar)
        if gen == int(os.environ["KILL_AT_GEN"]):
            os.kill(os.getpid(), signal.SIGTERM)
    es.Evolution._emit = killing_emit
    from placer.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_cli_sigterm_then_resume_equals_uninterrupted(tmp_path):
    common = ["plan", GRAPH, "-c", CLUSTER, "--evaluations", "3000", "--time-budget",
              "1000", "--seed", "1", "--no-plots", "--json"]
    full, part, state = tmp_path / "full.json", tmp_path / "part.json", tmp_path / "st.json"
    assert main(common + ["-o", str(full)]) == 0
    driver = tmp_path / "driver.py"
    driver.write_text(SIGTERM_DRIVER)
    out = subprocess.run([sys.executable, str(driver), *common, "-o", str(part),
                          "--checkpoint", str(state)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "KILL_AT_GEN": "9"})
    assert out.returncode == 130, out.stderr
    assert "after generation 9" in out.stderr and "--resume" in out.stderr
    # a slow host adds progress lines ("... ..."); the message is one line
    assert len([ln for ln in out.stderr.strip().splitlines()
                if not ln.endswith(" ...")]) == 1, out.stderr
    graph, cluster = placer.datasets.graph(GRAPH), placer.Cluster.preset(CLUSTER)
    Plan.load(part).validate(graph, cluster)          # the best plan so far, valid
    assert main(common + ["-o", str(part), "--checkpoint", str(state), "--resume"]) == 0
    a, b = json.loads(full.read_text()), json.loads(part.read_text())
    assert a["placement"] == b["placement"]
    assert a["predicted"]["step_time"] == b["predicted"]["step_time"]


@pytest.mark.parametrize("extra, words", [
    (["--resume"], "--resume: --resume needs the checkpoint file"),
    (["-m", "heft", "--checkpoint", "s.json"], "--checkpoint: method 'heft' cannot checkpoint"),
])
def test_cli_checkpoint_bad_options(tmp_path, capsys, extra, words):
    rc = main(["plan", GRAPH, "-c", CLUSTER, "-o", str(tmp_path / "p.json"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from placer import Cluster, Plan
from placer.cli import main


def run_cli(*args):
    """Run the CLI in a fresh interpreter, like a user would."""
    return subprocess.run([sys.executable, "-m", "placer", *args], capture_output=True,
                          text=True, timeout=300)


def test_version():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("placer ")


@pytest.mark.parametrize("args, words", [
    (["show", "missing.json"], "missing.json: file not found"),
    (["show", "BAD"], "BAD"),
    (["trace", "no_such_module:make"], "cannot import 'no_such_module'"),
    (["trace", "not-a-zoo-model"], "unknown model"),
])
def test_errors_are_one_line_exit_2(tmp_path, args, words):
    if args[1] == "BAD":
        bad = tmp_path / "bad.yaml"
        bad.write_text("format: placer.cluster/v1\ndevices: [{name: a, flops: -1, memory: 1}]\n"
                       "links: {default: {bandwidth: 1, latency: 0}}\n")
        args = ["show", str(bad)]
        words = "devices[0].flops: must be > 0"
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_show_each_format(tmp_path, tiny_graph, capsys):
    cluster = Cluster.preset("two-sites")
    gpath, cpath, ppath = tmp_path / "g.json", tmp_path / "c.yaml", tmp_path / "p.json"
    tiny_graph.save(gpath)
    cluster.save(cpath)
    Plan({op.id: ["a0"] for op in tiny_graph}, method="manual").bind(tiny_graph, cluster).save(ppath)
    for path, kind in ((gpath, "graph"), (cpath, "cluster"), (ppath, "plan")):
        assert main(["show", str(path), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["kind"] == kind
    assert main(["show", str(gpath)]) == 0
    text = capsys.readouterr().out
    assert "4 ops" in text and "fc1" in text


def test_trace_module_factory(tmp_path, monkeypatch, capsys):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        import torch
        def mlp():
            return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 4))
        def with_inputs():
            return mlp(), (torch.randn(2, 16),)
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["trace", "mymodels:mlp", "--input-shape", "8,16", "-o", "g.json", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ops"] >= 4 and data["flops"] == 2 * 8 * (16 * 32 + 32 * 4)
    assert (tmp_path / "g.json").exists()
    assert main(["trace", "mymodels:with_inputs", "-o", "g2.json"]) == 0
    assert main(["trace", "mymodels:mlp"]) == 2  # no input shape
    assert "--input-shape" in capsys.readouterr().err


def test_datasets_lists_presets(capsys):
    assert main(["datasets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "two-sites" in data["clusters"] and "gpt-125m" in data["models"]


def test_plan_run_and_simulate_end_to_end(tmp_path, capsys):
    import placer
    model, inputs = placer.datasets.model("gpt-125m", tiny=True)
    graph = placer.trace(model, inputs, granularity="module")
    gpath = tmp_path / "g.json"
    graph.save(gpath)
    ppath = tmp_path / "plan.json"
    assert main(["plan", str(gpath), "--cluster", "two-sites", "--method", "even_pipeline",
                 "--time-budget", "5", "-o", str(ppath), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["report"]["feasible"] and data["report"]["step_time"] > 0
    assert {p.rsplit(".", 2)[-2] for p in data["pictures"]} == {"placement", "gantt",
                                                                "convergence"}
    for picture in data["pictures"]:
        assert (tmp_path / picture.rsplit("/", 1)[-1]).read_bytes()[:4] == b"\x89PNG"
    series = data["convergence"]["even_pipeline"]
    assert series and series[-1]["step_time"] > 0
    plan = Plan.load(ppath)
    plan.validate(graph, Cluster.preset("two-sites"))
    assert main(["simulate", str(gpath), str(ppath), "--cluster", "two-sites", "--json",
                 "--trace", str(tmp_path / "t.json")]) == 0
    simulated = json.loads(capsys.readouterr().out)["report"]
    assert simulated["step_time"] == pytest.approx(data["report"]["step_time"])
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["traceEvents"]
    assert main(["run", str(ppath), "--model", "gpt-125m", "--tiny", "--steps", "2",
                 "--cluster", "two-sites", "--trace", str(tmp_path / "m.json"),
                 "--gantt", str(tmp_path / "m.png")]) == 0
    assert "measured" in capsys.readouterr().out
    measured = json.loads((tmp_path / "m.json").read_text())
    assert measured["otherData"]["model"] == "measured" and measured["traceEvents"]
    assert json.loads((tmp_path / "m.predicted.json").read_text())["traceEvents"]
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_delegated_commands_have_help():
    for name in ("run", "launch", "profile", "tune", "train"):
        out = run_cli(name, "--help")
        assert out.returncode == 0 and "usage: placer" in out.stdout, (name, out.stderr)


#: flags each subcommand must offer (the CLI's conventions in README)
CONVENTIONS = {
    "trace": ["-o", "--json"], "show": ["--json"],
    "plan": ["-o", "--json", "--seed", "--time-budget"],
    "replan": ["-o", "--json", "--seed", "--time-budget"],
    "simulate": ["--json"], "compare": ["--json"], "datasets": ["--json"], "warmup": ["--json"],
    "bench": ["-o", "--seed", "--time-budget"],
    "run": ["-o", "--json", "--seed"], "launch": ["-o", "--json", "--seed"],
    "profile": ["-o", "--json", "--seed"],
    "tune": ["-o", "--json", "--seed", "--time-budget"],
    "train": ["-o", "--json", "--seed", "--time-budget"],
}


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_every_command_help_has_an_example_and_the_conventions(name, capsys):
    with pytest.raises(SystemExit) as stop:
        main([name, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    example = text.split("example", 1)[1]
    assert f"placer {name}" in example, text
    for flag in CONVENTIONS[name]:
        assert f" {flag}" in text, (name, flag)


def test_bad_plan_for_graph_is_exit_2(tmp_path, tiny_graph):
    gpath, ppath = tmp_path / "g.json", tmp_path / "p.json"
    tiny_graph.save(gpath)
    Plan({"fc1": ["a0"]}).save(ppath)
    out = run_cli("simulate", str(gpath), str(ppath), "--cluster", "two-sites")
    assert out.returncode == 2 and "not placed" in out.stderr


def test_compare_plans(tmp_path, tiny_graph):
    cluster = Cluster.preset("two-sites")
    gpath = tmp_path / "g.json"
    tiny_graph.save(gpath)
    one = tmp_path / "one.json"
    split = tmp_path / "split.json"
    Plan({op.id: ["a0"] for op in tiny_graph}, method="one").save(one)
    Plan({"x": ["a0"], "fc1": ["a0"], "act": ["b0"], "fc2": ["b0"]}, method="wan").save(split)
    out = run_cli("compare", str(gpath), str(one), str(split), "--cluster", "two-sites", "--json",
                  "--plot", str(tmp_path / "cmp.png"))
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["plans"]
    assert [r["method"] for r in rows] == ["one", "wan"]
    # crossing the 35 ms WAN twice (forward and backward) cannot be faster
    assert rows[1]["step_time"] > rows[0]["step_time"] + 0.07
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_cli("compare", str(gpath), str(gpath), "--cluster", "two-sites")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_plan_with_several_methods_keeps_the_best(tmp_path, capsys, tiny_graph):
    gpath, ppath = tmp_path / "g.json", tmp_path / "plan.json"
    tiny_graph.save(gpath)
    assert main(["plan", str(gpath), "--cluster", "two-sites", "--method",
                 "single,round_robin,heft", "-o", str(ppath), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    steps = {c["method"]: c["step_time"] for c in data["candidates"]}
    assert set(steps) == {"single", "round_robin", "heft"}
    assert data["report"]["step_time"] == min(steps.values())
    assert Plan.load(ppath).method == min(steps, key=steps.get)
    assert set(data["convergence"]) == set(steps)


def test_plan_unknown_method_is_one_line_exit_2(tmp_path, tiny_graph):
    gpath = tmp_path / "g.json"
    tiny_graph.save(gpath)
    out = run_cli("plan", str(gpath), "--cluster", "two-sites", "--method", "heft,nope",
                  "-o", str(tmp_path / "p.json"))
    assert out.returncode == 2 and "'nope'" in out.stderr and "--method" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_plan_interrupted_in_a_later_method_keeps_the_best_finished(tmp_path, tiny_graph,
                                                                     monkeypatch):
    import placer.search as search
    real = search.optimize_with_report

    def stop_on_round_robin(graph, cluster, method, *args, **kwargs):
        if method == "round_robin":
            raise KeyboardInterrupt      # as Ctrl-C or SIGTERM would, mid-search
        return real(graph, cluster, method, *args, **kwargs)

    monkeypatch.setattr(search, "optimize_with_report", stop_on_round_robin)
    gpath, ppath = tmp_path / "g.json", tmp_path / "plan.json"
    tiny_graph.save(gpath)
    assert main(["plan", str(gpath), "--cluster", "two-sites", "--method",
                 "single,round_robin", "-o", str(ppath)]) == 130
    saved = Plan.load(ppath)
    assert saved.method == "single"
    saved.validate(tiny_graph, Cluster.preset("two-sites"))


def test_bench_learned_passes_seeds_and_evaluations(monkeypatch, tmp_path):
    """``placer bench learned --seeds ... --evaluations N`` reaches the
    benchmark as ``seeds`` and ``evaluations``."""
    import placer.bench.learned as learned
    seen = {}
    monkeypatch.setattr(learned, "bench_learned", lambda **kw: seen.update(kw))
    out = str(tmp_path / "b.json")
    assert main(["bench", "learned", "--seeds", "2", "0", "--evaluations", "500",
                 "-o", out]) == 0
    assert seen["seeds"] == [2, 0] and seen["evaluations"] == 500 and seen["out"] == out


MYMODELS = """
import torch
def mlp(width=16):
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 4))
"""


@pytest.mark.parametrize("command", ["run", "launch"])
@pytest.mark.parametrize("model, words", [
    ("not-a-zoo-model", "unknown model 'not-a-zoo-model'"),
    ("mymodels:nope", "'mymodels' has no callable 'nope'"),
    ("no_such_module:make", "cannot import 'no_such_module'"),
    ("mymodels:mlp", "--input-shape: mymodels:mlp returned only a model"),
])
def test_run_and_launch_unknown_model_is_one_line_exit_2(tmp_path, monkeypatch, capsys,
                                                         tiny_graph, command, model, words):
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    Plan({op.id: ["a0"] for op in tiny_graph}).save(tmp_path / "p.json")
    try:
        assert main([command, "p.json", "--model", model]) == 2
    finally:
        sys.modules.pop("mymodels", None)
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"placer {command}: error: ") and words in err, err
    assert "\n" not in err


def test_run_own_model_matches_the_unplaced_loss(tmp_path, monkeypatch, capsys):
    """``placer run --model MODULE:FACTORY`` with --config and --seed: the
    same model and inputs trace's loader builds, and the unplaced loss."""
    import torch
    from placer.cli import load_model
    from placer.runtime.run import default_loss
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert main(["trace", "mymodels:mlp", "--input-shape", "8,16", "--granularity", "op",
                     "-o", "g.json"]) == 0
        assert main(["plan", "g.json", "-c", "two-sites", "-m", "round_robin", "--no-plots",
                     "-o", "p.json"]) == 0
        capsys.readouterr()
        assert main(["run", "p.json", "--model", "mymodels:mlp", "--input-shape", "8,16",
                     "--config", '{"width": 24}', "--seed", "3", "--steps", "1",
                     "--json"]) == 0
        model, inputs = load_model("mymodels:mlp", ["8,16"], seed=3, config={"width": 24})
    finally:
        sys.modules.pop("mymodels", None)
    assert model[0].out_features == 24
    data = json.loads(capsys.readouterr().out)
    with torch.no_grad():
        assert data["loss"] == pytest.approx(float(default_loss(model(*inputs))), rel=1e-6)
    assert len(Plan.load(tmp_path / "p.json").devices_used()) > 1


def test_every_positional_has_help():
    from placer.cli import build_parser
    from placer.cli_runtime import run_parser as _parser
    parsers = dict(build_parser()._subparsers._group_actions[0].choices)
    parsers.update({"run": _parser("placer run", False), "launch": _parser("placer launch", True)})
    for name, parser in parsers.items():
        for action in parser._actions:
            if not action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, (name, action.dest)


def test_cluster_is_spelled_the_same_on_every_command():
    from placer.cli import build_parser
    from placer.cli_runtime import run_parser as _parser
    parsers = dict(build_parser()._subparsers._group_actions[0].choices)
    parsers.update({"run": _parser("placer run", False), "launch": _parser("placer launch", True)})
    for name in ("plan", "replan", "simulate", "compare", "run", "launch"):
        flags = {s for a in parsers[name]._actions for s in a.option_strings}
        assert {"-c", "--cluster"} <= flags, name
        positionals = [a.dest for a in parsers[name]._actions if not a.option_strings]
        assert "cluster" not in positionals, name


def test_old_positional_cluster_still_works_with_one_deprecation_line(tmp_path, tiny_graph,
                                                                      capsys):
    gpath, ppath = tmp_path / "g.json", tmp_path / "p.json"
    tiny_graph.save(gpath)
    Plan({op.id: ["a0"] for op in tiny_graph}, method="one").save(ppath)
    results = {}
    for spelling in (["simulate", str(gpath), str(ppath), "--cluster", "two-sites"],
                     ["simulate", str(gpath), "two-sites", str(ppath)],
                     ["compare", str(gpath), str(ppath), str(ppath), "-c", "two-sites"],
                     ["compare", str(gpath), "two-sites", str(ppath), str(ppath)]):
        assert main(spelling + ["--json"]) == 0
        out = capsys.readouterr()
        old = "two-sites" in spelling[2:3]
        assert bool(out.err) == old, out.err
        if old:
            assert len(out.err.strip().splitlines()) == 1
            assert "deprecated" in out.err and "--cluster two-sites" in out.err
        results[tuple(spelling)] = json.loads(out.out)
    new_sim, old_sim, new_cmp, old_cmp = results.values()
    assert new_sim["report"]["step_time"] == old_sim["report"]["step_time"] > 0
    assert new_cmp["plans"] == old_cmp["plans"] and len(new_cmp["plans"]) == 2
    assert main(["simulate", str(gpath), str(ppath)]) == 2
    assert "--cluster" in capsys.readouterr().err


def test_trace_and_plan_share_one_default_granularity(tmp_path, monkeypatch, capsys):
    from placer.cli import DEFAULT_GRANULARITY
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert main(["trace", "mymodels:mlp", "--input-shape", "8,16", "-o", "g.json"]) == 0
        assert "--granularity op" in capsys.readouterr().err     # says the default changed
        assert main(["plan", "mymodels:mlp", "--input-shape", "8,16", "-c", "two-sites",
                     "-m", "single", "--no-plots", "-o", "p.json"]) == 0
    finally:
        sys.modules.pop("mymodels", None)
    from placer import Graph
    graph = Graph.load(tmp_path / "g.json")
    assert DEFAULT_GRANULARITY == "module" and graph.meta.get("granularity") == "module"
    assert set(Plan.load(tmp_path / "p.json").placement) == set(graph.ids)


@pytest.mark.parametrize("measured, predicted, times, expect, unsteady", [
    (16.54e-3, 14.38e-3, [0.0159, 0.01654, 0.0183], "14.4 ms predicted (-13%)", False),
    (0.28, 8e-5, [0.0015, 0.28, 0.305], "3,500x slower than the 80 us predicted", True),
    (0.01, 0.05, [0.01, 0.011], "5x faster than the 50 ms predicted", False),
])
def test_measured_line_gives_factor_and_spread(capsys, measured, predicted, times, expect,
                                               unsteady):
    from types import SimpleNamespace
    from placer.cli_runtime import print_report as _print
    ns = SimpleNamespace(output=None, json=False, _calibrated=True)
    _print({"report": {"step_time": measured, "predicted": predicted, "step_times": times},
            "loss": 1.5}, ns)
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert expect in first and "-100%" not in first, first
    low, high = min(times), max(times)
    assert f"min {low * 1e3:.3g}, max {high * 1e3:.3g} ms over {len(times)} steps" in first
    assert ("slowest step took" in out) == unsteady, out


def _chain_plan(tmp_path, placement: dict, **predicted):
    """A plan over a chain of ops named like modules, with a prediction."""
    plan = Plan({op: list(devs) for op, devs in placement.items()}, microbatches=8,
                schedule="1f1b", method="manual")
    plan.predicted = {"step_time": 0.1, "feasible": True, **predicted}
    path = tmp_path / "p.json"
    plan.save(path)
    return path


def test_show_plan_lists_stages_per_device(tmp_path, capsys):
    names = ["embed"] + [f"blocks.{i}" for i in range(6)] + ["head"]
    where = ([("a0",)] * 3 + [("b0", "b1", "b2")] * 2 + [("c0",)] * 2 + [("d0",)])
    path = _chain_plan(tmp_path, dict(zip(names, where)),
                       peak_memory={"a0": 2.5e9, "b0": 1e9, "b1": 1e9, "b2": 1e9, "c0": 5e8,
                                    "d0": 4e8},
                       busy={"a0": 0.09, "b0": 0.05, "b1": 0.05, "b2": 0.05, "c0": 0.04,
                             "d0": 0.02})
    assert main(["show", str(path)]) == 0
    text = capsys.readouterr().out
    assert ("4 pipeline stages, stage 2 data-parallel over 3 devices; 8 microbatches, 1f1b"
            in text), text
    rows = {line.split()[0]: line for line in text.splitlines() if line[:2] in
            ("a0", "b0", "b2", "c0", "d0")}
    assert "embed, blocks.0, blocks.1" in rows["a0"] and "2.5 GB" in rows["a0"]
    assert "90%" in rows["a0"] and rows["b2"].split()[1] == "2"
    assert "blocks.4, blocks.5" in rows["c0"] and rows["d0"].split()[1] == "4"
    assert main(["show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["stages"] for d in data["devices"]] == [[1], [2], [2], [2], [3], [4]]


def test_show_plan_says_when_ops_are_scattered(tmp_path, capsys):
    names = [f"op{i}" for i in range(12)]
    path = _chain_plan(tmp_path, {n: (["a0"] if i % 2 else ["a1"]) for i, n in enumerate(names)})
    assert main(["show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "op-level placement over 2 devices" in text and "change device 11 times" in text


def test_placement_picture_labels_ops_and_boxes_stages(monkeypatch, tmp_path):
    import placer.plots as plots
    from placer import Edge, Graph, Op
    names = ["embed"] + [f"blocks.{i}" for i in range(4)] + ["head"]
    graph = Graph("chain", [Op(n, flops=1e9) for n in names],
                  [Edge(a, b, 8) for a, b in zip(names, names[1:])])
    plan = Plan(dict(zip(names, [["a0"]] * 3 + [["b0", "b1"]] * 2 + [["c0"]])))
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    plots.plot_placement(graph, plan, tmp_path / "p.png")
    ax = figures[0].axes[0]
    texts = {t.get_text() for t in ax.texts}
    assert set(names) <= texts, texts
    assert {"stage 1 (a0)", "stage 2 (2 devices)", "stage 3 (c0)"} <= texts, texts
    assert len(ax.patches) == 3

"""``placer bench learned`` on one tiny case with a tiny policy."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torch_geometric")

from gnn.checkpoint import save_policy  # noqa: E402
from gnn.model import PlacementPolicy, PolicyConfig  # noqa: E402


def test_bench_learned_writes_rows_and_summary(tmp_path, capsys):
    from placer.bench.learned import bench_learned
    from placer.search import strategies
    torch.manual_seed(0)
    save_policy(tmp_path / "p", PlacementPolicy(PolicyConfig(hidden=16, layers=1)))
    out = tmp_path / "bench.json"
    result = bench_learned(["unet.module"], ["edge-wireless"], time_budget=1.0, finetune=0.3,
                           checkpoint=tmp_path / "p", samples=4, out=out)
    data = json.loads(out.read_text())
    row = data["rows"][0]
    for key in ("greedy", "zero_shot", "fine_tuned"):
        assert row[key]["step_time"] > 0 and row[key]["plan_seconds"] >= 0
    if "evolution" in strategies():
        assert row["hybrid"]["step_time"] > 0
        assert data["summary"]["cases"] == 1
        assert result["summary"]["zero_shot_vs_evolution_gmean"] > 0
        # one seed: its evolution run is the median
        assert row["evolution_step_time_median"] == row["evolution"]["step_time"]
        assert row["zero_shot_vs_evolution_median"] == row["zero_shot_vs_evolution"]
        summary = data["summary"]
        assert summary["zero_shot_within_10pct_of_median_feasible"] == \
            summary["zero_shot_within_10pct_feasible"]
        # evolution's screening fallbacks are kept per run (a count, 0 here)
        for name in ("evolution", "hybrid"):
            assert isinstance(row[name]["screen_fallbacks"], int)
            assert isinstance(row["seeds"][0][name]["screen_fallbacks"], int)
        assert set(data["summary"]["screen_fallback_runs"]) == {"evolution", "hybrid"}
    assert row["zero_shot"]["screen_fallbacks"] is None
    # zero-shot: the median of its deterministic runs
    runs = row["zero_shot"]["plan_seconds_runs"]
    assert len(runs) == 3 and row["zero_shot"]["deterministic"] is True
    assert row["zero_shot"]["plan_seconds"] == sorted(runs)[1]
    assert "unet.module" in capsys.readouterr().out


def test_time_to_reach_compares_each_event_with_its_own_models_target():
    """Evolution screening with the simulator reports simulator figures and
    ends with the search model's: each event is compared with evolution's
    final plan by the model of that event (comparing the simulator trace
    with the analytical final figure would see evolution reach its own
    final only at the end, and hybrid never)."""
    from placer.bench.learned import _compare, _targets, _time_to_reach
    evo = {"trace": [(1.0, 1.20), (2.0, 1.00), (3.0, 0.95)],
           "trace_models": ["simulator", "simulator", "analytical"],
           "trace_evaluations": [100, 200, 300], "model": "simulator", "objective": 1.00,
           "search_model": "analytical", "search_objective": 0.95, "step_time": 1.0}
    hyb = {"trace": [(0.5, 0.96), (0.8, 1.05), (0.9, 0.99), (3.0, 0.97)],
           "trace_models": ["analytical", "simulator", "simulator", "analytical"],
           "trace_evaluations": [40, 90, 110, 300], "model": "simulator", "objective": 0.99,
           "search_model": "analytical", "search_objective": 0.97, "step_time": 0.99}
    assert _targets(evo) == {"simulator": 1.00, "analytical": 0.95}
    assert _time_to_reach(evo, _targets(evo)) == 2.0
    assert _time_to_reach(hyb, _targets(evo)) == 0.9
    assert _time_to_reach(hyb, _targets(evo), "evaluations") == 110
    cmp = _compare(evo, hyb, "time")
    assert cmp["half"] and cmp["no_worse"] and cmp["target_met"]
    assert _compare(evo, hyb, "evaluations")["half"] is False       # 110 > 200 / 2
    # a worse final and a later reach miss both targets
    late = dict(hyb, trace=[(1.5, 0.99)], trace_models=["simulator"],
                trace_evaluations=[150], objective=1.01)
    assert not _compare(evo, late, "time")["target_met"]
    # nothing fits: the objectives carry a penalty in the billions, and a
    # plan with the same excess 20% slower is worse, not equal within 1e-9
    bad = {"trace": [(1.0, 2253000000.2241)], "trace_models": ["simulator"],
           "trace_evaluations": [10], "model": "simulator", "objective": 2253000000.2241,
           "search_model": "analytical", "search_objective": 2253000000.2241,
           "step_time": 0.2241}
    slower = dict(bad, trace=[(0.1, 2253000000.2697)], objective=2253000000.2697,
                  step_time=0.2697)
    cmp = _compare(bad, slower, "time")
    assert cmp["hybrid_to_evolution"] is None and not cmp["no_worse"]
    assert _compare(bad, dict(bad), "time")["no_worse"]


def test_bench_learned_seeds_at_equal_evaluations(tmp_path):
    """With ``seeds`` and ``evaluations`` evolution and hybrid run once per
    seed on the same number of plans scored; each row keeps every seed's
    figures, the first seed's as the row's own, and the summary counts."""
    from placer.bench.learned import bench_learned
    from placer.search import strategies
    if "evolution" not in strategies():
        pytest.skip("evolution not installed")
    torch.manual_seed(0)
    save_policy(tmp_path / "p", PlacementPolicy(PolicyConfig(hidden=16, layers=1)))
    result = bench_learned(["unet.module"], ["edge-wireless"], evaluations=600, seeds=[1, 0],
                           finetune=0.0, checkpoint=tmp_path / "p", samples=2,
                           out=tmp_path / "b.json", quiet=True)
    row = result["rows"][0]
    assert result["budget"] == "evaluations" and result["seeds"] == [1, 0]
    assert [r["seed"] for r in row["seeds"]] == [1, 0]
    assert row["seeds"][0]["hybrid"]["objective"] == row["hybrid"]["objective"]
    for r in row["seeds"]:
        for name in ("evolution", "hybrid"):
            assert r[name]["evaluations"] <= 600
        assert r["target_met"] == (r["half"] or r["no_worse"])
    assert row["evolution_evaluations_to_final"] <= row["evolution"]["evaluations"]
    summary = result["summary"]
    assert summary["seeds"] == 2 and summary["runs"] == 2
    assert summary["hybrid_target_met_runs"] == row["hybrid_target_met_seeds"]
    with pytest.raises(Exception, match="distinct"):
        bench_learned(["unet.module"], ["edge-wireless"], seeds=[0, 0], out=None)


def test_bench_learned_ood_split_runs_one_case_with_anytime_rl(tmp_path, monkeypatch):
    """``--split ood`` reaches the benchmark, whose ood cases are the
    out-of-family split's; one of them at a tiny budget has the anytime
    row: its first plan reported early, its result no worse than zero-shot."""
    import placer.bench.learned as learned
    from placer import datasets
    from placer.cli import main
    seen = {}
    monkeypatch.setattr(learned, "bench_learned", lambda **kw: seen.update(kw))
    assert main(["bench", "learned", "--split", "ood", "-o", str(tmp_path / "x.json")]) == 0
    assert seen["split"] == "ood"
    monkeypatch.undo()
    todo = learned.cases("ood")
    parts = datasets.ood()
    assert len(todo) == len(parts["graphs"]) * len(parts["clusters"])
    assert {c for _, _, c in todo} == set(parts["clusters"])
    torch.manual_seed(0)
    save_policy(tmp_path / "p", PlacementPolicy(PolicyConfig(hidden=16, layers=1)))
    # the smallest case of the split, at a small budget (the one-shot plan
    # within it: some 600 evaluations)
    graph = min(parts["graphs"], key=lambda n: len(datasets.graph(n)))
    result = learned.bench_learned([graph], parts["clusters"][:1], evaluations=1500,
                                   finetune=0.0, checkpoint=tmp_path / "p", samples=2,
                                   out=tmp_path / "ood.json", quiet=True)
    row = result["rows"][0]
    any_ = row["anytime"]
    assert any_["first_plan"]["model"] == "simulator"
    assert any_["first_plan"]["objective"] == pytest.approx(row["zero_shot"]["objective"])
    assert any_["evaluations"] <= 1500 and any_["step_time"] <= row["zero_shot"]["step_time"]
    with pytest.raises(Exception, match="unknown split"):
        learned.cases("dev")
    # a checkpoint's zero-shot against the saved run's evolution figures
    again = learned.zero_shot_against(tmp_path / "ood.json", tmp_path / "p")
    assert again["rows"][0]["step_time"] == row["zero_shot"]["step_time"]
    assert again["rows"][0]["vs_evolution"] == pytest.approx(row["zero_shot_vs_evolution"])
    assert again["summary"]["cases"] == 1


def test_cases_pick_by_pattern_and_pieces_merge_into_one_result(tmp_path, monkeypatch):
    """``--cases`` picks a split's cases by GRAPH@CLUSTER patterns (the split
    label kept); a run split into pieces merges into the result a whole run
    would have had (rows in order, summary and per-split summaries over all)."""
    import placer.bench.learned as learned
    from placer.cli import main
    from placer.errors import PlacerError
    picked = learned.cases("all", only=["experts-*@classes-d8-s0", "*@hetero-lab"])
    assert {s for s, _, _ in picked} == {"test", "ood"}
    assert all(c == "hetero-lab" or (g.startswith("experts-") and c == "classes-d8-s0")
               for _, g, c in picked)
    assert len(picked) == len(learned.TEST_GRAPHS) + 2
    with pytest.raises(PlacerError, match="no case of split 'ood' matches"):
        learned.cases("ood", only=["gpt*@*"])
    seen = {}
    monkeypatch.setattr(learned, "bench_learned", lambda **kw: seen.update(kw))
    assert main(["bench", "learned", "--split", "ood", "--cases", "rnn-*@*",
                 "-o", str(tmp_path / "x.json")]) == 0
    assert seen["only"] == ["rnn-*@*"] and seen["split"] == "ood"
    monkeypatch.undo()
    whole = json.loads(open("docs/bench/learned-all-5s.2026-12-05.json", encoding="utf-8").read())
    paths = []
    for part in ("test", "ood"):
        piece = dict(whole, rows=[r for r in whole["rows"] if r["split"] == part],
                     bench_seconds=1.5)
        paths.append(tmp_path / f"{part}.json")
        paths[-1].write_text(json.dumps(piece))
    merged = learned.merge(paths, tmp_path / "all.json")
    again = json.loads((tmp_path / "all.json").read_text())
    assert again["rows"] == whole["rows"] and merged["split"] == "all"
    assert again["bench_seconds"] == 3.0 and [p["cases"] for p in again["pieces"]] == [15, 12]
    for key in ("anytime_within_5pct_feasible", "zero_shot_within_10pct_feasible",
                "anytime_worst_feasible"):
        assert again["summary"][key] == whole["summary"][key]
        assert again["summary"]["by_split"]["ood"][key] == \
            whole["summary"]["by_split"]["ood"][key]
    bad = json.loads(paths[1].read_text())
    bad["time_budget"] = 10.0
    paths[1].write_text(json.dumps(bad))
    with pytest.raises(PlacerError, match="time_budget is 10.0"):
        learned.merge(paths)

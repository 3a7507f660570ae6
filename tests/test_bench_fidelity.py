"""``placer bench fidelity``: its measures of agreement, its plans, one
start of the ranks for several plans, and (slow) the quick bench."""

from __future__ import annotations

import itertools
import json
import random

import pytest

import placer
from placer.bench import fidelity
from placer.bench.fidelity import Model, agreement, kendall_tau, measure_plans, random_plans
from placer.search.base import microbatch_candidates

from runtime_helpers import one_thread  # noqa: F401


def _tau_brute(x, y):
    """Tau-b from its definition, by brute force over pairs."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    s = sum(sign(x[i] - x[j]) * sign(y[i] - y[j]) for i, j in pairs)
    n0 = len(pairs)
    n1 = sum(x[i] == x[j] for i, j in pairs)
    n2 = sum(y[i] == y[j] for i, j in pairs)
    return s / ((n0 - n1) * (n0 - n2)) ** 0.5


def test_kendall_tau_matches_its_definition():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    rng = random.Random(0)
    for _ in range(20):
        x = [rng.randint(0, 5) for _ in range(9)]
        y = [rng.randint(0, 5) for _ in range(9)]
        assert kendall_tau(x, y) == pytest.approx(_tau_brute(x, y))


def test_agreement_errors_and_regret():
    measured = [10.0, 20.0, 40.0, 80.0]
    predicted = [22.0, 18.0, 44.0, 80.0]      # ranks plan 1 best, which measured 20
    a = agreement(predicted, measured)
    assert a["regret"] == pytest.approx(2.0)
    assert a["ranked_best"] == 1
    assert a["median_abs_error"] == pytest.approx(0.1)     # errors 1.2, 0.1, 0.1, 0
    assert a["p90_abs_error"] == pytest.approx(0.1 + 0.7 * 1.1)
    assert a["kendall_tau"] == pytest.approx(2 / 3)
    # plans tied for the best prediction count by their median measured step
    tie = agreement([18.0, 18.0, 18.0, 80.0], [10.0, 20.0, 40.0, 80.0])
    assert tie["regret"] == pytest.approx(2.0) and tie["regret_first"] == pytest.approx(1.0)
    assert tie["tied_best"] == 3
    # a fit that went below zero still ties (and ranks) its best
    low = agreement([-1.0, 2.0, -1.0], [10.0, 20.0, 30.0])
    assert low["tied_best"] == 2 and low["regret"] == pytest.approx(2.0)


def test_random_plans_are_valid_mixed_and_follow_the_microbatch_rule():
    model = fidelity.MODELS["gnmt"]
    graph = placer.trace(*model.build())
    cluster = placer.Cluster.from_rules("two", [placer.Device(d, 1e12, 1e10) for d in ("r0", "r1")],
                                        default=(1e9, 1e-4))
    plans = random_plans(graph, ["r0", "r1"], 12, seed=3)
    assert len({json.dumps(p.to_dict(), sort_keys=True) for p in plans}) == 12
    kinds = {fidelity._op_level(graph, p) for p in plans}
    assert kinds == {True, False}          # op-level and pipelines
    assert any(any(len(v) == 2 for v in p.placement.values()) for p in plans)  # data-parallel
    for p in plans:
        p.validate(graph, cluster, check_fingerprints=False)
        assert p.microbatches in microbatch_candidates(graph)


def test_one_start_measures_several_plans_and_predicts_them(tmp_path):
    model = Model("gpt-125m", 4, 8)
    graph = placer.trace(*model.build())
    from placer.runtime.dist import reference_plan
    plans = [reference_plan(graph, ["r0", "r1"], 2),
             random_plans(graph, ["r0", "r1"], 2, seed=1)[1]]
    results = measure_plans(plans, model, steps=1, warmup=0, calibrate_first=True, bursts=2)
    assert [("error" in r) for r in results] == [False, False], results
    # each plan measured twice, in turn with the other; its step the faster burst
    assert all(r["step_time"] > 0 and len(r["step_times"]) == 2 for r in results)
    assert all(r["burst_medians"] == r["step_times"] for r in results)    # one step a burst
    assert all(r["step_time"] == min(r["burst_medians"]) for r in results)
    cal = results[0]["calibration"]
    assert "calibration" not in results[1]
    preds = fidelity.predictions(cal, plans)
    assert set(preds) == {"simulator", "analytical", "calibrated"}
    assert all(v > 0 for vs in preds.values() for v in vs)
    # the first plan's calibrated prediction is what the run reported
    assert preds["calibrated"][0] == pytest.approx(results[0]["predicted"], rel=1e-6)
    case = {"model": "gpt", "network": "loopback", "nproc": 2,
            "plans": [{"measured": r["step_time"], **{k: v[i] for k, v in preds.items()}}
                      for i, r in enumerate(results)],
            "metrics": {k: agreement(v, [r["step_time"] for r in results])
                        for k, v in preds.items()}}
    fidelity.plot_case(case, str(tmp_path / "scatter.png"))
    assert (tmp_path / "scatter.png").read_bytes()[:4] == b"\x89PNG"
    # kept raw, predicted again into a results file (repredict --results)
    measured = [r["step_time"] for r in results]
    raw = tmp_path / "gpt-loopback-2.json"
    raw.write_text(json.dumps({"calibration": json.loads(json.dumps(cal, default=_plain)),
                               "plans": [p.to_dict() for p in plans], "measured": measured,
                               "origins": ["reference", "random"]}))
    stale = {**case, "plans": [{**r, "calibrated": 1.0} for r in case["plans"]]}
    results = tmp_path / "fidelity.json"
    results.write_text(json.dumps({"cases": [stale], "summary": {}}))
    doc = fidelity.refresh(str(results), [str(raw)], log=lambda *_: None)
    again = doc["cases"][0]
    assert [r["calibrated"] for r in again["plans"]] == pytest.approx(preds["calibrated"])
    assert doc["summary"]["gpt/loopback/2"]["plans"] == 2 and "repredicted" in doc
    # with the fit the predictions were made on
    assert again["calibration"]["reference_compute_factor"] == pytest.approx(
        cal["reference_compute_factor"])
    assert json.loads(results.read_text())["cases"][0]["metrics"] == json.loads(
        json.dumps(again["metrics"]))
    assert (tmp_path / "fidelity-gpt-loopback.png").exists()
    bad = tmp_path / "other" / "gpt-loopback-2.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({**json.loads(raw.read_text()), "measured": [1.0, 2.0]}))
    with pytest.raises(placer.PlacerError, match="not those of case"):
        fidelity.refresh(str(results), [str(bad)])


def _plain(value):
    """JSON for a live calibration's objects (graph, cluster)."""
    return value.to_dict()


def test_plans_that_run_alike_are_one_plan():
    placement = {"a": ["r0"], "b": ["r1"]}
    key = fidelity._key
    assert key(placer.Plan(placement, 1, "gpipe")) == key(placer.Plan(dict(placement), 1))
    assert key(placer.Plan(placement, 2, "gpipe")) != key(placer.Plan(placement, 2, "1f1b"))
    assert key(placer.Plan(placement, 1)) != key(placer.Plan({**placement, "b": ["r0"]}, 1))


def test_the_references_are_taken_as_measured_plans():
    cal = {"reference_step": 0.040, "reference_messages_step": 0.080,
           "reference_compute": {"r0": 0.02, "r1": 0.02}, "op_overhead": 1e-5}
    pipeline = {"calibration": cal, "step_time": 0.034, "compute": {"r0": 0.015, "r1": 0.016}}
    out = fidelity.measured_references(pipeline, {"step_time": 0.07}, {"step_time": 0.021})
    assert (out["reference_step"], out["reference_messages_step"]) == (0.034, 0.07)
    assert out["reference_one_step"] == 0.021
    assert out["reference_compute"] == {"r0": 0.015, "r1": 0.016}
    assert (out["reference_step_beside"], out["reference_messages_step_beside"]) == (0.04, 0.08)
    assert out["reference_compute_beside"] == cal["reference_compute"]
    assert cal["reference_step"] == 0.040 and out["op_overhead"] == 1e-5   # a copy


def test_a_failing_plan_is_reported_and_the_rest_still_run():
    model = Model("gpt-125m", 4, 8)
    graph = placer.trace(*model.build())
    ok = placer.Plan({op: ["r0"] for op in graph.ids})
    bad = placer.Plan({op: ["r0"] for op in graph.ids}, microbatches=8)   # 8 > batch 4
    results = measure_plans([bad, ok], model, steps=1, warmup=0)
    assert "microbatches" in results[0]["error"]
    assert results[1]["step_time"] > 0


@pytest.mark.slow
def test_quick_bench_writes_results_and_scatters(tmp_path):
    out = tmp_path / "fidelity.json"
    doc = fidelity.bench_fidelity(str(out), quick=True)
    saved = json.loads(out.read_text())
    assert saved["summary"] == json.loads(json.dumps(doc["summary"]))
    case = saved["cases"][0]
    assert len(case["plans"]) >= 10 and not case["failed"]
    # every strategy's plan is measured, once where two strategies agree
    assert {"random", "heft", "m_etf"} <= {r["origin"] for r in case["plans"]} \
        | set(case["duplicates"])
    # the calibration's two plans are measured as the others are, not scored
    refs = case["references"]
    assert [r["origin"] for r in refs] == list(fidelity.CALIBRATING)
    assert not set(fidelity.CALIBRATING) & {r["origin"] for r in case["plans"]}
    assert case["calibration"]["reference_step"] == refs[0]["measured"] > 0
    assert case["calibration"]["reference_messages_step"] == refs[1]["measured"] > 0
    assert case["calibration"]["reference_one_step"] == refs[2]["measured"] > 0
    # the fit the predictions were made on is reported, not rank 0's first one
    fitted = case["calibration"]
    assert fitted["reference_compute_factor"] > 0
    assert refs[0]["beside"] > 0
    for name in ("simulator", "analytical", "calibrated"):
        m = case["metrics"][name]
        assert -1 <= m["kendall_tau"] <= 1 and m["regret"] >= 1
    assert (tmp_path / "fidelity-gnmt-loopback.png").exists()


def test_link_fits_survive_calibration_rounds_that_stopped_early():
    # on a loaded host a round may stop after its first size; sizes common
    # to every round then left one, fitted as an infinite bandwidth that the
    # calibrated cluster could not be loaded back with (the quick bench died)
    from placer.runtime.dist import link_fits
    full = {256: 1e-4, 16384: 1.2e-4, 262144: 1.1e-3}
    rounds = [{"points": {(0, 1): full}, "sync_delay": {(0, 1): 0.0}},
              {"points": {(0, 1): {256: 3e-4}}, "sync_delay": {(0, 1): 1e-5}}]
    link = link_fits(rounds)[(0, 1)]
    assert set(link["points"]) == set(full)
    assert link["points"][256] == pytest.approx(2e-4)       # median of both rounds
    assert link["bandwidth"] == pytest.approx((262144 - 16384) / (1.1e-3 - 1.2e-4))
    one = link_fits([{"points": {(0, 1): {256: 3e-4}}, "sync_delay": {(0, 1): 0.0}}])[(0, 1)]
    assert one["bandwidth"] == pytest.approx(256 / 3e-4)
    from placer.runtime.profile import ranks_cluster
    cluster = ranks_cluster(
        ["r0", "r1"], placer.Device("cpu", 1e11, 1e10), {"pairs": {(0, 1): one}})
    assert placer.Cluster.from_dict(cluster.to_dict()).bandwidth[0][1] == pytest.approx(
        256 / 3e-4)
    # a shaped link: t = 0.5 ms + max(0, n - 48 KB) / 24 MB/s at every size
    # over the bucket; a fast link (loopback) has none
    from placer.runtime.profile import fit_burst
    shaped = {n: 5e-4 + max(0, n - 49152) / 24e6 for n in (256, 16384, 262144, 1 << 20,
                                                           4 << 20)}
    assert fit_burst(shaped) == pytest.approx(49152)
    assert fit_burst({256: 3.3e-4, 16384: 6.6e-4, 262144: 6.5e-4, 1 << 20: 8.8e-4,
                      4 << 20: 3.2e-3}) == 0.0
    assert fit_burst({256: 3e-4, 16384: 1.2e-4}) == 0.0
    # a message between busy ranks may cost less than the blocking ping-pong
    # read (a negative synchronisation delay), never less than nothing
    for sync, want in ((-2e-4, 1e-4), (-5e-4, 0.0), (1e-4, 4e-4)):
        link = {**one, "latency": 3e-4, "sync_delay": sync}
        cluster = ranks_cluster(["r0", "r1"], placer.Device("cpu", 1e11, 1e10),
                                {"pairs": {(0, 1): link}})
        assert cluster.link("r0", "r1")[1] == pytest.approx(want)


def test_the_rank_that_failed_first_names_the_error(tmp_path):
    (tmp_path / "rank0.log").write_text(
        "fidelity-error: plan 3: RuntimeError: [pair.cc:553] Connection closed by peer\n")
    (tmp_path / "rank1.log").write_text(
        "noise\nfidelity-error: plan 3: RuntimeError: shape mismatch in piece 2\n")
    assert fidelity._failed_plan(str(tmp_path), 2) == (
        3, "plan 3: RuntimeError: shape mismatch in piece 2")
    (tmp_path / "rank1.log").write_text("killed\n")
    assert fidelity._failed_plan(str(tmp_path), 2)[0] == 3
    (tmp_path / "rank0.log").write_text("")
    assert fidelity._failed_plan(str(tmp_path), 2) is None


def test_rounds_merge_into_one_result_per_plan():
    first = [{"step_time": 0.02, "burst_medians": [0.02, 0.03], "step_times": [0.02, 0.03],
              "compute": {"r0": 1}, "calibration": {"x": 1}},
             {"step_time": 0.05, "burst_medians": [0.05], "step_times": [0.05]},
             {"step_time": 0.05, "burst_medians": [0.05], "step_times": [0.05]},
             {"error": "plan 3: broke"}]
    again = [{"step_time": 0.01, "burst_medians": [0.01], "step_times": [0.01],
              "compute": {"r0": 2}},
             {"step_time": 0.06, "burst_medians": [0.06], "step_times": [0.06]},
             {"error": "plan 2: broke later"},
             {"step_time": 0.01, "burst_medians": [0.01], "step_times": [0.01]}]
    out = fidelity.merge_rounds(first, again)
    assert out[0]["step_time"] == 0.01 and out[0]["compute"] == {"r0": 2}
    assert out[0]["burst_medians"] == [0.02, 0.03, 0.01] and out[0]["calibration"] == {"x": 1}
    assert out[1]["step_time"] == 0.05 and out[1]["burst_medians"] == [0.05, 0.06]
    assert out[2] == {"error": "plan 2: broke later"} and out[3] == {"error": "plan 3: broke"}


@pytest.mark.slow
def test_a_case_in_two_rounds_measures_every_plan_in_both():
    case = fidelity.run_case("gnmt", plans=6, steps=1, warmup=0, evaluations=20, evo_seeds=1,
                             bursts=2, rounds=2, log=lambda *_: None)
    assert case["rounds"] == 2 and not case["failed"] and len(case["plans"]) >= 6
    assert all(len(r["burst_medians"]) == 2 for r in case["plans"])
    assert all(r["measured"] == min(r["burst_medians"]) for r in case["plans"])
    refs = case["references"]
    # the references again in the strategies' starts: one burst more
    assert all(len(r["burst_medians"]) == 3 for r in refs)
    # ... counted as the plans' two (the expected smallest of two of three)
    for ref, key in ((refs[0], "reference_step"), (refs[2], "reference_one_step")):
        m = sorted(ref["burst_medians"])
        assert case["calibration"][key] == pytest.approx((2 * m[0] + m[1]) / 3)
        assert ref["measured"] == case["calibration"][key]


def test_the_smallest_of_k_bursts_is_expected_over_every_k_subset():
    values = [0.05, 0.01, 0.04, 0.02, 0.03]
    weights = fidelity.smallest_of(values, 3)
    subsets = list(itertools.combinations(values, 3))
    expected = sum(min(s) for s in subsets) / len(subsets)
    assert sum(w * v for w, v in zip(weights, values)) == pytest.approx(expected)
    assert sum(weights) == pytest.approx(1.0) and weights[0] == 0.0    # never the smallest of 3
    assert fidelity.smallest_of([0.2, 0.1], 3) == [0.0, 1.0]


def test_a_plan_measured_more_often_is_counted_as_often():
    bursts = [0.04, 0.01, 0.03, 0.02]
    result = {"step_time": 0.01, "burst_medians": bursts, "compute": {"r0": 1.0},
              "burst_parts": [{"compute": {"r0": 4 * b}, "comm": None} for b in bursts]}
    out = fidelity.as_counted(result, 2)
    # subsets of two: 6; the smallest 0.01 in 3, 0.02 in 2, 0.03 in 1
    assert out["step_time"] == pytest.approx((3 * 0.01 + 2 * 0.02 + 0.03) / 6)
    assert out["compute"]["r0"] == pytest.approx(4 * out["step_time"])
    assert "comm" not in out and result["step_time"] == 0.01
    assert fidelity.as_counted(result, 4) is result

"""Determinism across processes: every registered strategy, a short training
run, a simulation and ``placer plan`` give the same result whatever the
interpreter's hash seed (which reorders sets and dicts built from them).

One driver process per hash seed does everything (imports dominate the
time); searches are bounded by evaluations, never by time.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import placer

ROOT = Path(__file__).resolve().parents[1]
HASH_SEEDS = ("1", "12345")

DRIVER = textwrap.dedent("""
    import hashlib, io, json, sys, tempfile
    from pathlib import Path
    import torch
    import placer
    from placer.cli import main as cli

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    graph = placer.datasets.graph("layered-n80-w6-s1")
    cluster = placer.Cluster.preset("hetero-lab")
    out = {"fingerprints": [graph.fingerprint(), cluster.fingerprint()]}
    plans = {}
    for name in placer.strategies():
        plan = placer.optimize(graph, cluster, method=name, seed=7, time_budget=None,
                               evaluations=300)
        plans[name] = plan
        out["strategy:" + name] = {
            "placement": plan.placement, "microbatches": plan.microbatches,
            "schedule": plan.schedule, "step_time": repr(plan.predicted["step_time"]),
            "search": repr(plan.predicted.get("search", {}).get("step_time"))}

    def simulated(plan):
        report = placer.simulate(graph, cluster, plan)
        report.to_chrome_trace(tmp / "trace.json")
        return {"report": json.dumps(report.to_dict(), sort_keys=True),
                "trace": hashlib.sha256((tmp / "trace.json").read_bytes()).hexdigest()}
    out["simulate"] = {name: simulated(plans[name]) for name in ("evolution", "dtfm", "heft")}

    from gnn.train import TrainConfig, train
    cfg = TrainConfig(seed=3, iterations=4, problems=2, samples=4, max_units=16,
                      graphs=["layered-n80-w6-s1", "random_dag-n100-w4-s0"],
                      clusters=["a100x8", "two-sites"], val_every=0,
                      policy={"hidden": 16, "layers": 1})
    trainer = train(cfg, tmp / "policy", progress=False)
    digest = hashlib.sha256()
    for key, value in trainer.policy.state_dict().items():
        digest.update(key.encode() + value.numpy().tobytes())
    out["train"] = {"weights": digest.hexdigest(),
                    "log": [{k: v for k, v in row.items() if k != "seconds"}
                            for row in trainer.history]}

    assert cli(["plan", "layered-n80-w6-s1", "-c", "hetero-lab", "-m", "evolution",
                "--evaluations", "300", "--seed", "7", "-o", str(tmp / "plan.json"),
                "--no-plots", "--json"]) == 0
    plan_file = json.loads((tmp / "plan.json").read_text())
    out["cli-plan"] = {k: plan_file[k] for k in ("graph", "cluster", "method", "placement",
                                                 "microbatches", "schedule")}
    out["cli-plan"]["step_time"] = repr(plan_file["predicted"]["step_time"])
    print(json.dumps(out, sort_keys=True))
""")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The driver's output under each hash seed (run side by side)."""
    driver = tmp_path_factory.mktemp("det") / "driver.py"
    driver.write_text(DRIVER)
    procs = [subprocess.Popen([sys.executable, str(driver)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONHASHSEED": seed, "MPLBACKEND": "Agg"})
             for seed in HASH_SEEDS]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


def test_every_strategy_ran(results):
    for out in results:
        assert {k.split(":", 1)[1] for k in out if k.startswith("strategy:")} == \
            set(placer.strategies())


@pytest.mark.parametrize("key", [*(f"strategy:{n}" for n in placer.strategies()),
                                 "fingerprints", "simulate", "train", "cli-plan"])
def test_same_result_under_different_hash_seeds(results, key):
    a, b = results
    assert a[key] == b[key]
    assert a[key]                                     # something was compared

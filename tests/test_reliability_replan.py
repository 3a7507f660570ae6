"""Elastic re-planning: ``placer.replan`` and ``placer replan``."""

import json

import pytest

import placer
from placer import Cluster, Plan
from placer.cli import main
from placer.errors import PlanError
from placer.replan import moved_ops, repair_plan, replan

GRAPH = "layered-n60-w4-s0"


@pytest.fixture(scope="module")
def setup():
    graph = placer.datasets.graph(GRAPH)
    cluster = Cluster.preset("two-sites")
    # a plan that uses every device (the last stage data-parallel on two):
    # the loss of any one of them matters
    ids = [op.id for op in graph]
    names = cluster.names
    placement = {op: [names[i * 7 // len(ids)]] for i, op in enumerate(ids)}
    for op in ids[-5:]:
        placement[op] = [names[6], names[7]]
    plan = Plan(placement, 2, "1f1b", "manual").bind(graph, cluster)
    return graph, cluster, plan


def test_repair_keeps_surviving_ops_and_moves_lost_ones_near(setup):
    graph, cluster, plan = setup
    used = sorted(plan.devices_used())
    lost = used[1]
    fixed = repair_plan(plan, cluster, [lost])
    reduced = cluster.without([lost])
    fixed.validate(graph, reduced, check_fingerprints=False)
    for op, devs in plan.placement.items():
        if lost not in devs:
            assert fixed.placement[op] == devs          # untouched
        else:
            assert lost not in fixed.placement[op]
    # the lost device's ops went to one device of its own site (fastest link)
    targets = {fixed.placement[op][0] for op, d in plan.placement.items() if d == [lost]}
    assert len(targets) == 1
    assert cluster.device(targets.pop()).site == cluster.device(lost).site
    assert moved_ops(plan, fixed) == sum(lost in d for d in plan.placement.values())


@pytest.mark.parametrize("method", ["repair", "heft", "evolution"])
def test_replan_validates_on_reduced_cluster(setup, method):
    graph, cluster, plan = setup
    lost = sorted(plan.devices_used())[:2]
    new = replan(graph, cluster, plan, lost, method=method, time_budget=None,
                 evaluations=300)
    reduced = cluster.without(lost)
    new.validate(graph, reduced)                      # fingerprints bound to reduced
    assert not (set(lost) & new.devices_used())
    info = new.extra["replan"]
    assert info["without"] == lost and info["moved_ops"] >= 0
    # never worse than the minimal-move repair (within the tolerance)
    assert new.predicted["step_time"] <= info["repair_step_time"] * 1.0 + 1e-12


def test_replan_prefers_few_moves_when_search_gains_little(setup):
    graph, cluster, plan = setup
    lost = [sorted(plan.devices_used())[-1]]
    # a huge tolerance: the search's plan is never worth its moves
    new = replan(graph, cluster, plan, lost, method="heft", time_budget=None,
                 evaluations=100, tolerance=10.0)
    assert new.extra["replan"]["moved_ops"] == moved_ops(plan, repair_plan(plan, cluster, lost))


def test_replan_errors(setup):
    graph, cluster, plan = setup
    with pytest.raises(PlanError, match="unknown device 'nope'"):
        replan(graph, cluster, plan, ["nope"], method="repair")
    with pytest.raises(PlanError, match="every device"):
        replan(graph, cluster, plan, cluster.names, method="repair")
    other = Cluster.preset("two-sites").subset(cluster.names[:4])
    with pytest.raises(PlanError, match="another cluster"):
        replan(graph, other, plan, [cluster.names[0]], method="repair")


def test_cli_replan(tmp_path, setup, capsys):
    graph, cluster, plan = setup
    src = tmp_path / "p.json"
    plan.save(src)
    out = tmp_path / "r.json"
    lost = sorted(plan.devices_used())[0]
    rc = main(["replan", str(src), "--without", lost, "--graph", GRAPH, "--cluster",
               "two-sites", "-m", "evolution", "--evaluations", "300", "-o", str(out),
               "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"] == str(out) and data["without"] == [lost]
    new = Plan.load(out)
    new.validate(graph, cluster.without([lost]))
    assert lost not in new.devices_used()


@pytest.mark.parametrize("args, words", [
    (["--without", "zz"], "--without: unknown device 'zz'"),
    (["--without", "a0", "--cluster", "a100x8"], "plan was made for another cluster"),
    (["--without", "a0", "-m", "no-such-method"], "unknown strategy 'no-such-method'"),
])
def test_cli_replan_bad_input_one_line_exit_2(tmp_path, setup, capsys, args, words):
    graph, cluster, plan = setup
    src = tmp_path / "p.json"
    plan.save(src)
    base = ["replan", str(src), "--graph", GRAPH]
    if "--cluster" not in args:
        base += ["--cluster", "two-sites"]
    rc = main(base + args + ["-o", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.json").exists()

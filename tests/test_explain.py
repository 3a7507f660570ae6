import re

import placer
from placer import Cluster, Device, Edge, Graph, Op, Plan
from placer.cost import Problem, get_cost_model
from placer.explain import explain_infeasible


def activation_heavy():
    ops = [Op(f"l{i}", "linear", flops=1e10, param_bytes=1e8, output_bytes=2e9)
           for i in range(4)]
    return Graph("acts", ops, [Edge(f"l{i}", f"l{i + 1}", 2e9) for i in range(3)])


def test_names_device_and_a_remedy_that_really_fits():
    graph = activation_heavy()
    cluster = Cluster.from_rules("two", [Device("a", 1e14, 4e9), Device("b", 1e14, 4e9)],
                                 default=(1e10, 1e-5))
    plan = Plan({"l0": ["a"], "l1": ["a"], "l2": ["b"], "l3": ["b"]}, microbatches=1,
                schedule="gpipe")
    problem = Problem(graph, cluster)
    sim = get_cost_model("simulator")
    report = sim.estimate(problem, plan)
    assert not report.feasible
    lines = explain_infeasible(problem, plan, report)
    assert re.match(r"[ab] runs out of memory first: needs .* \(over by", lines[0])
    found = re.search(r"(\d+) microbatches with the 1f1b schedule", lines[1])
    assert found, lines
    fixed = Plan(plan.placement, int(found.group(1)), "1f1b")
    assert sim.estimate(problem, fixed).feasible
    # recomputation is offered exactly when it makes this placement fit
    helps = sim.estimate(Problem(graph, cluster, recompute=True), plan).feasible
    assert ("recompute=True" in lines[1]) == helps


def test_optimize_explains_a_cluster_too_small():
    graph = Graph("huge", [Op("w", "linear", flops=1e9, param_bytes=1e10)])
    cluster = Cluster.from_rules("tiny", [Device("d0", 1e12, 1e10), Device("d1", 1e12, 1e10)],
                                 default=(1e9, 1e-4))
    plan = placer.optimize(graph, cluster, method="single", time_budget=5)
    assert plan.predicted["feasible"] is False
    why = plan.predicted["infeasible"]
    assert why[0].startswith("d0 runs out of memory first") or why[0].startswith("d1 runs")
    assert "more devices" in why[1] and "more device(s)" in why[1]


def test_nothing_to_explain_when_it_fits(tiny_graph):
    cluster = Cluster.preset("a100x8")
    plan = Plan({op.id: ["gpu0"] for op in tiny_graph})
    problem = Problem(tiny_graph, cluster)
    assert explain_infeasible(problem, plan, get_cost_model("simulator").estimate(problem, plan)) == []

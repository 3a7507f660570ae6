"""``placer bench search --suite dtfm-paper``: placer's strategies on the
five scenarios of Yuan et al. (NeurIPS 2022) in two cost models side by
side.

The problem is the paper's: GPT-style 1.3B (``gpt-1.3b.module``, its traced
batch of 8 x 1024 tokens scaled 122 times to 999,424 tokens, the paper's
488 x 2048) on the five 64-device presets ``dtfm-*``. Every strategy
searches twice:

- under placer's own models (the analytical model screens, the event
  simulator ranks and scores the result, as ``placer.optimize`` does);
- under ``dtfm-paper`` (:mod:`placer.cost.dtfm_paper` with the paper's
  sizes and its 8 x 8 shape: 8 stages of 8 replicas on all 64 devices), the
  model DT-FM's own scheduler optimises; ``dtfm`` is then restricted to
  that shape (``shapes=[(8, 8)]``, ``uniform=True``) and scores every
  candidate with it.

Each plan is scored in both models (one found under ``dtfm-paper``, which
has no microbatches, is simulated at its best microbatch count and
schedule), and, as ``placer.optimize`` does, at its best all-reduce bucket
size (:func:`placer.search.buckets.choose_buckets`). References per
scenario: the rank-order 8 x 8 plan (the even allocation; in the simulator
at its best microbatch count, schedule and bucket size), its ``dtfm-paper``
cost, and the same allocation with the devices in a random order.
"""

from __future__ import annotations

import json
import math
import platform
import time
from typing import Sequence

from .._io import atomic_write_text

SCENARIOS = ("worldwide", "regional", "multi-universities", "datacenter-spot",
             "datacenter-ondemand")
STRATEGIES = ("even_pipeline", "pipeline_dp", "dtfm", "evolution")
GRAPH = "gpt-1.3b.module.x122"
#: options of ``dtfm`` when it searches under the paper's model
PAPER_DTFM = {"shapes": [(8, 8)], "uniform": True, "screen": None, "final": None,
              "seeds": ("even_pipeline",)}


def paper_model():
    """``dtfm-paper`` as the benchmark uses it: the paper's sizes and shape."""
    from ..cost import get_cost_model
    return get_cost_model("dtfm-paper", sizes="paper", shape=(8, 8))


def best_setting(problem, plan, choices: Sequence[int], replicas: int = 8):
    """``(report, microbatches, schedule)``: the simulator's best of ``plan``
    over microbatch counts ``choices`` (at least one row per replica) and
    both schedules (the paper's model has no microbatches, so a plan found
    under it is simulated at its best)."""
    from ..cost import get_cost_model
    sim = get_cost_model("simulator")
    batch = problem.graph.meta.get("batch", max(choices))
    best = None
    for m in choices:
        if m > 1 and m * replicas > batch:
            continue
        for schedule in ("1f1b", "gpipe"):
            r = sim.estimate(problem, _with(plan, m, schedule))
            key = (not r.feasible, r.step_time)
            if best is None or key < best[0]:
                best = (key, r, m, schedule)
    return best[1:]


def _with(plan, m: int, schedule: str):
    from ..plan import Plan
    return Plan(dict(plan.placement), m, schedule, plan.method, allreduce=plan.allreduce)


def reference(problem, choices: Sequence[int]) -> dict:
    """The rank-order 8 x 8 plan: its paper cost and its best simulated step
    over microbatch counts ``choices`` and both schedules."""
    import numpy as np

    from ..space import even_allocation
    from ..cost import get_cost_model
    from ..search.buckets import choose_buckets
    plan = even_allocation(problem, 8, 8)
    r, m, schedule = best_setting(problem, plan, choices)
    tuned, tr = choose_buckets(problem, _with(plan, m, schedule), get_cost_model("simulator"), r)
    # the same allocation with devices in a random order (seed 0)
    order = np.random.default_rng(0).permutation(problem.n_devices).tolist()
    shuffled = even_allocation(problem, 8, 8, order=order)
    rr, rm, rs = best_setting(problem, shuffled, choices)
    _, rr = choose_buckets(problem, _with(shuffled, rm, rs), get_cost_model("simulator"), rr)
    return {"sim_step_time": tr.step_time, "sim_feasible": bool(tr.feasible),
            "microbatches": m, "schedule": schedule, "allreduce": tuned.allreduce,
            "sim_step_time_default_buckets": r.step_time,
            "paper_cost": paper_model().estimate(problem, plan).step_time,
            "random_order_sim_step_time": rr.step_time, "random_order_microbatches": rm,
            "random_order_paper_cost": paper_model().estimate(problem, shuffled).step_time}


def run_scenario(scenario: str, strategies: Sequence[str], seconds: float, seed: int = 0,
                 log=print) -> dict:
    """Every strategy under both models on one scenario; its results row."""
    from ..cost import Problem, get_cost_model
    from ..search import get_strategy
    from ..search.buckets import choose_buckets
    from ..search.runner import optimize_with_report
    from .search_evolution import load_case
    graph, cluster = load_case(f"{GRAPH}@dtfm-{scenario}")
    problem = Problem(graph, cluster)
    sim, paper = get_cost_model("simulator"), paper_model()
    choices = get_strategy("even_pipeline").microbatch_choices(problem)
    ref = reference(problem, choices)
    log(f"{scenario:20s} rank-order 8x8: sim {ref['sim_step_time']:.2f} s at "
        f"m={ref['microbatches']} {ref['schedule']}, paper {ref['paper_cost']:.2f} s")
    rows = []
    for under in ("simulator", "dtfm-paper"):
        for name in strategies:
            options: dict = {}
            kwargs: dict = {}
            if under == "dtfm-paper":
                kwargs = {"cost_model": paper, "final_cost_model": paper}
                if name == "dtfm":
                    options = dict(PAPER_DTFM)
            start = time.perf_counter()
            plan, _ = optimize_with_report(graph, cluster, name, seed, seconds, **kwargs,
                                           **options)
            wall = time.perf_counter() - start
            p = paper.estimate(problem, plan)
            if under == "dtfm-paper":
                s, m, schedule = best_setting(problem, plan, choices)
                plan, s = choose_buckets(problem, _with(plan, m, schedule), sim, s)
            else:
                s = sim.estimate(problem, plan)
            row = {"scenario": scenario, "strategy": name, "searched_under": under,
                   "sim_step_time": s.step_time, "sim_feasible": bool(s.feasible),
                   "paper_cost": p.step_time, "paper_layout": bool(p.feasible),
                   "microbatches": plan.microbatches, "schedule": plan.schedule,
                   "allreduce": plan.allreduce, "devices_used": len(plan.devices_used()),
                   "seconds": wall}
            rows.append(row)
            log(f"{scenario:20s} {name:14s} under {under:11s} sim {s.step_time:8.2f} s "
                f"{'ok ' if s.feasible else 'OOM'} paper {p.step_time:8.2f} s "
                f"{'8x8' if p.feasible else '---'} m={plan.microbatches} {wall:5.1f} s")
    return {"scenario": scenario, "reference_8x8": ref, "rows": rows}


def table(results: list[dict]) -> str:
    """A Markdown table: per scenario and strategy, the simulated step (s)
    and paper cost (s) of the plan found under each model."""
    lines = ["| scenario | strategy | searched under simulator: sim / paper | "
             "searched under dtfm-paper: sim / paper |", "| --- | --- | --- | --- |"]

    def cell(r):
        if r is None:
            return "-"
        sim = f"{r['sim_step_time']:.2f}" + ("" if r["sim_feasible"] else " (OOM)")
        paper = f"{r['paper_cost']:.2f}" + ("" if r["paper_layout"] else " (not 8x8)")
        return f"{sim} / {paper}"
    for res in results:
        ref = res["reference_8x8"]
        lines.append(f"| {res['scenario']} | rank-order 8x8 | {ref['sim_step_time']:.2f} "
                     f"(m={ref['microbatches']}) / {ref['paper_cost']:.2f} | |")
        names = list(dict.fromkeys(r["strategy"] for r in res["rows"]))
        for name in names:
            by = {r["searched_under"]: r for r in res["rows"] if r["strategy"] == name}
            lines.append(f"| {res['scenario']} | {name} | {cell(by.get('simulator'))} | "
                         f"{cell(by.get('dtfm-paper'))} |")
    return "\n".join(lines)


def bench_dtfm_paper(out: str = "bench-dtfm-paper.json", seconds: float = 60.0,
                     scenarios: Sequence[str] = SCENARIOS,
                     strategies: Sequence[str] = STRATEGIES, seed: int = 0,
                     log=print) -> dict:
    """Run the suite; writes ``out`` (JSON, atomically) and prints the table."""
    from ..cost.warmup import warm_up
    warm_up()
    results = [run_scenario(s, strategies, seconds, seed, log) for s in scenarios]
    doc = {"suite": "dtfm-paper", "graph": GRAPH, "seconds_per_strategy": seconds,
           "seed": seed, "machine": platform.platform(), "results": results}
    atomic_write_text(out, json.dumps(doc, indent=2, default=_clean) + "\n")
    log(table(results))
    return doc


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


__all__ = ["PAPER_DTFM", "SCENARIOS", "STRATEGIES", "bench_dtfm_paper", "paper_model",
           "reference", "run_scenario", "table"]

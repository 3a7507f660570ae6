"""``placer bench learned``: the learned policy against evolution.

On the test split (model families and cluster scenarios never seen in
training) it runs, per graph x cluster case, through :func:`placer.optimize`
(analytical model in the search, the event simulator for the figures):

- ``greedy``: ``method="rl"`` decoding only the most likely placement (no
  baselines, no re-ranking: the policy alone);
- ``policy``: ``rl`` with greedy plus ``samples`` sampled placements and
  refinement rounds, without the baseline plans (the policy alone);
- ``zero-shot``: ``rl`` as shipped (the above plus the simple baseline plans
  as candidates and refinement from the best), no fine-tuning; its plan's
  ``source`` says which won (policy, refined, polished or baseline);
- ``fine-tuned``: ``rl`` after ``finetune`` seconds of REINFORCE on the case;
- ``anytime``: ``rl`` with the same budget as evolution, searching on from
  its first plan until the budget ends (``first_plan_seconds``: when it
  reported that plan, the zero-shot figure of the run);
- ``evolution`` and ``hybrid`` (the policy's plans, then evolution)
  at the same ``time_budget`` (or, with ``evaluations``, the same number of
  plans scored: deterministic, free of the machine's noise), for each of
  ``seeds``.

Each row has the simulated step time, feasibility and planning seconds
(``plan_seconds``: the search's own wall time, from the start of the
strategy to its final plan, without building the problem or the final
simulation, alike for every method); for evolution and hybrid also the trace
of the best objective over time (with the cost model of each figure and the
evaluations spent by then), evolution's screening model and how many times
it gave the simulator up for the analytical model mid-search
(``screen_fallbacks``, from ``plan.extra["search"]``; None for methods
that do not screen).

Cases: ``split="test"`` (the default) the test split's graphs on
:data:`TEST_CLUSTERS`; ``"ood"`` the out-of-family split
(:func:`placer.datasets.ood`: graph families and cluster shapes no part of
training draws from); ``"all"`` both, one after the other (each row says
its ``split``; the summary has each split's figures under ``by_split``).

Zero-shot runs :data:`ZERO_SHOT_RUNS` times per case (the same plan each
time; ``deterministic`` says so): its ``plan_seconds`` is their median
(``plan_seconds_runs``: each).

Time to produce: zero-shot's ``plan_seconds`` against both evolution's
``plan_seconds`` (its whole search; it stops after ``patience`` stale
generations) and, stricter, ``evolution_time_to_final``: the elapsed time of
the first progress event whose best objective is already evolution's final
one (``planning_speedup`` and ``speedup_vs_time_to_final``). The summary
gives the targets: zero-shot step time within 10% of evolution's and at least
100x faster to produce; hybrid reaching evolution's final objective in at
most half of evolution's time to it, or no worse at equal budget (by the
final model's objective: feasibility first, then step time).

Time to reach compares like with like: each progress event names the cost
model its best objective is of (evolution may screen with the simulator
and report the analytical model's figure at the end; hybrid reports its
policy's best by the search model), and is compared with evolution's
final plan's objective *by that model* (``search_objective`` for the
search model, ``objective`` for the final one). Under an evaluation budget
it is counted in evaluations (``*_evaluations_to_*``), which decide the
half-time target there.

With several ``seeds`` the rows' figures are those of the first; each row's
``seeds`` list holds evolution's and hybrid's figures for every seed and the
row and the summary give per-case medians and counts of seeds where hybrid
meets the target (one time-budgeted run decides little on a loaded machine:
evolution varies ~10% from run to run); ``zero_shot_vs_evolution_median``
compares zero-shot with the median of evolution's seeds (the summary's
``*_of_median_*`` and ``*_median_gmean_*`` figures). Summary: ``hybrid_half``,
``hybrid_no_worse`` and ``hybrid_target_met`` (either) count cases at the
first seed; ``cases_hybrid_*_majority`` cases meeting them on more than
half the seeds; ``hybrid_vs_evolution_median_gmean`` the geometric mean
over cases of the median step-time ratio.
"""

from __future__ import annotations

import platform
import time
from typing import Sequence

import numpy as np

from .._io import PathLike, atomic_write_text, dump_json

__all__ = ["bench_learned", "cases", "merge", "zero_shot_against", "TEST_GRAPHS", "TEST_CLUSTERS",
           "SPLITS"]

TEST_GRAPHS = ("inception.op", "unet.op", "dlrm.op", "moe.op", "gnmt.op")
TEST_CLUSTERS = ("hetero-lab", "edge-wireless", "dtfm-worldwide")
#: what ``split`` may name
SPLITS = ("test", "ood", "all")
QUICK = {"graphs": ("unet.op", "inception.module"), "clusters": ("hetero-lab", "edge-wireless"),
         "time_budget": 5.0, "finetune": 2.0}


def _run(graph, cluster, method, seed, time_budget, **options):
    """One search through :func:`placer.optimize`: its figures and progress
    trace (``trace``: ``[elapsed, best]``; ``trace_models``: the cost model
    of each ``best``; ``trace_evaluations``: plans scored by then)."""
    from ..search import optimize
    trace: list[tuple[float, float]] = []
    models: list[str | None] = []
    evals: list[int] = []
    first: list[dict] = []

    def progress(event):
        if np.isfinite(event.best):
            trace.append((float(event.elapsed), float(event.best)))
            models.append((event.extra or {}).get("model"))
            evals.append(int(event.evaluations))
        if event.message == "first plan" and not first:
            first.append({"seconds": float(event.elapsed), "objective": float(event.best),
                          "model": (event.extra or {}).get("model")})

    start = time.perf_counter()
    plan = optimize(graph, cluster, method, seed=seed, time_budget=time_budget,
                    progress=progress, **options)
    total = time.perf_counter() - start
    search = plan.predicted.get("search", {})
    info = (plan.extra or {}).get("search") or {}
    return {"step_time": plan.predicted.get("step_time"),
            "feasible": plan.predicted.get("feasible"),
            "objective": plan.predicted.get("objective"),
            "model": plan.predicted.get("model"),
            "search_objective": search.get("objective", search.get("step_time")),
            "search_model": search.get("model"),
            "evaluations": search.get("evaluations"),
            "plan_seconds": search.get("search_seconds", total),
            "total_seconds": total, "microbatches": plan.microbatches,
            "schedule": plan.schedule, "devices_used": len(plan.devices_used()),
            "source": (plan.extra or {}).get("source"),
            "screen": info.get("screen") if isinstance(info, dict) else None,
            "origin": info.get("origin") if isinstance(info, dict) else None,
            "screen_fallbacks": info.get("screen_fallbacks") if isinstance(info, dict)
            else None,
            "trace": trace, "trace_models": models, "trace_evaluations": evals,
            "first_plan": first[0] if first else None}


#: zero-shot planning runs per case: deterministic (the same plan each
#: time), so its planning time is their median (``plan_seconds_runs`` keeps
#: each); one run of ~50 ms moved 2x with the machine's load
ZERO_SHOT_RUNS = 3


def _repeat(runs: int, graph, cluster, method, seed, time_budget, **options) -> dict:
    """:func:`_run` ``runs`` times (a deterministic search, ``time_budget``
    None), after a garbage collection each: the first run's figures with
    ``plan_seconds`` the median and ``plan_seconds_runs`` every run's."""
    import gc
    out = []
    for _ in range(max(int(runs), 1)):
        gc.collect()
        out.append(_run(graph, cluster, method, seed, time_budget, **options))
    first = dict(out[0])
    first["plan_seconds_runs"] = [r["plan_seconds"] for r in out]
    first["plan_seconds"] = float(np.median(first["plan_seconds_runs"]))
    first["deterministic"] = all(r["step_time"] == first["step_time"] for r in out)
    return first


def _warm_up(graph: str, cluster: str, checkpoint, have_evolution: bool) -> None:
    """Load the policy and import every strategy once, untimed, so that the
    first case does not pay one-off costs the others do not."""
    import placer
    g, c = placer.datasets.graph(graph), placer.datasets.cluster(cluster)
    _run(g, c, "rl", 0, None, samples=0, refine=0, checkpoint=checkpoint)
    if have_evolution:
        _run(g, c, "evolution", 0, 0.5)


def _targets(evo: dict) -> dict:
    """``{cost model: objective of evolution's final plan by it}``."""
    out = {}
    if evo.get("search_objective") is not None:
        out[evo.get("search_model") or "analytical"] = evo["search_objective"]
    if evo.get("objective") is not None:
        out[evo.get("model") or "simulator"] = evo["objective"]
    return out


def _tolerance(evo: dict) -> float:
    """How close counts as equal to evolution's figures: a billionth of its
    step time (an infeasible plan's objective adds a penalty in the
    billions, against which a relative tolerance would hide seconds)."""
    scale = evo.get("step_time") or evo.get("objective") or 0.0
    return 1e-9 * abs(scale)


def _time_to_reach(run: dict, targets: dict, axis: str = "time",
                   tol: float = 0.0) -> float | None:
    """When ``run``'s trace first reaches ``targets`` (``{model: objective}``)
    within ``tol``: each event is compared with the target of the model its
    best is of (events without one are taken as the search model's); the
    elapsed seconds (``axis="time"``) or the evaluations by then
    (``axis="evaluations"``); None if never."""
    models = run.get("trace_models") or [None] * len(run["trace"])
    evals = run.get("trace_evaluations") or [None] * len(run["trace"])
    default = run.get("search_model") or "analytical"
    for (elapsed, best), model, used in zip(run["trace"], models, evals):
        target = targets.get(model or default)
        if target is not None and best <= target + tol:
            return elapsed if axis == "time" else used
    return None


def _compare(evo: dict, hyb: dict, axis: str) -> dict:
    """Hybrid against evolution on one case and seed: the time (or
    evaluations) each takes to reach evolution's final plan, the ratios of
    their final step times and objectives, and the targets met."""
    targets, tol = _targets(evo), _tolerance(evo)
    reach_e = _time_to_reach(evo, targets, axis, tol)
    reach_h = _time_to_reach(hyb, targets, axis, tol)
    half = reach_e is not None and reach_h is not None and reach_h <= 0.5 * max(reach_e, 1e-9)
    eo, ho = evo.get("objective"), hyb.get("objective")
    no_worse = eo is not None and ho is not None and ho <= eo + tol
    return {"evolution_to_final": reach_e, "hybrid_to_evolution": reach_h,
            "hybrid_vs_evolution": hyb["step_time"] / evo["step_time"],
            "hybrid_vs_evolution_objective": None if not (eo and ho) else ho / eo,
            "half": bool(half), "no_worse": bool(no_worse), "target_met": bool(half or no_worse)}


def cases(split: str = "test", graphs: Sequence[str] | None = None,
          clusters: Sequence[str] | None = None,
          only: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    """``(split, graph, cluster)`` of each case: ``graphs`` x ``clusters``
    where given (split ``"custom"``), else the split's own (see the module
    doc); ``only``: just the cases whose ``GRAPH@CLUSTER`` matches one of
    these shell patterns (a long run split into pieces, one case rerun).

    >>> cases("ood")[0][0], len(cases("all")) == len(cases("test")) + len(cases("ood"))
    ('ood', True)
    >>> [g for _, g, _ in cases("ood", only=["rnn-*@classes-d8-s0"])]
    ['rnn-t32-l4-s0']
    """
    out = _cases(split, graphs, clusters)
    if only is None:
        return out
    from fnmatch import fnmatchcase
    from ..errors import PlacerError
    out = [c for c in out if any(fnmatchcase(f"{c[1]}@{c[2]}", p) for p in only)]
    if not out:
        raise PlacerError(f"no case of split {split!r} matches {' '.join(only)}",
                          field="cases", fix="give GRAPH@CLUSTER patterns such as "
                          "'experts-*@classes-d8-s0' or '*@hetero-lab'")
    return out


def _cases(split, graphs, clusters) -> list[tuple[str, str, str]]:
    from ..errors import PlacerError
    if split not in SPLITS:
        raise PlacerError(f"unknown split {split!r}", field="split",
                          fix=f"use one of: {', '.join(SPLITS)}")
    if graphs or clusters:
        return [("custom", g, c) for g in graphs or TEST_GRAPHS
                for c in clusters or TEST_CLUSTERS]
    out = []
    if split in ("test", "all"):
        out += [("test", g, c) for g in TEST_GRAPHS for c in TEST_CLUSTERS]
    if split in ("ood", "all"):
        from .. import datasets
        parts = datasets.ood()
        out += [("ood", g, c) for g in parts["graphs"] for c in parts["clusters"]]
    return out


def bench_learned(graphs: Sequence[str] | None = None, clusters: Sequence[str] | None = None,
                  *, time_budget: float = 20.0, finetune: float = 5.0, seed: int = 0,
                  seeds: Sequence[int] | None = None, evaluations: int | None = None,
                  checkpoint=None, samples: int | None = None, quick: bool = False,
                  split: str = "test", only: Sequence[str] | None = None,
                  out: PathLike | None = "bench-learned.json", quiet: bool = False) -> dict:
    """Run the benchmark (see the module doc); prints a table unless
    ``quiet`` and writes the JSON results to ``out`` atomically. ``samples``
    (None: the strategies' defaults) is passed to ``rl`` and ``hybrid``.
    ``seeds`` (default ``[seed]``): evolution and hybrid run once per seed,
    the other methods with the first; ``evaluations``: evolution, hybrid
    and anytime ``rl`` get this many plans scored instead of
    ``time_budget`` seconds. ``split``: which cases (see :func:`cases`;
    ``graphs`` and ``clusters`` replace them; ``only`` picks among them by
    ``GRAPH@CLUSTER`` patterns; :func:`merge` joins the pieces' files)."""
    from ..errors import PlacerError
    seeds = [int(seed)] if seeds is None else [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise PlacerError(f"seeds must be distinct and at least one, got {seeds!r}",
                          field="seeds", fix="give distinct seeds, e.g. --seeds 0 1 2")
    if evaluations is not None and (int(evaluations) != evaluations or evaluations < 1):
        raise PlacerError(f"evaluations must be a whole number >= 1, got {evaluations!r}",
                          field="evaluations", fix="give a positive count, e.g. 4000")
    seed = seeds[0]
    from ..cost.warmup import warm_up
    warm_up()      # compiled kernels load before any timed search
    import placer
    from ..search import strategies
    if quick:
        graphs = graphs or QUICK["graphs"]
        clusters = clusters or QUICK["clusters"]
        time_budget, finetune = QUICK["time_budget"], QUICK["finetune"]
    todo = cases(split, graphs, clusters, only)
    graphs = list(dict.fromkeys(g for _, g, _ in todo))
    clusters = list(dict.fromkeys(c for _, _, c in todo))
    have_evolution = "evolution" in strategies()
    # evolution and hybrid: the same seconds, or the same plans scored
    search_budget = None if evaluations is not None else time_budget
    search_limit = {} if evaluations is None else {"evaluations": int(evaluations)}
    axis = "time" if evaluations is None else "evaluations"
    learned = {"checkpoint": None if checkpoint is None else str(checkpoint)}
    if samples is not None:   # else each learned strategy's own default
        learned["samples"] = samples
    rows = []
    start = time.perf_counter()
    _warm_up(graphs[0], clusters[0], learned["checkpoint"], have_evolution)
    loaded: dict = {}
    for part, gname, cname in todo:
        if gname not in loaded:
            loaded = {gname: placer.datasets.graph(gname)}
        graph = loaded[gname]
        cluster = placer.datasets.cluster(cname)
        row = {"split": part, "graph": gname, "ops": len(graph), "cluster": cname,
               "devices": len(cluster)}
        # zero-shot planning is not bounded by the time budget: it is its own figure
        row["greedy"] = _run(graph, cluster, "rl", seed, None, samples=0, refine=0,
                             baselines=False, final=None, polish=0,
                             checkpoint=learned["checkpoint"])
        row["policy"] = _run(graph, cluster, "rl", seed, None, baselines=False,
                             polish=0, **learned)
        row["zero_shot"] = _repeat(ZERO_SHOT_RUNS, graph, cluster, "rl", seed, None,
                                   **learned)
        row["fine_tuned"] = _run(graph, cluster, "rl", seed, None, finetune=finetune,
                                 **learned)
        # rl searching on from its first plan, with evolution's budget
        row["anytime"] = _run(graph, cluster, "rl", seed, search_budget, **search_limit,
                              **learned)
        if have_evolution:
            per_seed = []
            for s in seeds:
                evo = _run(graph, cluster, "evolution", s, search_budget, **search_limit)
                hyb = _run(graph, cluster, "hybrid", s, search_budget, **search_limit,
                           **learned)
                cmp = _compare(evo, hyb, axis)
                if s == seed:
                    row["evolution"], row["hybrid"] = evo, hyb
                    targets, tol = _targets(evo), _tolerance(evo)
                    row["evolution_time_to_final"] = _time_to_reach(evo, targets, "time",
                                                                    tol)
                    row["hybrid_time_to_evolution"] = _time_to_reach(hyb, targets, "time",
                                                                     tol)
                    row["evolution_evaluations_to_final"] = _time_to_reach(
                        evo, targets, "evaluations", tol)
                    row["hybrid_evaluations_to_evolution"] = _time_to_reach(
                        hyb, targets, "evaluations", tol)
                    for key in ("half", "no_worse", "target_met"):
                        row[f"hybrid_{key}"] = cmp[key]
                per_seed.append({"seed": s, **cmp, **{
                    name: {k: run[k] for k in SEED_KEYS}
                    for name, run in (("evolution", evo), ("hybrid", hyb))}})
            _compare_rows(row, per_seed)
        rows.append(row)
        if not quiet:
            print(_line(row), flush=True)
    summary = _summaries(rows) if have_evolution else \
        {"note": "evolution strategy unavailable"}
    result = {"benchmark": "learned", "split": split, "only": None if only is None
              else list(only), "time_budget": time_budget,
              "finetune": finetune,
              "samples": samples, "evaluations": evaluations,
              "budget": "time" if evaluations is None else "evaluations",
              "seed": seed, "seeds": seeds, "graphs": graphs, "clusters": clusters,
              "machine": {"python": platform.python_version(), "cpu": platform.processor()
                          or platform.machine()},
              "rows": rows, "summary": summary,
              "bench_seconds": round(time.perf_counter() - start, 1)}
    if not quiet:
        print(_table(rows, axis))
        for k, v in summary.items():
            print(f"{k}: {v}")
    if out is not None:
        atomic_write_text(out, dump_json(_clean(result)))
    return result


def _compare_rows(row: dict, per_seed: list) -> None:
    """Fill ``row`` (one case of :func:`bench_learned`, its runs done) with
    the per-seed lists and the ratios against evolution's first seed."""
    row["seeds"] = per_seed
    row["hybrid_vs_evolution_median"] = float(np.median(
        [r["hybrid_vs_evolution"] for r in per_seed]))
    row["hybrid_vs_evolution_objective_median"] = _median(
        [r["hybrid_vs_evolution_objective"] for r in per_seed])
    for key in ("half", "no_worse", "target_met"):
        row[f"hybrid_{key}_seeds"] = int(sum(r[key] for r in per_seed))
    evo, hyb = row["evolution"], row["hybrid"]
    z = row["zero_shot"]
    row["zero_shot_vs_evolution"] = z["step_time"] / evo["step_time"]
    row["anytime_vs_evolution"] = row["anytime"]["step_time"] / evo["step_time"]
    first = row["anytime"]["first_plan"] or {}
    row["first_plan_speedup"] = None if first.get("seconds") is None else \
        evo["plan_seconds"] / max(first["seconds"], 1e-9)
    # evolution's result varies from seed to seed (a lucky run of
    # one seed is ~8% below the others on dlrm@hetero-lab)
    evo_steps = [r["evolution"]["step_time"] for r in per_seed]
    row["evolution_step_time_median"] = float(np.median(evo_steps))
    row["zero_shot_vs_evolution_median"] = \
        z["step_time"] / row["evolution_step_time_median"]
    row["hybrid_vs_evolution"] = hyb["step_time"] / evo["step_time"]
    row["fine_tuned_vs_evolution"] = row["fine_tuned"]["step_time"] / evo["step_time"]
    row["policy_vs_evolution"] = row["policy"]["step_time"] / evo["step_time"]
    row["planning_speedup"] = evo["plan_seconds"] / max(z["plan_seconds"], 1e-9)
    reach = row["evolution_time_to_final"]
    row["speedup_vs_time_to_final"] = None if reach is None \
        else reach / max(z["plan_seconds"], 1e-9)
    row["greedy_vs_evolution"] = row["greedy"]["step_time"] / evo["step_time"]
    row["greedy_planning_speedup"] = evo["plan_seconds"] / max(
        row["greedy"]["plan_seconds"], 1e-9)


def _summaries(rows) -> dict:
    """:func:`_summary` of ``rows``, with each split's under ``by_split``
    when they hold several."""
    summary = _summary(rows)
    parts = sorted({r["split"] for r in rows})
    if len(parts) > 1:
        summary["by_split"] = {p: _summary([r for r in rows if r["split"] == p])
                               for p in parts}
    return summary


def merge(paths: Sequence[PathLike], out: PathLike | None = None) -> dict:
    """One result from the files of a run split into pieces (``only``, or
    ``split`` run by split): their rows in order, the summary over all of
    them, ``bench_seconds`` summed and ``pieces`` (each file's name, cases
    and seconds); written to ``out`` atomically when given. The pieces must
    share their budgets and seeds (else :class:`placer.errors.PlacerError`
    names the first that differs)."""
    import json
    from pathlib import Path
    from ..errors import PlacerError
    docs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    if not docs:
        raise PlacerError("nothing to merge", field="paths", fix="give the pieces' files")
    same = ("time_budget", "finetune", "samples", "evaluations", "seeds")
    for path, doc in zip(paths, docs):
        for key in same:
            if doc.get(key) != docs[0].get(key):
                raise PlacerError(f"{key} is {doc.get(key)!r}, the first piece's "
                                  f"{docs[0].get(key)!r}", file=str(path), field=key,
                                  fix="merge pieces run with the same options")
    rows = [r for doc in docs for r in doc["rows"]]
    splits = sorted({r["split"] for r in rows})
    result = dict(docs[0], split=splits[0] if len(splits) == 1 else "all", only=None,
                  graphs=list(dict.fromkeys(r["graph"] for r in rows)),
                  clusters=list(dict.fromkeys(r["cluster"] for r in rows)), rows=rows,
                  summary=_summaries(rows) if all("evolution" in r for r in rows)
                  else {"note": "evolution strategy unavailable"},
                  bench_seconds=round(sum(d.get("bench_seconds") or 0 for d in docs), 1),
                  pieces=[{"file": Path(p).name, "cases": len(d["rows"]),
                           "bench_seconds": d.get("bench_seconds")}
                          for p, d in zip(paths, docs)])
    if out is not None:
        atomic_write_text(out, dump_json(_clean(result)))
    return result


#: per-seed figures kept for evolution and hybrid (the first seed's row keeps all)
SEED_KEYS = ("step_time", "feasible", "objective", "model", "search_objective",
             "search_model", "evaluations", "plan_seconds", "screen", "screen_fallbacks",
             "origin", "trace",
             "trace_models", "trace_evaluations")


def _median(values):
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _summary(rows) -> dict:
    def gmean(values):
        values = [v for v in values if v is not None and np.isfinite(v) and v > 0]
        return float(np.exp(np.mean(np.log(values)))) if values else None

    z = [r["zero_shot_vs_evolution"] for r in rows]
    speed = [r["planning_speedup"] for r in rows]
    strict = [r["speedup_vs_time_to_final"] for r in rows]
    half = []
    for r in rows:
        reach, final = r["hybrid_time_to_evolution"], r["evolution_time_to_final"]
        half.append(reach is not None and final is not None and reach <= 0.5 * max(final, 1e-9))
    beats = [r["hybrid_vs_evolution"] <= 1.0 + 1e-9 for r in rows]
    # where evolution finds no plan that fits, step-time ratios say little
    feasible = [r for r in rows if r["evolution"].get("feasible")]
    zf = [r["zero_shot_vs_evolution"] if r["zero_shot"].get("feasible") else np.inf
          for r in feasible]
    zm = [r["zero_shot_vs_evolution_median"] if r["zero_shot"].get("feasible") else np.inf
          for r in feasible]
    anytime = [r["anytime_vs_evolution"] if r["anytime"].get("feasible") else np.inf
               for r in feasible]
    first = [r["anytime"]["first_plan"]["seconds"] for r in rows
             if r["anytime"].get("first_plan")]
    return {
        "cases": len(rows),
        "cases_evolution_feasible": len(feasible),
        "zero_shot_worst_feasible": float(max(zf)) if zf else None,
        "anytime_vs_evolution_gmean_feasible":
            gmean(anytime) if np.all(np.isfinite(anytime)) else None,
        "anytime_within_5pct_feasible": int(sum(v <= 1.05 for v in anytime)),
        "anytime_worst_feasible": float(max(anytime)) if anytime else None,
        "anytime_no_worse_than_zero_shot": int(sum(
            r["anytime"]["step_time"] <= r["zero_shot"]["step_time"] * (1 + 1e-9)
            for r in rows)),
        "first_plan_seconds_median": float(np.median(first)) if first else None,
        "first_plan_speedup_at_least_100x": int(sum((r.get("first_plan_speedup") or 0) >= 100
                                                    for r in rows)),
        "zero_shot_vs_evolution_gmean_feasible": gmean(zf) if np.all(np.isfinite(zf)) else None,
        "zero_shot_within_10pct_feasible": int(sum(v <= 1.10 for v in zf)),
        # against the median of evolution's seeds
        "zero_shot_vs_evolution_median_gmean_feasible":
            gmean(zm) if np.all(np.isfinite(zm)) else None,
        "zero_shot_within_10pct_of_median_feasible": int(sum(v <= 1.10 for v in zm)),
        "zero_shot_vs_evolution_gmean": gmean(z),
        "zero_shot_within_10pct": int(sum(v <= 1.10 for v in z)),
        "planning_speedup_gmean": gmean(speed),
        "planning_speedup_at_least_100x": int(sum(v >= 100 for v in speed)),
        "speedup_vs_time_to_final_gmean": gmean(strict),
        "speedup_vs_time_to_final_at_least_100x": int(sum(v is not None and v >= 100
                                                          for v in strict)),
        "zero_shot_seconds_median": float(np.median([r["zero_shot"]["plan_seconds"]
                                                     for r in rows])),
        "evolution_time_to_final_median": float(np.median(
            [r["evolution_time_to_final"] for r in rows
             if r["evolution_time_to_final"] is not None] or [np.nan])),
        "policy_vs_evolution_gmean": gmean([r["policy_vs_evolution"] for r in rows]),
        "policy_within_10pct": int(sum(r["policy_vs_evolution"] <= 1.10 for r in rows)),
        "zero_shot_sources": {k: sum(r["zero_shot"].get("source") == k for r in rows)
                              for k in ("policy", "refined", "polished", "baseline",
                                        "branches")},
        "greedy_vs_evolution_gmean": gmean([r["greedy_vs_evolution"] for r in rows]),
        "greedy_within_10pct": int(sum(r["greedy_vs_evolution"] <= 1.10 for r in rows)),
        "greedy_planning_speedup_gmean": gmean([r["greedy_planning_speedup"] for r in rows]),
        "fine_tuned_vs_evolution_gmean": gmean([r["fine_tuned_vs_evolution"] for r in rows]),
        "hybrid_vs_evolution_gmean": gmean([r["hybrid_vs_evolution"] for r in rows]),
        "hybrid_at_most_equal_time_no_worse": int(sum(beats)),
        "hybrid_beats_evolution": int(sum(r["hybrid_vs_evolution"] < 1.0 - 1e-9
                                          for r in rows)),
        "hybrid_reaches_evolution_in_half_time": int(sum(half)),
        # the first seed, by the final objective and the budget's own axis
        "hybrid_no_worse": int(sum(r["hybrid_no_worse"] for r in rows)),
        "hybrid_half": int(sum(r["hybrid_half"] for r in rows)),
        "hybrid_target_met": int(sum(r["hybrid_target_met"] for r in rows)),
        # every seed: per-case medians and majorities
        "seeds": len(rows[0]["seeds"]) if rows else 0,
        "hybrid_vs_evolution_median_gmean": gmean([r["hybrid_vs_evolution_median"]
                                                   for r in rows]),
        "cases_hybrid_median_no_worse": int(sum(
            (r["hybrid_vs_evolution_objective_median"] or np.inf) <= 1 + 1e-9 for r in rows)),
        "cases_hybrid_no_worse_majority": int(sum(
            2 * r["hybrid_no_worse_seeds"] > len(r["seeds"]) for r in rows)),
        "cases_hybrid_half_majority": int(sum(
            2 * r["hybrid_half_seeds"] > len(r["seeds"]) for r in rows)),
        "cases_hybrid_target_majority": int(sum(
            2 * r["hybrid_target_met_seeds"] > len(r["seeds"]) for r in rows)),
        "hybrid_target_met_runs": int(sum(r["hybrid_target_met_seeds"] for r in rows)),
        "hybrid_no_worse_runs": int(sum(r["hybrid_no_worse_seeds"] for r in rows)),
        "runs": int(sum(len(r["seeds"]) for r in rows)),
        # evolution / hybrid runs whose screening gave the simulator up mid-search
        "screen_fallback_runs": {m: int(sum(bool(s[m].get("screen_fallbacks"))
                                            for r in rows for s in r["seeds"]))
                                 for m in ("evolution", "hybrid")},
    }


def _fmt(seconds) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.4g} ms" if seconds < 1 else f"{seconds:.4g} s"


def _line(row) -> str:
    z = row["zero_shot"]
    text = (f"{row['graph']} on {row['cluster']}: zero-shot {_fmt(z['step_time'])} "
            f"in {z['plan_seconds']:.3g}s")
    text += f", anytime {_fmt(row['anytime']['step_time'])}"
    if "evolution" in row:
        text += (f", evolution {_fmt(row['evolution']['step_time'])}, hybrid "
                 f"{_fmt(row['hybrid']['step_time'])}")
    return text


def _table(rows, axis: str = "time") -> str:
    """The results as a text table (times to reach in seconds, or in
    evaluations under an evaluation budget)."""
    reach_h, reach_e = (("hybrid_time_to_evolution", "evolution_time_to_final") if axis == "time"
                        else ("hybrid_evaluations_to_evolution",
                              "evolution_evaluations_to_final"))
    head = ["graph", "cluster", "greedy", "plan s", "zero-shot", "plan s", "src", "fine-tuned",
            "anytime", "first s", "evolution", "plan s", "hybrid", "zs/evo", "any/evo", "zs/med evo", "hyb/evo", "hyb reach",
            "evo final", "med hyb/evo", "met"]
    lines = [head]
    for r in rows:
        evo = r.get("evolution")
        hyb = r.get("hybrid")
        lines.append([
            r["graph"], r["cluster"], _fmt(r["greedy"]["step_time"]),
            f"{r['greedy']['plan_seconds']:.3g}", _fmt(r["zero_shot"]["step_time"]),
            f"{r['zero_shot']['plan_seconds']:.3g}", r["zero_shot"].get("source") or "-",
            _fmt(r["fine_tuned"]["step_time"]), _fmt(r["anytime"]["step_time"]),
            "-" if not r["anytime"].get("first_plan")
            else f"{r['anytime']['first_plan']['seconds']:.3g}",
            _fmt(evo["step_time"]) if evo else "-",
            f"{evo['plan_seconds']:.3g}" if evo else "-",
            _fmt(hyb["step_time"]) if hyb else "-",
            f"{r['zero_shot_vs_evolution']:.3f}" if evo else "-",
            f"{r['anytime_vs_evolution']:.3f}" if evo else "-",
            f"{r['zero_shot_vs_evolution_median']:.3f}" if evo else "-",
            f"{r['hybrid_vs_evolution']:.3f}" if evo else "-",
            "-" if r.get(reach_h) is None else f"{r[reach_h]:.3g}",
            "-" if r.get(reach_e) is None else f"{r[reach_e]:.3g}",
            f"{r['hybrid_vs_evolution_median']:.3f}" if evo else "-",
            f"{r['hybrid_target_met_seeds']}/{len(r['seeds'])}" if evo else "-"])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines)


def _clean(value):
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def zero_shot_against(saved: PathLike, checkpoint=None, *, split: str | None = None) -> dict:
    """Zero-shot ``rl`` (one-shot, the bench's ``zero_shot`` row) with
    ``checkpoint`` on the cases of a saved benchmark (``saved``: its JSON),
    against that run's evolution figures: a quick look at a trained policy
    without running evolution again (its figures are the saved run's, from
    that run's machine and budget; ``rl`` with that run's ``samples``).
    ``split`` keeps only that split's rows.
    Returns ``{"rows": [{graph, cluster, step_time, vs_evolution, ...}], "summary"}``
    (the summary, like the bench's, over the cases where evolution's plan fits)."""
    import json
    from pathlib import Path
    import placer
    data = json.loads(Path(saved).read_text(encoding="utf-8"))
    options = {} if data.get("samples") is None else {"samples": data["samples"]}
    if data["rows"]:
        _warm_up(data["rows"][0]["graph"], data["rows"][0]["cluster"],
                 None if checkpoint is None else str(checkpoint), False)
    rows = []
    for r in data["rows"]:
        if "evolution" not in r or (split is not None and r.get("split") != split):
            continue
        z = _run(placer.datasets.graph(r["graph"]), placer.datasets.cluster(r["cluster"]),
                 "rl", data.get("seed", 0), None,
                 checkpoint=None if checkpoint is None else str(checkpoint), **options)
        evo = r["evolution"]
        ratio = z["step_time"] / evo["step_time"] if z["feasible"] or not evo["feasible"] \
            else np.inf
        rows.append({"split": r.get("split"), "graph": r["graph"], "cluster": r["cluster"],
                     "step_time": z["step_time"], "plan_seconds": z["plan_seconds"],
                     "vs_evolution": ratio, "evolution_feasible": bool(evo["feasible"])})
    # as the bench's summary: where evolution's plan fits
    ratios = [row["vs_evolution"] for row in rows if row["evolution_feasible"]]
    finite = [v for v in ratios if np.isfinite(v) and v > 0]
    return {"rows": rows, "summary": {
        "cases": len(rows), "cases_evolution_feasible": len(ratios),
        "within_10pct_feasible": int(sum(v <= 1.10 for v in ratios)),
        "worst_feasible": float(max(ratios)) if ratios else None,
        "gmean_feasible": float(np.exp(np.mean(np.log(finite)))) if finite else None}}

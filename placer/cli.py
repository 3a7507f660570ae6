"""The ``placer`` command line.

Every subcommand prints one line and exits with status 2 on bad input (a
:class:`placer.errors.PlacerError`), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from . import __version__
from ._cli import (add_backend, add_model_options, add_seed, add_time_budget, formatter, note_atomic_outputs,
                   slow_stage)
from ._io import check_outputs, set_strict
from .errors import PlacerError, UnknownKeyWarning
# the loaders are placer.cli's public API too (scripts import load_model from here)
from .loaders import (DEFAULT_GRANULARITY, check_model, load_cluster, load_graph,  # noqa: F401
                      load_model, outputs_next_to)

EXIT_BAD_INPUT = 2



_formatter = formatter


def _add(sub, name: str, help_text: str, example: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help_text, description=help_text,
                          epilog=f"example:\n  {example}", formatter_class=_formatter)


def deprecated(old: str, new: str) -> None:
    """One line on stderr: ``old`` still works in this version; use ``new``."""
    print(f"placer: deprecated: {old} (still accepted in {__version__}; "
          f"removed in the next version): {new}", file=sys.stderr)


def _cluster_of(args, positional: str | None = None):
    """``--cluster``, or (the old spelling) the cluster as a positional argument."""
    if args.cluster is not None:
        if positional is not None:
            raise PlacerError(f"a cluster given twice ({positional!r} and --cluster "
                              f"{args.cluster!r})", field="--cluster",
                              fix=f"placer {args.command} GRAPH PLAN... --cluster CLUSTER")
        return load_cluster(args.cluster)
    if positional is None:
        raise PlacerError("no cluster given", field="--cluster",
                          fix="add --cluster CLUSTER (a file or a preset: placer datasets)")
    deprecated(f"the cluster as a positional argument of placer {args.command}",
               f"write placer {args.command} GRAPH PLAN... --cluster {positional}")
    return load_cluster(positional)


def _emit(args, data: dict, text: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=1, default=str))
    else:
        print(text)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return f"{n:.1f} TB"


def _fmt_rate(n: float, unit: str) -> str:
    for prefix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000 or prefix == "P":
            return f"{n:.3g} {prefix}{unit}"
        n /= 1000
    return f"{n:.3g} P{unit}"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


# --- commands ---------------------------------------------------------------------

def _inputs(args) -> list:
    """The files a command reads (for :func:`placer._io.check_outputs`)."""
    out = []
    for key in ("model", "graph", "cluster", "plan", "file", "checkpoint", "legacy_plan"):
        value = getattr(args, key, None)
        if isinstance(value, str):
            out.append(value)
    return out + list(getattr(args, "plans", None) or [])


def cmd_trace(args) -> int:
    check_outputs([("--output", args.output)], _inputs(args))
    start = time.perf_counter()
    graph = load_graph(args.model, args)
    elapsed = time.perf_counter() - start
    from . import datasets
    traced = ":" in args.model or args.model in datasets.models()
    if args.granularity is None and traced:
        print(f"placer trace: note: traces whole modules by default since {__version__} "
              "(as placer plan MODEL does); --granularity op gives the op-level graph "
              "the earlier default made", file=sys.stderr)
    if args.output:
        graph.save(args.output)
    totals = graph.totals()
    _emit(args, {"output": args.output, "seconds": elapsed, **totals},
          f"traced {graph.name}: {totals['ops']} ops, {totals['edges']} edges, "
          f"{totals['flops']:.3g} FLOP forward, {totals['bwd_flops']:.3g} backward, "
          f"{_fmt_bytes(totals['param_bytes'])} params in {elapsed:.1f} s"
          + (f" -> {args.output}" if args.output else ""))
    return 0


def _preset_path(name: str) -> Path:
    from ._paths import data_dir
    return data_dir() / "clusters" / f"{name}.yaml"


def _detect(path: str) -> str:
    from ._io import load_document
    from .errors import FormatError
    data = load_document(path, FormatError)
    tag = data.get("format") if isinstance(data, dict) else None
    if tag not in ("placer.graph/v1", "placer.cluster/v1", "placer.plan/v1"):
        raise FormatError(f"unknown format {tag!r}", file=path, field="format",
                          fix="expected a placer.graph/v1, placer.cluster/v1 or placer.plan/v1 file")
    return tag


def show_graph(graph) -> tuple[dict, str]:
    """Summary of a graph: totals and the heaviest ops."""
    totals = graph.totals()
    path, cp = graph.critical_path()
    heavy = sorted(graph, key=lambda op: op.flops + op.bwd_flops, reverse=True)[:8]
    rows = [[op.id, op.op, f"{op.flops:.3g}", f"{op.bwd_flops:.3g}",
             _fmt_bytes(op.param_bytes), _fmt_bytes(op.output_bytes), op.colocate or ""]
            for op in heavy]
    text = (f"graph {graph.name} ({'training' if graph.training else 'inference'}): "
            f"{totals['ops']} ops, {totals['edges']} edges\n"
            f"FLOPs forward {totals['flops']:.4g}, backward {totals['bwd_flops']:.4g}; "
            f"params {_fmt_bytes(totals['param_bytes'])}; "
            f"activations {_fmt_bytes(totals['output_bytes'])}\n"
            f"critical path: {len(path)} ops, {cp:.4g} FLOP\n"
            f"fingerprint {graph.fingerprint()[:16]}\n\nheaviest ops:\n"
            + _table(rows, ["id", "op", "flops", "bwd_flops", "params", "output", "colocate"]))
    return {"kind": "graph", "name": graph.name, "fingerprint": graph.fingerprint(),
            "critical_path_ops": len(path), "critical_path_flops": cp, **totals}, text


def show_cluster(cluster) -> tuple[dict, str]:
    """Summary of a cluster: devices and the links between sites."""
    rows: list[list[str]] = []
    run: list = []
    for d in cluster.devices + [None]:  # runs of identical devices share a row
        same = run and d is not None and (d.kind, d.site, d.flops, d.memory) == \
            (run[0].kind, run[0].site, run[0].flops, run[0].memory)
        if run and not same:
            label = run[0].name if len(run) == 1 else f"{run[0].name}..{run[-1].name}"
            rows.append([label, str(len(run)), run[0].kind or "", run[0].site,
                         _fmt_rate(run[0].flops, "FLOP/s"), _fmt_bytes(run[0].memory)])
            run = []
        if d is not None:
            run.append(d)
    sites = cluster.sites()
    link_rows = []
    names = list(sites)
    for i, a in enumerate(names):
        for b in names[i:]:
            da, db = sites[a][0], (sites[b][1] if a == b and len(sites[b]) > 1 else sites[b][0])
            if da == db:
                continue
            bw, lat = cluster.link(da, db)
            link_rows.append([a, b, _fmt_rate(bw, "B/s"), f"{lat * 1e3:.3g} ms"])
    text = (f"cluster {cluster.name}: {len(cluster)} devices in {len(sites)} site(s), "
            f"{_fmt_rate(cluster.total_flops(), 'FLOP/s')}, "
            f"{_fmt_bytes(cluster.total_memory())} memory\n\n"
            + _table(rows, ["devices", "n", "kind", "site", "peak", "memory"])
            + ("\n\nlinks (first device pair of each site pair):\n"
               + _table(link_rows, ["site", "site", "bandwidth", "latency"]) if link_rows else ""))
    return {"kind": "cluster", "name": cluster.name, "devices": cluster.names,
            "sites": sites, "fingerprint": cluster.fingerprint()}, text


def show_plan(plan, order=None) -> tuple[dict, str]:
    """Summary of a plan: its shape (stages, data-parallel groups, pipeline
    settings), the prediction, and per device its stages, ops (module names
    or op ranges), predicted memory and busy share. ``order``: the ops in
    the graph's order, when the graph is at hand."""
    from .describe import device_rows, shape
    rows = device_rows(plan, order)
    table = [[r["device"], ",".join(map(str, r["stages"])), str(r["ops"]), r["ranges"],
              "-" if r["peak_memory"] is None else _fmt_bytes(r["peak_memory"]),
              "-" if r["busy_share"] is None else f"{r['busy_share']:.0%}"]
             for r in rows]
    predicted = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in plan.predicted.items()
                          if k in ("step_time", "feasible"))
    text = (f"plan by {plan.method}: {shape(plan, order)}\n"
            + (f"predicted: {predicted}\n" if predicted else "") + "\n"
            + _table(table, ["device", "stage", "ops", "modules / op ranges", "memory", "busy"]))
    return {"kind": "plan", **plan.to_dict(), "shape": shape(plan, order),
            "ops_per_device": {r["device"]: r["ops"] for r in rows}, "devices": rows}, text


def cmd_show(args) -> int:
    from .cluster import Cluster
    from .graph import Graph
    from .plan import Plan
    from .cluster import Cluster as _Cluster
    if not os.path.exists(args.file) and args.file in _Cluster.presets():
        args.file = str(_preset_path(args.file))
    tag = _detect(args.file)
    if tag == "placer.cluster/v1" and args.plot:
        from .plots import plot_cluster
        plot_cluster(Cluster.load(args.file), args.plot)
    if tag == "placer.graph/v1":
        data, text = show_graph(Graph.load(args.file))
    elif tag == "placer.cluster/v1":
        data, text = show_cluster(Cluster.load(args.file))
    else:
        data, text = show_plan(Plan.load(args.file))
    _emit(args, data, text)
    return 0


def cmd_datasets(args) -> int:
    from . import datasets
    from .cluster import Cluster
    data = {"models": datasets.models(), "graphs": datasets.graphs(),
            "clusters": Cluster.presets(), "splits": datasets.splits()}
    text = "\n".join([
        "models (placer.datasets.model):   " + ", ".join(data["models"]),
        "graphs (placer.datasets.graph):   " + ", ".join(data["graphs"]),
        "clusters (Cluster.preset):        " + ", ".join(data["clusters"]),
        "splits: " + "; ".join(f"{k}: {len(v)} graphs" for k, v in data["splits"].items())])
    _emit(args, data, text)
    return 0




def _sigterm_as_interrupt():
    """Make SIGTERM raise KeyboardInterrupt (so a checkpointing search saves
    its state); returns the previous handler, or None off the main thread."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt
    return signal.signal(signal.SIGTERM, handler)


def _methods(text: str) -> list[str]:
    from .search import strategies
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in strategies()]
    if not methods or unknown:
        raise PlacerError(f"unknown method {(unknown or [text])[0]!r}", field="--method",
                          fix="use one of " + ", ".join(strategies())
                          + " (several, comma-separated, to keep the best)")
    if len(set(methods)) != len(methods):
        raise PlacerError(f"method named twice in {text!r}", field="--method",
                          fix="name each strategy once")
    return methods


def _coarsen_option(text: str):
    """``--coarsen``: "auto", None (``none``) or a number of groups."""
    if text in ("auto", "none"):
        return None if text == "none" else text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise PlacerError(f"bad --coarsen {text!r}", field="--coarsen",
                          fix="use auto, none or a whole number of groups >= 2")
    return value


def _best_of(results: list) -> tuple:
    """The (plan, report) with the shortest predicted step among feasible ones."""
    return min(results, key=lambda r: (not r[1].feasible, r[1].step_time))


def _parallel_options(methods: list[str], args) -> dict[str, dict]:
    """Each method's ``backend``/``workers`` options from ``--backend`` and
    ``--workers`` (hybrid passes them to its evolution); one line when no
    method of ``methods`` runs work in parallel but they were asked for."""
    import inspect
    from .search.base import strategy_class
    given = {} if args.backend == "local" else {"backend": args.backend}
    if args.workers is not None:
        given["workers"] = args.workers
    out: dict[str, dict] = {}
    for method in methods:
        accepts = inspect.signature(strategy_class(method).__init__).parameters
        if "backend" in accepts:
            out[method] = dict(given)
        elif "evolution" in accepts and given:
            out[method] = {"evolution": dict(given)}
        else:
            out[method] = {}
    if given and not any(out.values()):
        raise PlacerError(f"{', '.join(methods)} run{'s' if len(methods) == 1 else ''} in one process", field="--backend"
                          if "backend" in given else "--workers",
                          fix="use --method evolution, dtfm or hybrid, or drop the option")
    return out


def cmd_plan(args) -> int:
    from ._cli import check_backend_arg
    from .search import optimize_with_report
    from .search.base import SearchInterrupted
    methods = _methods(args.method)
    check_backend_arg(args)
    parallel = _parallel_options(methods, args)
    stem = outputs_next_to(args.output)
    check_outputs([("--output", args.output), ("--output", stem + ".trace.json")]
                  + [("--output", f"{stem}.{kind}.png") for kind in
                     ([] if args.no_plots else ["placement", "gantt", "convergence"])],
                  [i for i in _inputs(args) if i != args.checkpoint])
    check_outputs([("--output", args.output)], [args.checkpoint])
    if args.resume and not args.checkpoint:
        raise PlacerError("--resume needs the checkpoint file", field="--resume",
                          fix="add --checkpoint STATE.json (the file the interrupted run wrote)")
    if args.checkpoint and methods != ["evolution"]:
        raise PlacerError(f"method {args.method!r} cannot checkpoint", field="--checkpoint",
                          fix="use --method evolution, or drop --checkpoint/--resume")
    graph = load_graph(args.model, args)
    cluster = load_cluster(args.cluster)
    _warm("plan", policy=bool({"rl", "hybrid"} & set(methods)))
    options: dict[str, Any] = {}
    if args.microbatches:
        options["microbatches"] = args.microbatches
    if args.schedule:
        options["schedule"] = args.schedule
    if args.evaluations:
        options["evaluations"] = args.evaluations
    if args.checkpoint:
        options.update(checkpoint=args.checkpoint, resume=args.resume)
    options["coarsen"] = _coarsen_option(args.coarsen)
    previous = _sigterm_as_interrupt()
    from ._cli import SearchBar
    from .convergence import Convergence
    bar = (SearchBar(args.time_budget, args.evaluations, methods[0])
           if not args.json and sys.stderr.isatty() else None)
    convergence = Convergence(bar)
    results: list = []
    try:
        for method in methods:
            if bar is not None and results:
                bar.next_search(method)
            budget = (f"{args.evaluations} evaluations" if args.evaluations and
                      args.time_budget is None else f"up to {args.time_budget:g} s")
            with slow_stage("placer plan", f"searching with {method} ({budget})",
                            quiet=bar is not None):
                results.append(optimize_with_report(
                    graph, cluster, method=method, seed=args.seed,
                    time_budget=args.time_budget,
                    progress=convergence.labelled(method) if len(methods) > 1 else convergence,
                    **options, **parallel[method]))
    except KeyboardInterrupt as exc:
        stopped = exc if isinstance(exc, SearchInterrupted) else SearchInterrupted(
            message="interrupted")
        saved = [p for p, _ in results] + ([stopped.plan] if stopped.plan is not None else [])
        if not saved:
            print(f"placer plan: {stopped.message}; nothing saved", file=sys.stderr)
            return 130
        best = min(saved, key=lambda p: (not p.predicted.get("feasible", False),
                                         p.predicted.get("step_time", float("inf"))))
        best.save(args.output)
        print(f"placer plan: {stopped.message}; best plan so far written to {args.output}"
              + (f", search state to {stopped.checkpoint} (continue with --resume)"
                 if stopped.checkpoint else ""), file=sys.stderr)
        return 130
    finally:
        if bar is not None:
            bar.close()
        if previous is not None:
            import signal
            signal.signal(signal.SIGTERM, previous)
    plan, report = _best_of(results)
    plan.save(args.output)
    stem = outputs_next_to(args.output)
    with slow_stage("placer plan", "writing the trace and pictures"):
        pictures = _plan_pictures(graph, cluster, plan, report, convergence, stem,
                                  args.no_plots)
    data = {"plan": args.output, "trace": stem + ".trace.json", "pictures": pictures,
            "convergence": convergence.to_dict(),
            "candidates": [{"method": p.method, "step_time": r.step_time, "feasible": r.feasible,
                            "search_seconds": p.predicted["search"].get("search_seconds")}
                           for p, r in results],
            "method": plan.method, "microbatches": plan.microbatches,
            "schedule": plan.schedule, "report": report.to_dict()}
    _, plan_text = show_plan(plan, graph.topological_order())
    why = plan.predicted.get("infeasible") or []
    if why:
        data["infeasible"] = why
    compared = "" if len(results) < 2 else "kept the best of: " + ", ".join(
        f"{p.method} {r.step_time * 1e3:.4g} ms{'' if r.feasible else ' (does not fit)'}"
        for p, r in results) + "\n"
    text = (f"{graph.name} ({len(graph)} ops) on {cluster.name} ({len(cluster)} devices), "
            f"method {plan.method}\n{compared}{report.summary()}\n"
            + "".join(f"DOES NOT FIT: {line}\n" for line in why) + f"\n{plan_text}\n\n"
            f"wrote {args.output}, {stem}.trace.json"
            + "".join(f", {p}" for p in pictures))
    _emit(args, data, text)
    return 0


def _plan_pictures(graph, cluster, plan, report, convergence, stem: str,
                   no_plots: bool) -> list[str]:
    """``placer plan``'s trace (always) and pictures (unless ``no_plots``)."""
    report.to_chrome_trace(stem + ".trace.json")
    if no_plots:
        return []
    from .plots import plot_placement
    plot_placement(graph, plan, stem + ".placement.png",
                   title=f"{graph.name} on {cluster.name}: placement by {plan.method}")
    report.plot_gantt(stem + ".gantt.png", title=f"{graph.name} on {cluster.name} ({plan.method})")
    convergence.plot(stem + ".convergence.png",
                     title=f"{graph.name} on {cluster.name}: search convergence "
                           "(search model's step time)")
    return [stem + ".placement.png", stem + ".gantt.png", stem + ".convergence.png"]


def cmd_replan(args) -> int:
    """``placer replan PLAN --without DEV``: re-plan on the surviving devices."""
    from .api import simulate
    from .plan import Plan
    from .replan import replan
    graph = load_graph(args.graph, args)
    cluster = load_cluster(args.cluster)
    old = Plan.load(args.plan)
    _warm("replan", policy=args.method in ("rl", "hybrid"))
    output = args.output or outputs_next_to(args.plan) + ".replanned.json"
    check_outputs([("--output", output)], _inputs(args))
    options: dict[str, Any] = {}
    if args.evaluations:
        options["evaluations"] = args.evaluations
    # a broken plan is one line before any progress line
    old.validate(graph, cluster, check_fingerprints=not args.ignore_fingerprints, file=args.plan)
    bar = not args.json and sys.stderr.isatty()
    with slow_stage("placer replan", f"re-planning with {args.method}", quiet=bar):
        plan = replan(graph, cluster, old, args.without, method=args.method, seed=args.seed,
                      time_budget=args.time_budget, file=args.plan,
                      check_fingerprints=not args.ignore_fingerprints, progress=bar, **options)
    reduced = cluster.without(args.without)
    report = simulate(graph, reduced, plan)
    plan.save(output)
    info = plan.extra["replan"]
    _, plan_text = show_plan(plan, graph.topological_order())
    _emit(args, {"plan": output, "method": plan.method, **info, "report": report.to_dict()},
          f"{graph.name} on {cluster.name} without {', '.join(args.without)} "
          f"({len(reduced)} devices left), method {plan.method}: "
          f"{info['moved_ops']} of {len(graph)} ops moved\n{report.summary()}\n\n"
          f"{plan_text}\n\nwrote {output}")
    return 0


def cmd_simulate(args) -> int:
    from .api import simulate
    from .plan import Plan
    legacy = args.legacy_plan is not None     # GRAPH CLUSTER PLAN
    plan_path = args.legacy_plan if legacy else args.plan
    cluster = _cluster_of(args, args.plan if legacy else None)
    check_outputs([("--trace", args.trace), ("--gantt", args.gantt)], _inputs(args))
    graph = load_graph(args.graph, args)
    plan = Plan.load(plan_path)
    plan.validate(graph, cluster, check_fingerprints=not args.ignore_fingerprints,
                  file=plan_path)
    _warm("simulate")
    with slow_stage("placer simulate", f"simulating {plan_path}"):
        report = simulate(graph, cluster, plan)
    written = []
    if args.trace:
        report.to_chrome_trace(args.trace)
        written.append(args.trace)
    if args.gantt:
        report.plot_gantt(args.gantt, title=f"{graph.name} on {cluster.name}")
        written.append(args.gantt)
    _emit(args, {"report": report.to_dict(), "written": written},
          report.summary() + ("\nwrote " + ", ".join(written) if written else ""))
    return 0


def cmd_compare(args) -> int:
    """Simulate several plans of one graph on one cluster side by side."""
    from .api import simulate
    from .plan import Plan
    legacy = args.cluster is None and len(args.plans) > 1   # GRAPH CLUSTER PLAN...
    cluster = _cluster_of(args, args.plans.pop(0) if legacy else None)
    check_outputs([("--plot", args.plot)], _inputs(args))
    graph = load_graph(args.graph, args)
    rows, data = [], []
    _warm("compare")
    for path in args.plans:
        plan = Plan.load(path)
        plan.validate(graph, cluster, check_fingerprints=not args.ignore_fingerprints,
                      file=path)
        with slow_stage("placer compare", f"simulating {path}"):
            report = simulate(graph, cluster, plan)
        peak = max(report.peak_memory.values(), default=0.0)
        data.append({"plan": path, "method": plan.method, "step_time": report.step_time,
                     "feasible": report.feasible, "peak_memory": peak,
                     "devices": len(plan.devices_used()), "microbatches": plan.microbatches,
                     "schedule": plan.schedule, "bottleneck": report.bottleneck})
    best = min((d["step_time"] for d in data if d["feasible"]), default=None)
    for d in data:
        ratio = f"{d['step_time'] / best:.2f}x" if best else "-"
        rows.append([d["plan"], d["method"], f"{d['step_time'] * 1e3:.3f} ms", ratio,
                     "yes" if d["feasible"] else "NO", _fmt_bytes(d["peak_memory"]),
                     str(d["devices"]), f"{d['microbatches']} {d['schedule']}"])
    if args.plot:
        from .plots import plot_comparison
        plot_comparison(data, args.plot, title=f"{graph.name} on {cluster.name}")
    _emit(args, {"graph": graph.name, "cluster": cluster.name, "plans": data},
          _table(rows, ["plan", "method", "step", "vs best", "fits", "peak mem", "devices",
                        "pipeline"]) + (f"\nwrote {args.plot}" if args.plot else ""))
    return 0


def _warm(command: str, policy: bool = False) -> None:
    """Compile the numba kernels now, saying so, if this is their first use."""
    from .warmup import warm_if_cold
    warm_if_cold(f"placer {command}", policy=policy)


def cmd_warmup(args) -> int:
    """``placer warmup``: compile and cache every numba kernel."""
    from .warmup import uncompiled, warmup
    todo = uncompiled(policy=not args.no_policy)
    if todo and not args.json:
        print(f"placer warmup: compiling {len(todo)} numba kernels (about 15 s)",
              file=sys.stderr, flush=True)
    result = warmup(policy=not args.no_policy)
    left = result["uncompiled_after"]
    if left:
        raise PlacerError(f"{len(left)} kernels could not be cached ({left[0]}, ...)",
                          field="NUMBA_CACHE_DIR",
                          fix="set NUMBA_CACHE_DIR to a writable folder")
    _emit(args, result,
          f"compiled and cached {len(result['compiled'])} of {result['kernels']} kernels in "
          f"{result['seconds']:.1f} s" if result["compiled"] else
          f"all {result['kernels']} kernels were already cached ({result['seconds']:.1f} s)")
    return 0


def cmd_bench(args) -> int:
    from ._cli import check_backend_arg
    out = args.output or f"bench-{args.what}.json"
    check_outputs([("--output", out)])
    check_backend_arg(args)
    if (args.backend != "local" or args.workers) and not (
            args.what == "search" and args.suite not in ("heuristics", "dtfm-paper")):
        raise PlacerError(f"bench {args.what} {args.suite or ''} runs its cases in one "
                          "process".replace("  ", " "), field="--backend",
                          fix="use it with bench search (its suites but heuristics and "
                              "dtfm-paper), or drop it")
    if args.what == "cost":
        from .bench.cost import bench_cost
        bench_cost(out=out, quick=args.quick)
    elif args.what == "search":
        if args.suite == "heuristics":
            from .bench.search import bench_search as bench_heuristics
            bench_heuristics(out=out, seed=args.seed)
        elif args.suite == "bigraph":
            from .bench.bigraph import bench_bigraph
            bench_bigraph(out=out, seconds=args.time_budget or 120.0, seed=args.seed,
                          sizes=(20_000, 100_000) if args.quick else (100_000,))
        elif args.suite == "dtfm-paper":
            from .bench.dtfm_paper import bench_dtfm_paper
            bench_dtfm_paper(out=out, seed=args.seed, seconds=args.time_budget or 60.0)
        else:
            from .bench.search_evolution import bench_search
            bench_search(out=out, quick=args.quick, suite=args.suite, seed=args.seed,
                         seconds=args.time_budget, backend=args.backend,
                         workers=args.workers or 0)
    elif args.what == "learned":
        from .bench.learned import bench_learned
        extra = {} if args.time_budget is None else {"time_budget": args.time_budget}
        bench_learned(out=out, quick=args.quick, seed=args.seed, seeds=args.seeds,
                      evaluations=args.evaluations, split=args.split or "test",
                      only=args.cases, **extra)
    elif args.what == "fidelity":
        from .bench.fidelity import bench_fidelity
        doc = bench_fidelity(out, quick=args.quick, seed=args.seed)
        print(json.dumps(doc["summary"], indent=1))
    elif args.what == "runtime":
        from .bench.engines import engines
        from .bench.runtime import accuracy, netns, overhead
        from ._io import atomic_write_text, dump_json
        which = args.suite or "overhead"
        runner = {"overhead": overhead, "accuracy": accuracy, "netns": netns,
                  "engines": engines}.get(which)
        if runner is None:
            raise PlacerError(f"unknown runtime suite {which!r}", field="--suite",
                              fix="use overhead, accuracy, netns or engines")
        result = runner()
        atomic_write_text(out, dump_json(result))
        print(json.dumps(result, indent=1, default=str))
    return 0




_DELEGATE_TARGETS = {"run": "placer.cli_runtime:run_main",
                     "launch": "placer.cli_runtime:launch_main",
                     "profile": "placer.runtime.profile:profile_main",
                     "tune": "placer.tune:tune_main"}


def _delegate(name: str) -> Callable[[list[str]], int]:
    """Subcommands whose parsers live with their code."""
    if name == "train":
        from gnn.train import main as train_main
        return lambda argv: train_main(argv, prog="placer train")
    module_name, _, attr = _DELEGATE_TARGETS[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)


DELEGATED = {
    "run": ("Run a plan on this machine's devices in one process and measure it.",
            "placer run plan.json --model gpt-125m --tiny --steps 3"),
    "launch": ("Run a plan as one torch.distributed process per device (gloo/NCCL).",
               "placer launch plan.json --model gpt-125m --tiny --nproc 2"),
    "profile": ("Measure per-op times on local devices; write a calibrated graph and cluster.",
                "placer profile --model gpt-125m --tiny -o g.json --cluster-out local.yaml"),
    "tune": ("Tune the evolutionary search's hyperparameters with Optuna (resumable, shared).",
             "placer tune --trials 20 --storage sqlite:///tune.db"),
    "train": ("Train a GNN placement policy (same as train_policy.py).",
              "placer train --iterations 200 -o policy"),
}


#: what a GRAPH or MODEL argument may be, on every command that takes one
GRAPH_HELP = "graph file, shipped graph, zoo model or MODULE:FACTORY"


# --- parser -----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``placer`` command."""
    parser = argparse.ArgumentParser(prog="placer", formatter_class=_formatter,
                     description="Decide where every part of a model runs on a cluster, "
                                 "then run it that way.",
                     epilog="example:\n  placer plan gpt-125m --cluster two-sites -o plan.json")
    parser.add_argument("--version", action="version", version=f"placer {__version__}")
    parser.add_argument("--strict", action="store_true",
                        help="unknown keys in graph, cluster and plan files are errors, not "
                             "warnings (also accepted after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_model_commands(sub)
    _add_search_commands(sub)
    _add_scoring_commands(sub)
    _add_other_commands(sub)
    return note_atomic_outputs(parser)


def _add_model_commands(sub) -> None:
    """The subparsers of trace and show."""
    p = _add(sub, "trace", "Trace a PyTorch model into a placer.graph/v1 file.",
             "placer trace mymodels:resnet --input-shape 8,3,224,224 -o resnet.json")
    p.add_argument("model", metavar="MODEL", help="MODULE:FACTORY or a zoo model name")
    p.add_argument("-o", "--output", help="graph file to write (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _model_options(p)
    p.set_defaults(func=cmd_trace)

    p = _add(sub, "show", "Summarise a graph, cluster or plan file (or a preset name).",
             "placer show two-sites --plot two-sites.png")
    p.add_argument("file", metavar="FILE",
                   help="a graph, cluster or plan file, or a cluster preset name")
    p.add_argument("--plot", metavar="PNG", help="also draw a cluster as a picture")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_show)


def _add_search_commands(sub) -> None:
    """The subparsers of plan and replan."""
    p = _add(sub, "plan", "Search a placement for a model on a cluster and write the plan.",
             "placer plan gpt-125m --cluster two-sites --method heft -o plan.json")
    p.add_argument("model", metavar="MODEL", help=GRAPH_HELP)
    _cluster_option(p, "the devices and links to place on", required=True)
    p.add_argument("-m", "--method", default="evolution",
                   help="strategy (see placer.strategies()); several comma-separated run "
                        "one after another (each with --time-budget) and the best plan is kept")
    p.add_argument("-o", "--output", default="plan.json", help="plan file to write")
    add_seed(p, "search")
    add_time_budget(p, "search per method", 30.0)
    p.add_argument("--evaluations", type=int, help="plans the search may score "
                   "(with a seed: a deterministic budget)")
    p.add_argument("--checkpoint", metavar="STATE",
                   help="evolution: save the search state here (every minute and on "
                        "Ctrl-C/SIGTERM, which also writes the best plan so far to -o)")
    p.add_argument("--resume", action="store_true",
                   help="continue the search saved in --checkpoint (same arguments)")
    p.add_argument("--microbatches", type=int, help="fix the number of microbatches")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], help="fix the pipeline schedule")
    from .search.multilevel import COARSEN_ABOVE, COARSEN_TO
    p.add_argument("--coarsen", default="auto", metavar="auto|none|N",
                   help=f"auto (default): a graph over {COARSEN_ABOVE:,} ops is coarsened to "
                        f"{COARSEN_TO:,} groups, searched, expanded and refined on its ops "
                        "within the same budget; none: search the whole graph; N: coarsen "
                        "to N groups whatever the size")
    add_backend(p, "evolution's and dtfm's batch scoring")
    p.add_argument("--no-plots", action="store_true", help="do not write PNG pictures")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _model_options(p)
    p.set_defaults(func=cmd_plan)

    p = _add(sub, "replan", "Re-plan on the devices left after some are lost "
             "(moves as few ops as it can).",
             "placer replan plan.json --without b0 --graph gpt-125m --cluster two-sites")
    p.add_argument("plan", metavar="PLAN", help="the plan made for GRAPH on CLUSTER")
    p.add_argument("--without", action="append", required=True, metavar="DEVICE",
                   help="a lost device (repeat for several)")
    p.add_argument("-g", "--graph", required=True, help=GRAPH_HELP)
    _cluster_option(p, "the cluster the plan was made for", required=True)
    p.add_argument("-m", "--method", default="evolution",
                   help="strategy warm-started from the repaired plan, or 'repair' (no search)")
    p.add_argument("-o", "--output", help="plan file to write (default PLAN.replanned.json)")
    add_seed(p, "search")
    add_time_budget(p, "search", 30.0)
    p.add_argument("--evaluations", type=int, help="plans the search may score")
    p.add_argument("--ignore-fingerprints", action="store_true",
                   help="re-plan even if the plan was made for another graph/cluster")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _model_options(p)
    p.set_defaults(func=cmd_replan)


def _add_scoring_commands(sub) -> None:
    """The subparsers of simulate, export and compare."""
    p = _add(sub, "simulate", "Simulate a plan and report step time, memory and traffic.",
             "placer simulate graph.json plan.json --cluster two-sites --trace run.trace.json")
    p.add_argument("graph", metavar="GRAPH", help=GRAPH_HELP)
    p.add_argument("plan", metavar="PLAN", help="the plan file to score")
    p.add_argument("legacy_plan", nargs="?", help=argparse.SUPPRESS)  # GRAPH CLUSTER PLAN
    _cluster_option(p, "the cluster the plan was made for")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace here")
    p.add_argument("--gantt", help="write a Gantt chart PNG here")
    p.add_argument("--ignore-fingerprints", action="store_true",
                   help="simulate even if the plan was made for another graph/cluster")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _model_options(p)
    p.set_defaults(func=cmd_simulate)

    p = _add(sub, "export", "Write a plan for torch pipelining, accelerate or DeepSpeed.",
             "placer export plan.json --to pipelining --graph gpt-125m --tiny -o split.json")
    p.add_argument("plan", metavar="PLAN", help="the plan file to export")
    p.add_argument("--to", required=True, choices=["pipelining", "device-map", "deepspeed"],
                   help="pipelining: pipeline() split points, stage map and schedule class; "
                        "device-map: an accelerate device_map; deepspeed: a layer partition")
    p.add_argument("-g", "--graph", help="the plan's graph: graph file, shipped graph, zoo "
                                         "model or MODULE:FACTORY")
    p.add_argument("-o", "--output", help="JSON file to write (default: print it)")
    p.add_argument("--snippet", metavar="PY", help="pipelining: also write a short runnable "
                                                   "script that builds the pipeline")
    p.add_argument("--json", action="store_true", help="print the JSON even with -o")
    _model_options(p)
    p.set_defaults(func=lambda args: importlib.import_module("placer.export").cmd_export(args))

    p = _add(sub, "compare", "Simulate several plans of one graph on one cluster side by side.",
             "placer compare graph.json heft.json evolution.json --cluster two-sites "
             "--plot cmp.png")
    p.add_argument("graph", metavar="GRAPH", help=GRAPH_HELP)
    p.add_argument("plans", metavar="PLAN", nargs="+", help="plan files to score")
    _cluster_option(p, "the cluster the plans were made for")
    p.add_argument("--plot", metavar="PNG", help="draw step times as bars")
    p.add_argument("--ignore-fingerprints", action="store_true",
                   help="compare even plans made for another graph/cluster")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _model_options(p)
    p.set_defaults(func=cmd_compare)


def _add_other_commands(sub) -> None:
    """The subparsers of datasets, warmup, bench and the delegated commands."""
    p = _add(sub, "datasets", "List shipped models, graphs, cluster scenarios and splits.",
             "placer datasets --json")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_datasets)

    p = _add(sub, "warmup", "Compile and cache the numba kernels of the cost models and the "
             "GNN policy, so the first plan is as quick as later ones.", "placer warmup")
    p.add_argument("--no-policy", action="store_true",
                   help="only the cost models' kernels (skip the GNN policy's)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_warmup)

    p = _add(sub, "bench", "Run a benchmark and write its JSON results.",
             "placer bench search --suite hetero -o bench-search.json")
    p.add_argument("what", choices=["cost", "search", "learned", "runtime", "fidelity"],
                   help="which benchmark: cost models, search strategies, the learned "
                        "policy, the runtime, or predicted against measured over many plans")
    p.add_argument("-o", "--output", help="JSON file to write (default bench-WHAT.json)")
    p.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    p.add_argument("--suite", help="search: quick, hetero, homo, dtfm, dtfm-paper, scale, "
                                   "heuristics or bigraph (100,000 ops on 64 devices); "
                                   "runtime: overhead, accuracy, netns or engines")
    add_seed(p, "benchmark's searches")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="search and learned: seconds per strategy and case "
                        "(default: the suite's own)")
    p.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                   help="learned: run evolution and hybrid once per seed and report "
                        "per-case medians and win counts (default: --seed)")
    p.add_argument("--evaluations", type=int, metavar="N",
                   help="learned: give evolution, hybrid and anytime rl N plans scored "
                        "instead of the time budget (deterministic, free of the machine's "
                        "noise)")
    p.add_argument("--split", choices=["test", "ood", "all"],
                   help="learned: the test split's cases (default), the out-of-family "
                        "split's (graph families and clusters no training draws from) or both")
    p.add_argument("--cases", nargs="+", metavar="GRAPH@CLUSTER",
                   help="learned: only the split's cases matching these shell patterns, "
                        "e.g. 'experts-*@classes-d8-s0' (a long run in pieces)")
    add_backend(p, "search: the cases (each on a worker of its own)")
    p.set_defaults(func=cmd_bench)

    for name, (help_text, example) in DELEGATED.items():
        p = _add(sub, name, help_text, example)
        p.add_argument("args", nargs=argparse.REMAINDER,
                       help=f"see `placer {name} --help`")


def _cluster_option(p, what: str, required: bool = False) -> None:
    """``-c/--cluster``: ``what`` the cluster is, to this command."""
    p.add_argument("-c", "--cluster", required=required,
                   help=f"{what}: a cluster file or preset name")


def _model_options(p) -> None:
    """``--granularity`` and the model options every tracing command takes."""
    p.add_argument("--granularity", choices=["op", "module"], default=None,
                   help=f"trace ops or whole modules (default: {DEFAULT_GRANULARITY})")
    add_model_options(p)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``placer`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    end = argv.index("--") if "--" in argv else len(argv)
    strict = "--strict" in argv[:end]
    if strict:      # a global flag, accepted before or after the command
        argv = [a for a in argv[:end] if a != "--strict"] + argv[end:]
    set_strict(strict)
    if argv and argv[0] in DELEGATED:
        return _guarded(argv[0], lambda: _delegate(argv[0])(argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    return _guarded(args.command, lambda: args.func(args))


def _guarded(name: str, command: Callable[[], int | None]) -> int:
    """Run a subcommand: bad input is one line and exit 2, Ctrl-C exit 130, a
    closed pipe (``placer ... | head -1``) a quiet exit 141; a warning about
    an unknown key in a file is one line too."""
    def show(message, category, *rest, **kw):
        if issubclass(category, UnknownKeyWarning):
            print(f"placer {name}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, *rest, **kw)
    shown = warnings.showwarning
    warnings.showwarning = show
    try:
        return command() or 0
    except BrokenPipeError:
        # the reader went away: stop writing, and keep Python from reporting
        # the failed flush at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except PlacerError as exc:
        print(f"placer {name}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"placer {name}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    sys.exit(main())

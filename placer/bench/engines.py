"""The two engines side by side: built-in vs torch.distributed.pipelining.

For each plan, one set of gloo CPU ranks (one torch thread each, unpinned,
so neither engine busy-polls) runs the built-in engine and the pipelining
engine alternately, ``repeats`` times each, in the same processes: both see
the same load of the machine. Each run reports its median step time (a
step's time is its slowest rank's); ``ratio`` is pipelining over built-in
per repeat, reported as the median and the spread (min, max) over repeats.
Losses of the two engines are compared too (relative difference).

    placer bench runtime --suite engines -o docs/bench/engines.DATE.json
"""

from __future__ import annotations

import functools
import os
import statistics
import tempfile
import time

import torch

import placer
from placer import Plan, zoo

MODEL = "gpt-125m"
#: the benchmark model: 4 blocks, so an interleaved plan has 4 stages
CONFIG = dict(n_layer=4, n_head=4, d_model=128, vocab=512, max_seq=64)
BATCH, SEQ = 8, 32


def _build(batch=BATCH, seq=SEQ):
    return zoo.build(MODEL, batch=batch, seq=seq, **CONFIG)


def plans(graph) -> dict[str, Plan]:
    """The benchmark's plans over the module graph (2 ranks each)."""
    order = graph.topological_order()
    block = {op: int(op.split(".")[1]) if op.startswith("blocks.") else None for op in order}
    first = order.index("blocks.0")

    def by_block(devices_of, microbatches, schedule):
        place, current = {}, None
        for k, op in enumerate(order):
            if block[op] is not None:
                current = devices_of(block[op])
            elif current is None or k < first:
                current = devices_of(0)
            place[op] = list(current)
        return Plan(place, microbatches=microbatches, schedule=schedule)

    two = lambda b: ["a"] if b < 2 else ["b"]          # noqa: E731
    return {
        "pipeline-gpipe": by_block(two, 4, "gpipe"),
        "pipeline-1f1b": by_block(two, 4, "1f1b"),
        "interleaved-1f1b": by_block(lambda b: ["a"] if b % 2 == 0 else ["b"], 4, "1f1b"),
        "data-parallel": by_block(lambda b: ["a", "b"], 2, "1f1b"),
    }


def _child(rank, world, port, plan_dict, graph_dict, steps, warmup, repeats, out):
    import torch.distributed as dist

    from placer.graph import Graph
    from placer.runtime.rank_loop import run_rank
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model, inputs = _build()
    plan, graph = Plan.from_dict(plan_dict), Graph.from_dict(graph_dict)
    rows = []
    for rep in range(repeats):
        for engine in ("builtin", "pipelining"):
            res = run_rank(model, plan, inputs, steps=steps, warmup=warmup, graph=graph,
                           engine=engine, seed=0)
            if rank == 0:
                rows.append({"repeat": rep, "engine": engine,
                             "step_time": res["report"]["step_time"],
                             "step_times": res["report"]["step_times"], "loss": res["loss"],
                             "schedule_class": res["report"].get("schedule_class")})
    if rank == 0:
        torch.save(rows, out)
    dist.barrier()
    dist.destroy_process_group()


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return -1.0


def engines(steps: int = 10, warmup: int = 2, repeats: int = 5, only: list | None = None,
            progress: bool = True) -> dict:
    """Step time of both engines on the same plans; see the module doc."""
    import torch.multiprocessing as mp

    from placer.runtime.launch import free_port
    model, inputs = _build()
    graph = placer.trace(model, inputs, granularity="module")
    rows = []
    for name, plan in plans(graph).items():
        if only and name not in only:
            continue
        world = len(plan.devices_used())
        load = _load()
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="placer-engines-") as tmp:
            out = os.path.join(tmp, "rows.pt")
            mp.start_processes(_child, args=(world, free_port(), plan.to_dict(),
                                             graph.to_dict(), steps, warmup, repeats, out),
                               nprocs=world, start_method="spawn")
            runs = torch.load(out, weights_only=True)
        by = {(r["repeat"], r["engine"]): r for r in runs}
        ratios = [by[(k, "pipelining")]["step_time"] / by[(k, "builtin")]["step_time"]
                  for k in range(repeats)]
        loss_diff = max(abs(by[(k, "pipelining")]["loss"] - by[(k, "builtin")]["loss"])
                        / abs(by[(k, "builtin")]["loss"]) for k in range(repeats))
        med = statistics.median
        row = {"plan": name, "ranks": world, "microbatches": plan.microbatches,
               "schedule": plan.schedule,
               "schedule_class": by[(0, "pipelining")]["schedule_class"],
               "builtin_ms": med(by[(k, "builtin")]["step_time"] for k in range(repeats)) * 1e3,
               "pipelining_ms": med(by[(k, "pipelining")]["step_time"]
                                    for k in range(repeats)) * 1e3,
               "ratio": med(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
               "ratios": ratios, "loss_rel_diff": loss_diff, "load_before": load,
               "runs": runs}
        rows.append(row)
        if progress:
            print(f"{name}: built-in {row['builtin_ms']:.1f} ms, pipelining "
                  f"{row['pipelining_ms']:.1f} ms ({row['schedule_class']}), ratio "
                  f"{row['ratio']:.2f} [{row['ratio_min']:.2f}, {row['ratio_max']:.2f}] "
                  f"over {repeats} repeats; losses differ by {loss_diff:.1e} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    return {"model": MODEL, "config": CONFIG, "batch": BATCH, "seq": SEQ, "steps": steps,
            "warmup": warmup, "repeats": repeats, "torch": torch.__version__,
            "threads_per_rank": 1, "pinned": False, "plans": rows}

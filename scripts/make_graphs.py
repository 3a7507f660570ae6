#!/usr/bin/env python
"""Trace the zoo's standard configurations into datasets/graphs and write the
train/val/test split lists into datasets/splits.

    python scripts/make_graphs.py                # all models, both granularities
    python scripts/make_graphs.py gpt-125m moe   # some models
    python scripts/make_graphs.py --splits-only  # only rewrite the split lists

Each graph is ``datasets/graphs/MODEL.GRANULARITY.json.gz`` (placer.graph/v1,
gzipped), traced at the model's default batch and sequence length; models too
large for memory are traced on the meta device. The output is deterministic.

Splits hold out whole families: a policy trained on the train split is tested
on model families it never saw. Synthetic graphs are listed by name and
regenerated on demand by ``placer.datasets.graph``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import placer  # noqa: E402
from placer import datasets, zoo  # noqa: E402

GRANULARITIES = ("module", "op")

# Which model families go where (see placer/datasets.py).
SPLIT_FAMILIES = {
    "train": ("gpt", "bert", "resnet"),
    "val": ("utransformer",),
    "test": ("moe", "gnmt", "unet", "inception", "dlrm"),
}


def synthetic_names(which: str) -> list[str]:
    """The synthetic graphs of a split: train has layered and series-parallel
    DAGs, val random DAGs (a generator train never shows), test none."""
    names: list[str] = []
    if which == "train":
        for n in (50, 100, 200, 500, 1000):
            for width in (4, 8, 16):
                for seed in range(3):
                    names.append(f"layered-n{n}-w{width}-s{seed}")
            for seed in range(6):
                names.append(f"series_parallel-n{n}-s{seed}")
    elif which == "val":
        for n in (100, 200, 500):
            for width in (4, 8):
                for seed in range(2):
                    names.append(f"random_dag-n{n}-w{width}-s{seed}")
    return names


#: the out-of-family split (placer.generators): graph families and cluster
#: shapes no part of training draws from; every graph runs on every cluster
OOD_GRAPHS = ("opgraph-n2000-s0", "rnn-t32-l4-s0", "experts-e8-l4-s0", "experts-e16-l2-s1")
OOD_CLUSTERS = ("classes-d8-s0", "regions-d8-r4-s0", "classes-d12-s1")


def write_ood(split_dir: Path) -> None:
    """``ood.txt`` (graphs) and ``ood-clusters.txt`` (clusters)."""
    for name, items, what in (("ood", OOD_GRAPHS, "graph"), ("ood-clusters", OOD_CLUSTERS,
                                                              "cluster")):
        lines = [f"# out-of-family split: {what} names for placer.datasets.{what}(), one a "
                 "line.", "# Generated from their names by placer.generators; written by "
                 "scripts/make_graphs.py."]
        (split_dir / f"{name}.txt").write_text("\n".join(lines + list(items)) + "\n",
                                               encoding="utf-8")
    print(f"ood: {len(OOD_GRAPHS)} graphs x {len(OOD_CLUSTERS)} clusters")


def make_graph(model: str, granularity: str, out: Path) -> Path:
    module, inputs = datasets.model(model)
    graph = placer.trace(module, inputs, granularity=granularity,
                         name=f"{model}.{granularity}")
    batch, seq = zoo._batch_seq(zoo.entry(model), None, None, False)
    graph.meta.update({"zoo_model": model, "family": zoo.family(model),
                       "batch": batch, "seq": seq})
    path = out / f"{model}.{granularity}.json.gz"
    graph.save(path)
    return path


def write_splits(graph_dir: Path, split_dir: Path) -> None:
    traced = sorted(p.name.removesuffix(".json.gz") for p in graph_dir.glob("*.json.gz"))
    split_dir.mkdir(parents=True, exist_ok=True)
    for which, families in SPLIT_FAMILIES.items():
        real = [name for name in traced if datasets.family(name) in families]
        lines = [f"# {which} split: graph names for placer.datasets.graph(), one a line.",
                 f"# Model families: {', '.join(families)}; written by scripts/make_graphs.py."]
        lines += real + synthetic_names(which)
        (split_dir / f"{which}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{which}: {len(real)} traced + {len(synthetic_names(which))} synthetic")
    write_ood(split_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="zoo models (default: all)")
    parser.add_argument("--granularity", choices=GRANULARITIES, action="append",
                        help="trace only at this granularity (repeatable)")
    parser.add_argument("--out", type=Path, default=ROOT / "datasets")
    parser.add_argument("--splits-only", action="store_true")
    args = parser.parse_args(argv)
    graph_dir = args.out / "graphs"
    graph_dir.mkdir(parents=True, exist_ok=True)
    if not args.splits_only:
        for model in args.models or zoo.names():
            for granularity in args.granularity or GRANULARITIES:
                start = time.time()
                path = make_graph(model, granularity, graph_dir)
                print(f"{path.name}: {path.stat().st_size / 1e3:.0f} kB, "
                      f"{time.time() - start:.1f} s", flush=True)
    write_splits(graph_dir, args.out / "splits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

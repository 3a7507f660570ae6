"""placer's data sets: zoo models, traced graphs, synthetic DAGs, splits, clusters.

The data files ship inside the package (``datasets/`` in a checkout,
``placer/_data`` in a wheel):

- ``graphs/NAME.json.gz``: ``placer.graph/v1`` traces of zoo models, named
  ``MODEL.GRANULARITY`` (e.g. ``gpt-125m.module``);
- ``splits/{train,val,test}.txt``: graph names, one a line;
- ``clusters/NAME.yaml``: ``placer.cluster/v1`` scenarios.

Synthetic graphs are not stored: a name such as ``layered-n200-w8-s3`` is
regenerated on demand (deterministically) by :func:`graph`.

Splits hold out whole model families so a learned policy is tested on kinds of
models it never saw: train has GPT, BERT, ResNet and synthetic layered and
series-parallel DAGs; validation the U-Transformer and synthetic random DAGs;
test MoE, GNMT, U-Net, Inception and DLRM. The out-of-family split
(:func:`ood`) goes further: graph families and cluster shapes that no part
of training draws from (:mod:`placer.generators`: operator-level graphs,
unrolled recurrences, expert-parallel layers; clusters with speed classes,
sites and slow links), regenerated from their names like the synthetic ones.

>>> g = layered(40, width=4, seed=1)
>>> len(g), g.name
(40, 'layered-n40-w4-s1')
>>> graph("layered-n40-w4-s1").fingerprint() == g.fingerprint()
True
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from ._paths import data_dir
from .cluster import Cluster
from .errors import GraphError
from .graph import Edge, Graph, Op

__all__ = ["models", "model", "family", "graphs", "graph", "layered", "series_parallel",
           "random_dag", "split", "splits", "ood", "clusters", "cluster", "SPLITS"]

SPLITS = ("train", "val", "test")


# --- models ------------------------------------------------------------------

def models() -> list[str]:
    """Names of the zoo models (see :mod:`placer.zoo`).

    >>> {"gpt-125m", "resnet50", "moe"} <= set(models())
    True
    """
    from . import zoo
    return zoo.names()


def model(name: str, batch: int | None = None, seq: int | None = None,
          device=None, *, tiny: bool = False, **overrides):
    """Build zoo model ``name``: returns ``(module, example_inputs_tuple)``.

    ``batch`` and ``seq`` default per family (GPT: 8 x 1024; ``seq`` is the
    image side for CNNs and indices per bag for DLRM). ``overrides`` change
    config fields (``n_layer=2, d_model=64``); ``tiny=True`` gives a
    seconds-fast test size. Models whose parameters exceed ~1e9 bytes, or
    ``device="meta"``, are built on the meta device without allocating.

    >>> module, (idx,) = model("gpt-125m", batch=2, seq=8, tiny=True)
    >>> tuple(module(idx).shape)
    (2, 8, 128)
    """
    from . import zoo
    return zoo.build(name, batch, seq, device, tiny=tiny, **overrides)


# --- graphs --------------------------------------------------------------------

def _graph_dir():
    return data_dir() / "graphs"


def graphs() -> list[str]:
    """Names of the shipped traced graphs (``MODEL.GRANULARITY``).

    >>> {"gpt-125m.module", "gpt-125m.op"} <= set(graphs())
    True
    """
    folder = _graph_dir()
    if not folder.is_dir():
        return []
    out = [p.name.removesuffix(".gz").removesuffix(".json")
           for p in folder.iterdir() if p.name.endswith((".json", ".json.gz"))]
    return sorted(out)


_SYNTHETIC = re.compile(r"^(layered|random_dag)-n(\d+)-w(\d+)-s(\d+)$|"
                        r"^(series_parallel)-n(\d+)-s(\d+)$")


def graph(name: str) -> Graph:
    """Load shipped graph ``name`` or regenerate synthetic graph ``name``.

    Synthetic names are ``layered-nN-wW-sS``, ``random_dag-nN-wW-sS`` and
    ``series_parallel-nN-sS``.

    >>> graph("gpt-125m.module")
    Graph('gpt-125m.module', ops=19, edges=18, flops=2.33e+12)
    >>> len(graph("random_dag-n30-w4-s0"))
    30
    """
    match = _SYNTHETIC.match(name)
    if match:
        if match.group(1):
            kind, n, w, s = match.group(1, 2, 3, 4)
            return _GENERATORS[kind](int(n), int(w), int(s))
        n, s = match.group(6, 7)
        return series_parallel(int(n), int(s))
    from . import generators
    if generators.is_graph(name):
        return generators.graph(name)
    folder = _graph_dir()
    for suffix in (".json.gz", ".json"):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return Graph.load(path)
    known = graphs()
    raise GraphError(f"unknown graph {name!r}",
                     fix=f"use one of: {', '.join(known) or '(none shipped)'}, or a synthetic "
                         "name like layered-n200-w8-s0")


def family(name: str) -> str:
    """The model family of a graph or zoo model name: ``"gpt"`` for
    ``gpt-1.3b.op``, ``"synthetic-layered"`` for ``layered-n40-w4-s1``.

    >>> family("gpt-1.3b.module"), family("series_parallel-n50-s0")
    ('gpt', 'synthetic-series_parallel')
    """
    match = _SYNTHETIC.match(name)
    if match:
        return "synthetic-" + (match.group(1) or match.group(5))
    from . import generators
    if generators.is_graph(name):
        return "ood-" + name.split("-", 1)[0]
    from . import zoo
    known = zoo.names()
    base = name
    while base not in known and "." in base:
        base = base.rsplit(".", 1)[0]
    if base in known:
        return zoo.family(base)
    raise GraphError(f"cannot tell the family of {name!r}",
                     fix="use a zoo model name, MODEL.GRANULARITY or a synthetic name")


# --- splits --------------------------------------------------------------------

def split(which: str) -> list[str]:
    """Graph names of split ``which`` (``"train"``, ``"val"`` or ``"test"``);
    each loads with :func:`graph`.

    >>> "gpt-125m.module" in split("train"), "moe.module" in split("test")
    (True, True)
    """
    if which not in SPLITS:
        raise ValueError(f"unknown split {which!r}; use one of {', '.join(SPLITS)}")
    return _names(data_dir() / "splits" / f"{which}.txt")


def ood() -> dict[str, list[str]]:
    """The out-of-family split: ``{"graphs": [...], "clusters": [...]}``,
    names for :func:`graph` and :func:`cluster` (``splits/ood.txt`` and
    ``splits/ood-clusters.txt``); every graph is benchmarked on every cluster.

    >>> parts = ood()
    >>> family(parts["graphs"][0]).startswith("ood-"), len(cluster(parts["clusters"][0])) > 1
    (True, True)
    """
    return {"graphs": _names(data_dir() / "splits" / "ood.txt"),
            "clusters": _names(data_dir() / "splits" / "ood-clusters.txt")}


def _names(path) -> list[str]:
    """Names in a list file, one a line (``#`` comments)."""
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def splits() -> dict[str, list[str]]:
    """All splits: ``{"train": [...], "val": [...], "test": [...]}``.

    >>> parts = splits()
    >>> list(parts), set(parts["train"]) & set(parts["test"])
    (['train', 'val', 'test'], set())
    """
    return {which: split(which) for which in SPLITS}


# --- clusters ------------------------------------------------------------------

def clusters() -> list[str]:
    """Names of the shipped cluster scenarios (= ``Cluster.presets()``).

    >>> "dtfm-worldwide" in clusters()
    True
    """
    return Cluster.presets()


def cluster(name: str) -> Cluster:
    """Shipped cluster scenario ``name`` (= ``Cluster.preset(name)``), or an
    out-of-family cluster regenerated from its name (``classes-dD-sS``,
    ``regions-dD-rR-sS``: :mod:`placer.generators`).

    >>> cluster("a100x8")
    Cluster('a100x8', devices=8, sites=1, flops=2.5e+15)
    >>> len(cluster("regions-d8-r4-s0").sites())
    4
    """
    from . import generators
    if generators.is_cluster(name):
        return generators.cluster(name)
    return Cluster.preset(name)


# --- synthetic graphs --------------------------------------------------------------
#
# Costs mimic one training step of a real network: the graph draws a token
# count and a hidden width, and each op's kind decides its cost from them, so
# matmuls carry most FLOPs and parameters, element-wise ops cost no FLOPs but
# move whole activations, and normalisations are cheap with few parameters.

_BYTES = 4.0  # fp32


class _Costs:
    """Samples op kinds and costs for one synthetic graph."""

    KINDS = ("linear", "conv", "matmul", "relu", "gelu", "add", "layernorm", "softmax",
             "dropout")
    WEIGHTS = (0.24, 0.06, 0.04, 0.15, 0.10, 0.10, 0.13, 0.06, 0.12)

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.tokens = float(2 ** rng.integers(9, 15))          # 512 .. 16384
        self.hidden = float(2 ** rng.integers(8, 13))          # 256 .. 4096
        self.p = np.array(self.WEIGHTS) / sum(self.WEIGHTS)

    def width(self, width_in: float) -> float:
        # Like transformer/CNN blocks: wide inputs project back to the model
        # width; otherwise mostly keep it, sometimes expand (MLP) or narrow.
        if width_in > self.hidden:
            return self.hidden
        return self.hidden * float(self.rng.choice([1, 1, 1, 3, 4, 0.5]))

    def op(self, op_id: str, width_in: float, joins: int) -> Op:
        rng = self.rng
        if joins > 1:
            kind = "add" if rng.random() < 0.8 else "concat"
        elif joins == 0 and rng.random() < 0.5:
            kind = "embedding"                                 # inputs: token tables
        else:
            kind = str(rng.choice(self.KINDS, p=self.p))
        # Widths stay within what real layers use, however ops are joined.
        width_in = min(width_in, 4.0 * self.hidden)
        width_out = width_in
        flops = params = 0.0
        noise = float(rng.lognormal(0.0, 0.25))                # per-op shape jitter
        if kind in ("linear", "conv", "matmul"):
            width_out = self.width(width_in)
            flops = 2.0 * self.tokens * width_in * width_out * noise
            if kind == "conv":
                flops *= 9.0                                   # 3x3 kernel
                params = 9.0 * width_in * width_out * _BYTES
            elif kind == "linear":
                params = (width_in * width_out + width_out) * _BYTES
        elif kind == "embedding":
            vocab = float(rng.lognormal(np.log(3e4), 1.0))
            params = vocab * self.hidden * _BYTES
            width_out = self.hidden
        elif kind in ("layernorm", "softmax"):
            flops = 5.0 * self.tokens * width_in
            if kind == "layernorm":
                params = 2.0 * width_in * _BYTES
        elif kind == "concat":
            width_out = min(width_in * joins, 4.0 * self.hidden)
        output = self.tokens * width_out * _BYTES
        return Op(op_id, kind, flops=float(flops), param_bytes=float(params),
                  output_bytes=float(output))


def _assemble(name: str, preds: list[list[int]], rng: np.random.Generator,
              meta: dict) -> Graph:
    """Ops in topological order 0..n-1 with ``preds[i]`` (all < i); costs drawn
    in that order so widths flow from producers to consumers."""
    costs = _Costs(rng)
    ops: list[Op] = []
    width: list[float] = []
    edges: list[Edge] = []
    for i, ps in enumerate(preds):
        w_in = max((width[p] for p in ps), default=costs.hidden)
        op = costs.op(f"op{i}", w_in, len(ps))
        ops.append(op)
        width.append(op.output_bytes / (costs.tokens * _BYTES))
        edges.extend(Edge(f"op{p}", op.id, ops[p].output_bytes) for p in ps)
    meta = dict(meta, synthetic=True, tokens=costs.tokens, hidden=costs.hidden)
    return Graph(name, ops, edges, meta=meta)


def _check(n: int, width: int | None = None) -> None:
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if width is not None and (int(width) != width or width < 1):
        raise ValueError(f"width must be a positive integer, got {width!r}")


def layered(n: int, width: int = 8, seed: int = 0) -> Graph:
    """A layered DAG of exactly ``n`` ops: layers of 1..``width`` ops, each op
    fed by 1-3 ops of the layer before and now and then by a residual skip
    from an earlier layer (like stacked network blocks).

    >>> g = layered(30, width=3, seed=0)
    >>> len(g), max(len(v) for v in _layers(g).values()) <= 3
    (30, True)
    """
    _check(n, width)
    rng = np.random.default_rng([0, seed, n, width])
    layers: list[list[int]] = []
    count = 0
    while count < n:
        size = int(min(n - count, rng.integers(1, width + 1)))
        layers.append(list(range(count, count + size)))
        count += size
    preds: list[list[int]] = [[] for _ in range(n)]
    for depth in range(1, len(layers)):
        before = layers[depth - 1]
        for i in layers[depth]:
            k = int(min(len(before), rng.integers(1, 4)))
            chosen = set(int(x) for x in rng.choice(before, size=k, replace=False))
            if depth >= 2 and rng.random() < 0.15:
                chosen.add(int(rng.choice(layers[int(rng.integers(0, depth - 1))])))
            preds[i] = sorted(chosen)
    return _assemble(f"layered-n{n}-w{width}-s{seed}", preds, rng,
                     {"generator": "layered", "seed": seed, "width": width})


def series_parallel(n: int, seed: int = 0) -> Graph:
    """A two-terminal series-parallel DAG of exactly ``n`` ops, grown from one
    edge by random series steps (split an edge u->v into u->w->v) and parallel
    steps (add a branch u->w->v beside it): the fork-join shape of
    multi-branch networks such as Inception.

    >>> g = series_parallel(25, seed=3)
    >>> len(g), len([o for o in g.ids if not g.predecessors(o)])
    (25, 1)
    """
    _check(n)
    rng = np.random.default_rng([1, seed, n])
    if n == 1:
        return _assemble(f"series_parallel-n1-s{seed}", [[]], rng,
                         {"generator": "series_parallel", "seed": seed})
    succ: dict[int, list[int]] = {0: [1], 1: []}
    edges: list[tuple[int, int]] = [(0, 1)]
    for w in range(2, n):
        u, v = edges[int(rng.integers(len(edges)))]
        if rng.random() < 0.55:
            edges.remove((u, v))
            succ[u].remove(v)
        succ[u].append(w)
        succ[w] = [v]
        edges.extend([(u, w), (w, v)])
    # Number the ops in a topological order (Kahn, smallest label first).
    indeg = {x: 0 for x in succ}
    for u in succ:
        for v in succ[u]:
            indeg[v] += 1
    ready = sorted(x for x in succ if indeg[x] == 0)
    order: list[int] = []
    while ready:
        x = ready.pop(0)
        order.append(x)
        for v in sorted(succ[x]):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
        ready.sort()
    rank = {x: i for i, x in enumerate(order)}
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        preds[rank[v]].append(rank[u])
    preds = [sorted(set(p)) for p in preds]
    return _assemble(f"series_parallel-n{n}-s{seed}", preds, rng,
                     {"generator": "series_parallel", "seed": seed})


def random_dag(n: int, width: int = 8, seed: int = 0) -> Graph:
    """A random DAG of exactly ``n`` ops: op i is fed by 1-3 ops drawn from the
    ``width`` ops before it (so at most about ``width`` ops can run at once),
    with an occasional long-range edge from anywhere earlier.

    >>> g = random_dag(50, width=5, seed=2)
    >>> len(g), all(g.predecessors(f"op{i}") for i in range(1, 50))
    (50, True)
    """
    _check(n, width)
    rng = np.random.default_rng([2, seed, n, width])
    preds: list[list[int]] = [[]]
    for i in range(1, n):
        window = np.arange(max(0, i - width), i)
        k = int(min(len(window), 1 + rng.binomial(2, 0.3)))
        chosen = set(int(x) for x in rng.choice(window, size=k, replace=False))
        if i > width and rng.random() < 0.05:
            chosen.add(int(rng.integers(0, i - width)))
        preds.append(sorted(chosen))
    return _assemble(f"random_dag-n{n}-w{width}-s{seed}", preds, rng,
                     {"generator": "random_dag", "seed": seed, "width": width})


_GENERATORS: dict[str, Callable[..., Graph]] = {"layered": layered,
                                                "random_dag": random_dag}


def _layers(g: Graph) -> dict[int, list[str]]:
    """Ops by depth (longest path from a source)."""
    out: dict[int, list[str]] = {}
    for op_id, depth in g.depths().items():
        out.setdefault(depth, []).append(op_id)
    return out

"""Out-of-family graphs and clusters: shapes the learned policy never trains on.

Graphs (one training step, fp32; regenerated from their names, like the
synthetic graphs of :mod:`placer.datasets`):

- ``opgraph-nN-sS`` (:func:`op_graph`): an operator-level graph of ``N``
  small ops with skewed costs, as profilers of other tools export them
  (most ops element-wise and nearly free, a few matmuls carrying the FLOPs,
  FLOPs spread over four orders of magnitude);
- ``rnn-tT-lL-sS`` (:func:`unrolled_rnn`): an LSTM unrolled over ``T``
  steps with ``L`` layers; each layer's cells share one weight (they are
  colocated), so a plan is a wavefront pipeline over the layers;
- ``experts-eE-lL-sS`` (:func:`expert_layers`): ``L`` transformer blocks
  whose MLP is ``E`` parallel experts behind a router (expert parallelism:
  each expert is a branch holding its own weights).

Clusters (:func:`speed_classes`, :func:`regions`):

- ``classes-dD-sS``: ``D`` GPUs of two speed classes (3-8x apart) in three
  sites, with one site pair joined by a link 8x slower than the others;
- ``regions-dD-rR-sS``: ``D`` GPUs in ``R`` cloud regions, WAN links between
  regions (10-80 ms) of which one or two are 5-10x slower.

>>> g = unrolled_rnn(4, 2, seed=0)
>>> len(g), g.name, len(g.colocation_groups())
(17, 'rnn-t4-l2-s0', 4)
>>> c = cluster("classes-d6-s0")
>>> len(c), len(c.sites())
(6, 3)
"""

from __future__ import annotations

import re

import numpy as np

from .cluster import Cluster, Device
from .graph import Edge, Graph, Op

__all__ = ["op_graph", "unrolled_rnn", "expert_layers", "speed_classes", "regions",
           "graph", "cluster", "is_graph", "is_cluster"]

_BYTES = 4.0
_GRAPHS = re.compile(r"^(?:opgraph-n(\d+)-s(\d+)|rnn-t(\d+)-l(\d+)-s(\d+)|"
                     r"experts-e(\d+)-l(\d+)-s(\d+))$")
_CLUSTERS = re.compile(r"^(?:classes-d(\d+)-s(\d+)|regions-d(\d+)-r(\d+)-s(\d+))$")

#: GPU kinds the cluster generators draw from: (kind, FLOP/s, memory bytes),
#: dense fp16 tensor-core peaks from NVIDIA's datasheets
GPUS = (("H100-SXM", 9.89e14, 8.0e10), ("A100-80GB", 3.12e14, 8.0e10),
        ("A100-40GB", 3.12e14, 4.0e10), ("A10", 1.25e14, 2.4e10), ("L4", 1.21e14, 2.4e10),
        ("V100-16GB", 1.12e14, 1.6e10), ("T4", 6.5e13, 1.6e10))


def is_graph(name: str) -> bool:
    """Whether ``name`` is an out-of-family graph name."""
    return bool(_GRAPHS.match(name))


def is_cluster(name: str) -> bool:
    """Whether ``name`` is an out-of-family cluster name."""
    return bool(_CLUSTERS.match(name))


def graph(name: str) -> Graph:
    """The out-of-family graph ``name`` (see the module doc)."""
    m = _GRAPHS.match(name)
    if not m:
        raise ValueError(f"not an out-of-family graph name: {name!r}")
    v = [None if x is None else int(x) for x in m.groups()]
    if v[0] is not None:
        return op_graph(v[0], v[1])
    if v[2] is not None:
        return unrolled_rnn(v[2], v[3], v[4])
    return expert_layers(v[5], v[6], v[7])


def cluster(name: str) -> Cluster:
    """The out-of-family cluster ``name`` (see the module doc)."""
    m = _CLUSTERS.match(name)
    if not m:
        raise ValueError(f"not an out-of-family cluster name: {name!r}")
    v = [None if x is None else int(x) for x in m.groups()]
    if v[0] is not None:
        return speed_classes(v[0], v[1])
    return regions(v[2], v[3], v[4])


def _positive(**values) -> None:
    for label, value in values.items():
        if int(value) != value or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")


# --- graphs --------------------------------------------------------------------

def op_graph(n: int, seed: int = 0) -> Graph:
    """``n`` small ops in topological order, each fed by one or two of the
    eight before it (now and then by a long skip): 85% element-wise (no
    FLOPs, an activation out), 12% matmuls with lognormal sizes (sigma
    1.5: a few carry most of the FLOPs and parameters), 3% reductions.

    >>> g = op_graph(300, seed=1)
    >>> len(g), g.name, g.meta["batch"]
    (300, 'opgraph-n300-s1', 16)
    """
    _positive(n=n)
    rng = np.random.default_rng([26, 1, seed, n])
    tokens = float(2 ** rng.integers(11, 14))
    hidden = float(2 ** rng.integers(9, 12))
    ops, edges = [], []
    for i in range(n):
        r = rng.random()
        width = hidden * float(rng.choice([0.25, 0.5, 1.0, 1.0, 2.0]))
        out = tokens * width * _BYTES
        if i == 0 or r < 0.12:
            size = float(rng.lognormal(0.0, 1.5))
            k_in, k_out = hidden * min(size, 16.0), width
            flops = 2.0 * tokens * k_in * k_out
            op = Op(f"op{i}", "matmul", flops=flops, param_bytes=k_in * k_out * _BYTES,
                    output_bytes=out)
        elif r < 0.15:
            op = Op(f"op{i}", "reduce", flops=tokens * width, output_bytes=out / 8)
        else:
            op = Op(f"op{i}", str(rng.choice(["add", "mul", "relu", "cast", "view"])),
                    flops=0.0, output_bytes=out)
        ops.append(op)
        if i:
            window = np.arange(max(0, i - 8), i)
            k = int(min(len(window), 1 + (rng.random() < 0.3)))
            preds = set(int(x) for x in rng.choice(window, size=k, replace=False))
            if i > 16 and rng.random() < 0.03:
                preds.add(int(rng.integers(0, i - 8)))
            edges += [Edge(f"op{p}", op.id, ops[p].output_bytes) for p in sorted(preds)]
    return Graph(f"opgraph-n{n}-s{seed}", ops, edges,
                 meta={"generator": "opgraph", "seed": seed, "batch": 16, "synthetic": True})


def unrolled_rnn(steps: int, layers: int, seed: int = 0) -> Graph:
    """An LSTM over ``steps`` time steps with ``layers`` layers, unrolled: an
    embedding lookup per step, a cell per step and layer fed by the cell
    before it in time and the one below it, a projection per step and one
    loss. The cells of a layer share its weights (colocated, parameters on
    the first), as do the lookups and the projections.

    >>> g = unrolled_rnn(3, 2)
    >>> sorted(g.colocation_groups())
    ['embed', 'layer0', 'layer1', 'proj']
    """
    _positive(steps=steps, layers=layers)
    rng = np.random.default_rng([26, 2, seed, steps, layers])
    batch = float(2 ** rng.integers(5, 8))
    hidden = float(2 ** rng.integers(9, 12))
    vocab = float(rng.choice([8000, 16000, 32000]))
    h_bytes = batch * hidden * _BYTES
    ops, edges = [], []
    for t in range(steps):
        ops.append(Op(f"embed{t}", "embedding", param_bytes=vocab * hidden * _BYTES if t == 0
                      else 0.0, output_bytes=h_bytes, colocate="embed"))
        for layer in range(layers):
            cell = f"cell{t}.{layer}"
            ops.append(Op(cell, "lstm_cell", flops=2.0 * batch * (2 * hidden) * (4 * hidden),
                          param_bytes=8 * hidden * hidden * _BYTES if t == 0 else 0.0,
                          output_bytes=2 * h_bytes, colocate=f"layer{layer}"))
            below = f"embed{t}" if layer == 0 else f"cell{t}.{layer - 1}"
            edges.append(Edge(below, cell, h_bytes))
            if t:
                edges.append(Edge(f"cell{t - 1}.{layer}", cell, 2 * h_bytes))
        ops.append(Op(f"proj{t}", "linear", flops=2.0 * batch * hidden * vocab,
                      param_bytes=hidden * vocab * _BYTES if t == 0 else 0.0,
                      output_bytes=batch * vocab * _BYTES, colocate="proj"))
        edges.append(Edge(f"cell{t}.{layers - 1}", f"proj{t}", h_bytes))
    ops.append(Op("loss", "cross_entropy", flops=5.0 * batch * vocab * steps,
                  output_bytes=_BYTES))
    edges += [Edge(f"proj{t}", "loss", batch * vocab * _BYTES) for t in range(steps)]
    return Graph(f"rnn-t{steps}-l{layers}-s{seed}", ops, edges,
                 meta={"generator": "rnn", "seed": seed, "batch": int(batch),
                       "synthetic": True})


def expert_layers(experts: int, layers: int, seed: int = 0) -> Graph:
    """``layers`` transformer blocks with a mixture-of-experts MLP: attention
    (qkv, scores, projection, residual, norm), then a router feeding
    ``experts`` parallel experts (up projection, activation, down
    projection; each its own weights, top-2 routing: each sees 2/E of the
    tokens) whose outputs a combine op adds, then a norm.

    >>> g = expert_layers(4, 2)
    >>> len(g), sum(o.op == "expert_up" for o in g)
    (42, 8)
    """
    _positive(experts=experts, layers=layers)
    rng = np.random.default_rng([26, 3, seed, experts, layers])
    tokens = float(2 ** rng.integers(11, 14))
    d = float(2 ** rng.integers(9, 12))
    act = tokens * d * _BYTES
    share = tokens * min(2.0 / experts, 1.0)
    ops = [Op("embed", "embedding", param_bytes=32000 * d * _BYTES, output_bytes=act)]
    edges = []
    last = "embed"
    for b in range(layers):
        p = f"b{b}."
        ops += [Op(p + "qkv", "linear", flops=2 * tokens * d * 3 * d,
                   param_bytes=3 * d * d * _BYTES, output_bytes=3 * act),
                Op(p + "attn", "matmul", flops=4 * tokens * d * 1024, output_bytes=act),
                Op(p + "proj", "linear", flops=2 * tokens * d * d, param_bytes=d * d * _BYTES,
                   output_bytes=act),
                Op(p + "add1", "add", output_bytes=act),
                Op(p + "ln1", "layernorm", flops=5 * tokens * d, param_bytes=2 * d * _BYTES,
                   output_bytes=act),
                Op(p + "router", "linear", flops=2 * tokens * d * experts,
                   param_bytes=d * experts * _BYTES, output_bytes=act)]
        edges += [Edge(last, p + "qkv", act), Edge(p + "qkv", p + "attn", 3 * act),
                  Edge(p + "attn", p + "proj", act), Edge(p + "proj", p + "add1", act),
                  Edge(last, p + "add1", act), Edge(p + "add1", p + "ln1", act),
                  Edge(p + "ln1", p + "router", act)]
        for e in range(experts):
            q = f"{p}e{e}."
            ff = 4 * d * float(rng.uniform(0.75, 1.25))
            part = share * d * _BYTES
            ops += [Op(q + "up", "expert_up", flops=2 * share * d * ff,
                       param_bytes=d * ff * _BYTES, output_bytes=share * ff * _BYTES),
                    Op(q + "gelu", "gelu", output_bytes=share * ff * _BYTES),
                    Op(q + "down", "expert_down", flops=2 * share * ff * d,
                       param_bytes=ff * d * _BYTES, output_bytes=part)]
            edges += [Edge(p + "router", q + "up", part),
                      Edge(q + "up", q + "gelu", share * ff * _BYTES),
                      Edge(q + "gelu", q + "down", share * ff * _BYTES),
                      Edge(q + "down", p + "combine", part)]
        ops.append(Op(p + "combine", "add", output_bytes=act))
        ops.append(Op(p + "ln2", "layernorm", flops=5 * tokens * d, param_bytes=2 * d * _BYTES,
                      output_bytes=act))
        edges += [Edge(p + "combine", p + "ln2", act), Edge(p + "ln1", p + "combine", act)]
        last = p + "ln2"
    ops.append(Op("head", "linear", flops=2 * tokens * d * 32000,
                  param_bytes=d * 32000 * _BYTES, output_bytes=tokens * 32000 * _BYTES / 16))
    edges.append(Edge(last, "head", act))
    return Graph(f"experts-e{experts}-l{layers}-s{seed}", ops, edges,
                 meta={"generator": "experts", "seed": seed, "batch": 8, "synthetic": True})


# --- clusters ----------------------------------------------------------------------

def _gpu(rng, kinds) -> tuple:
    return kinds[int(rng.integers(len(kinds)))]


def speed_classes(n: int, seed: int = 0) -> Cluster:
    """``n`` GPUs in three sites: a fast class (H100/A100) and a slow one
    (3-8x fewer FLOP/s: A10, L4, V100, T4), by site; links inside a site
    25-100 GB/s, between sites 1.25-5 GB/s, and one site pair 8x slower
    with 10x the latency.

    >>> c = speed_classes(8, seed=1)
    >>> rates = sorted({d.flops for d in c.devices})
    >>> rates[-1] / rates[0] >= 3
    True
    """
    _positive(n=n)
    rng = np.random.default_rng([26, 11, seed, n])
    fast_kinds, slow_kinds = GPUS[:3], GPUS[3:]
    sites = ["s0", "s1", "s2"]
    devices = []
    fast = _gpu(rng, fast_kinds)
    slow = _gpu(rng, slow_kinds)
    while fast[1] / slow[1] < 3:
        slow = _gpu(rng, slow_kinds)
    for i in range(n):
        site = sites[min(i * 3 // n, 2)] if n >= 3 else sites[i]
        kind, flops, memory = fast if site != "s1" else slow
        if n >= 3 and site == "s2" and rng.random() < 0.5:
            kind, flops, memory = slow
        devices.append(Device(f"g{i}", flops, memory, site=site, kind=kind))
    used = sorted({d.site for d in devices})
    inside = [(s, s, float(rng.uniform(2.5e10, 1e11)), 1e-5) for s in used]
    between = float(rng.uniform(1.25e9, 5e9))
    rules = []
    pairs = [(a, b) for i, a in enumerate(used) for b in used[i + 1:]]
    slow_pair = pairs[int(rng.integers(len(pairs)))] if pairs else None
    for a, b in pairs:
        bw, lat = between, float(rng.uniform(1e-4, 1e-3))
        if (a, b) == slow_pair:
            bw, lat = bw / 8, lat * 10
        rules.append((a, b, bw, lat))
    return Cluster.from_rules(f"classes-d{n}-s{seed}", devices, default=(between, 5e-4),
                              sites=inside + rules,
                              meta={"generator": "classes", "seed": seed})


def regions(n: int, r: int = 4, seed: int = 0) -> Cluster:
    """``n`` GPUs over ``r`` cloud regions (one GPU kind per region) joined
    by WAN links: 0.4-2.5 GB/s and 10-80 ms between regions, one or two
    region pairs 5-10x slower; 12.5 GB/s and 10 us inside a region.

    >>> c = regions(8, 4)
    >>> len(c), len(c.sites())
    (8, 4)
    """
    _positive(n=n, r=r)
    r = min(r, n)
    rng = np.random.default_rng([26, 12, seed, n, r])
    names = [f"region{k}" for k in range(r)]
    kinds = [_gpu(rng, GPUS) for _ in range(r)]
    devices = []
    for i in range(n):
        k = i * r // n
        kind, flops, memory = kinds[k]
        devices.append(Device(f"g{i}", flops, memory, site=names[k], kind=kind))
    inside = [(s, s, 1.25e10, 1e-5) for s in names]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    slow = set()
    if pairs:
        count = min(len(pairs), 1 + int(rng.random() < 0.5))
        slow = {pairs[int(j)] for j in rng.choice(len(pairs), size=count, replace=False)}
    rules = []
    for a, b in pairs:
        bw = float(np.exp(rng.uniform(np.log(4e8), np.log(2.5e9))))
        lat = float(rng.uniform(0.01, 0.08))
        if (a, b) in slow:
            bw /= float(rng.uniform(5, 10))
        rules.append((a, b, bw, lat))
    return Cluster.from_rules(f"regions-d{n}-r{r}-s{seed}", devices, default=(1e9, 0.03),
                              sites=inside + rules,
                              meta={"generator": "regions", "seed": seed})

"""Training problems: held-out clusters, perturbed random clusters, the
heuristic reference each reward is measured against, and plan scoring.

Clusters are held out like model families: :data:`TRAIN_CLUSTERS` are seen in
training (as they are and as perturbed random subsets of them),
:data:`TEST_CLUSTERS` only in evaluation.
"""

from __future__ import annotations

import math

import numpy as np

from placer.cluster import Cluster, Device
from placer.cost import INFEASIBLE

__all__ = ["TRAIN_CLUSTERS", "TEST_CLUSTERS", "random_cluster", "random_graph",
           "microbatch_choices",
           "best_times", "times_at", "reference_time", "reference", "reward",
           "pipeline_assignments", "even_pipelines", "site_devices", "site_pipelines",
           "site_replicas", "colocated"]

TRAIN_CLUSTERS = ("a100x8", "two-sites", "dtfm-datacenter-ondemand", "dtfm-regional",
                  "dtfm-multi-universities")
TEST_CLUSTERS = ("hetero-lab", "edge-wireless", "ib-4x8-a100", "dtfm-worldwide",
                 "dtfm-datacenter-spot")


def random_cluster(rng: np.random.Generator, bases: list[Cluster], max_devices: int = 16,
                   name: str = "random", wide: bool = False) -> Cluster:
    """A perturbed random subset of one of ``bases``: 2..``max_devices``
    devices, speeds and memories scaled by 0.5-1.5 each, links by 0.3-3 (per
    site pair, symmetric) and latencies by 0.5-2. ``wide`` randomises
    further (domain randomisation for clusters unlike the bases): the
    devices of a random half of the sites slowed to a second speed class
    (0.12-0.4x), links scaled by 0.02-3 and one site pair 5-10x slower
    still, latencies by 0.5-20."""
    if wide:
        return _wide(rng, random_cluster(rng, bases, max_devices, name), name)
    base = bases[int(rng.integers(len(bases)))]
    n = int(rng.integers(2, min(max_devices, len(base)) + 1))
    idx = np.sort(rng.choice(len(base), size=n, replace=False))
    devices = []
    for j, i in enumerate(idx.tolist()):
        d = base.devices[i]
        devices.append(Device(f"d{j}", d.flops * float(rng.uniform(0.5, 1.5)),
                              d.memory * float(rng.uniform(0.5, 1.5)), site=d.site,
                              kind=d.kind, efficiency=d.efficiency))
    sites = sorted({d.site for d in devices})
    s = np.array([sites.index(d.site) for d in devices])
    scale = np.exp(rng.uniform(math.log(0.3), math.log(3.0), size=(len(sites), len(sites))))
    scale = np.sqrt(scale * scale.T)
    lat_scale = float(rng.uniform(0.5, 2.0))
    bw = np.array(base.bandwidth)[np.ix_(idx, idx)] * scale[s][:, s]
    lat = np.array(base.latency)[np.ix_(idx, idx)] * lat_scale
    np.fill_diagonal(bw, 1.0)
    return Cluster(f"{name}-{base.name}-{n}", devices, bw, lat)


def _wide(rng: np.random.Generator, c: Cluster, name: str) -> Cluster:
    """``c`` with a second speed class, wider link ratios and one slow site
    pair (see :func:`random_cluster`); sites are split in two when there is
    only one, so that there are site pairs to slow."""
    devices = list(c.devices)
    sites = sorted({d.site for d in devices})
    if len(sites) == 1 and len(devices) > 1:
        half = len(devices) // 2
        devices = [Device(d.name, d.flops, d.memory, site=f"{d.site}-{int(i >= half)}",
                          kind=d.kind, efficiency=d.efficiency)
                   for i, d in enumerate(devices)]
        sites = sorted({d.site for d in devices})
    slow = set(rng.choice(sites, size=max(1, len(sites) // 2), replace=False).tolist()) \
        if len(sites) > 1 else set()
    factor = float(rng.uniform(0.12, 0.4))
    devices = [Device(d.name, d.flops * (factor if d.site in slow else 1.0), d.memory,
                      site=d.site, kind=d.kind, efficiency=d.efficiency) for d in devices]
    s = np.array([sites.index(d.site) for d in devices])
    n_sites = len(sites)
    scale = np.exp(rng.uniform(math.log(0.02), math.log(3.0), size=(n_sites, n_sites)))
    scale = np.sqrt(scale * scale.T)
    np.fill_diagonal(scale, 1.0)
    if n_sites > 1:
        a, b = rng.choice(n_sites, size=2, replace=False)
        extra = float(rng.uniform(5, 10))
        scale[a, b] /= extra
        scale[b, a] /= extra
    bw = np.array(c.bandwidth) * scale[s][:, s]
    lat = np.array(c.latency) * float(np.exp(rng.uniform(math.log(0.5), math.log(20.0))))
    np.fill_diagonal(bw, 1.0)
    return Cluster(f"{name}-wide-{c.name}", devices, bw, lat)


def random_graph(rng: np.random.Generator, graph, name: str = "random"):
    """Domain randomisation of a training graph (its ops and edges kept):
    op costs skewed by lognormal factors (sigma 0.5-1.5, the total FLOPs
    kept), so that a few ops carry most of the work, as in operator-level
    graphs; and, half the time, 2-8 groups of 2-6 ops of one kind sharing
    their weights (colocated, the parameters on the first member), as in
    an unrolled recurrence or tied embeddings, which no training family
    has. The out-of-family generators themselves are never drawn from."""
    from placer.graph import Graph, Op
    ops = graph.ops
    sigma = float(rng.uniform(0.5, 1.5))
    factor = np.exp(rng.normal(0.0, sigma, size=len(ops)))
    flops = np.array([op.flops for op in ops])
    factor *= flops.sum() / max(float((flops * factor).sum()), 1e-30)
    colocate = [op.colocate for op in ops]
    params = [op.param_bytes for op in ops]
    if rng.random() < 0.5:
        kinds: dict = {}
        for i, op in enumerate(ops):
            if op.colocate is None and op.param_bytes > 0:
                kinds.setdefault(op.op, []).append(i)
        pools = [v for v in kinds.values() if len(v) >= 2]
        for j in range(int(rng.integers(2, 9)) if pools else 0):
            pool = [i for i in pools[int(rng.integers(len(pools)))] if colocate[i] is None]
            if len(pool) < 2:
                continue
            members = np.sort(rng.choice(pool, size=min(len(pool), int(rng.integers(2, 7))),
                                         replace=False))
            for k, i in enumerate(members.tolist()):
                colocate[i] = f"random-shared{j}"
                if k:
                    params[i] = 0.0
    new = [Op(op.id, op.op, flops=op.flops * f, bwd_flops=op.bwd_flops * f,
              param_bytes=pb, output_bytes=op.output_bytes, colocate=c)
           for op, f, pb, c in zip(ops, factor.tolist(), params, colocate)]
    return Graph(f"{name}-{graph.name}", new, graph.edges, training=graph.training,
                 meta=graph.meta)


def microbatch_choices(problem, limit: int = 8) -> list[int]:
    """Microbatch counts the policy's plans are scored with: powers of two up
    to ``limit`` dividing the traced batch when it is known (the search's
    rule, :func:`placer.search.base.microbatch_candidates`)."""
    from placer.search.base import microbatch_candidates
    return microbatch_candidates(problem.graph, limit)


def best_times(cost_model, problem, assignments: np.ndarray, choices: list[int],
               schedules=("1f1b",), groups=()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Objective of each row of ``assignments`` (device per op; id ``D + j``
    is the data-parallel set ``groups[j]``) at its best microbatch count and
    schedule: ``(objective, microbatches, schedule index)`` (ties: the
    earlier schedule, then the earlier count). Every count of a schedule is
    scored in one cost-model call where the model allows (:func:`times_at`)."""
    A = np.atleast_2d(assignments)
    B = len(A)
    best = np.full(B, np.inf)
    best_m = np.ones(B, dtype=np.int64)
    best_s = np.zeros(B, dtype=np.int64)
    choices = [int(m) for m in choices]
    for si, schedule in enumerate(schedules):
        t = times_at(cost_model, problem, np.tile(A, (len(choices), 1)),
                     np.repeat(choices, B), schedule, groups).reshape(len(choices), B)
        for j, m in enumerate(choices):
            better = t[j] < best
            best[better], best_m[better], best_s[better] = t[j][better], m, si
    return best, best_m, best_s


def times_at(cost_model, problem, assignments: np.ndarray, microbatches, schedule="1f1b",
             groups=()) -> np.ndarray:
    """Objective of each row of ``assignments`` at its own microbatch count
    (``microbatches``, one per row) under ``schedule``: one ``step_times``
    call where the model takes a count per row (the analytical model, whose
    array path prices each row at its own count), else one per distinct count."""
    A = np.atleast_2d(assignments)
    m = np.broadcast_to(np.asarray(microbatches, dtype=np.int64), (len(A),))
    extra = {"groups": groups} if len(groups) else {}
    counts = np.unique(m)
    if len(counts) > 1 and _counts_per_row(cost_model):
        return np.asarray(cost_model.step_times(problem, A, microbatches=m, schedule=schedule,
                                                **extra), dtype=float)
    out = np.empty(len(A))
    for count in counts.tolist():
        pick = m == count
        out[pick] = cost_model.step_times(problem, A[pick], microbatches=count,
                                          schedule=schedule, **extra)
    return out


def _counts_per_row(cost_model) -> bool:
    """Whether ``cost_model`` (through metering wrappers) is the analytical
    model, whose ``step_times`` accepts an array of microbatch counts."""
    from placer.cost.analytical import Analytical
    while not isinstance(cost_model, Analytical):
        cost_model = getattr(cost_model, "inner", None)
        if cost_model is None:
            return False
    return type(cost_model).step_times is Analytical.step_times


def pipeline_assignments(problem) -> np.ndarray:
    """Simple reference plans (device per op, rows): every op on one of the
    fastest devices, and even pipelines over the first 2, 4, 8, ... devices
    ordered by site (largest total speed first) then speed, each stage sized
    by its device's speed."""
    D = problem.n_devices
    rate = problem.rate
    rows = []
    top = np.argsort(-rate, kind="stable")[:min(D, 4)]
    biggest = np.argsort(-problem.memory, kind="stable")[:2]
    for d in dict.fromkeys(top.tolist() + biggest.tolist()):
        rows.append(np.full(problem.n_ops, d, dtype=np.int64))
    counts = [2 ** i for i in range(1, D.bit_length()) if 2 ** i <= D]
    if D > 2 and D & (D - 1):
        counts.append(D)
    return np.concatenate([np.stack(rows), even_pipelines(problem, counts)])


def even_pipelines(problem, counts) -> np.ndarray:
    """Device per op (rows): for each ``k`` of ``counts``, an even pipeline
    over the first ``k`` devices ordered by site (largest total speed
    first) then speed, each stage's share of the work proportional to its
    device's speed."""
    D = problem.n_devices
    rate = problem.rate
    site_rate = np.bincount(problem.site, rate)
    order = sorted(range(D), key=lambda d: (-site_rate[problem.site[d]], problem.site[d],
                                            -rate[d], d))
    return _pipelines_over(problem, order, counts)


def _pipelines_over(problem, order, counts) -> np.ndarray:
    """Device per op (rows): for each ``k`` of ``counts``, the even pipeline
    over the first ``k`` devices of ``order``, each stage's share of the
    work proportional to its device's speed."""
    rate = problem.rate
    work = problem.flops + (problem.bwd_flops if problem.training else 0.0)
    frac = (np.cumsum(work) - work / 2) / max(work.sum(), 1e-30)
    rows = []
    for k in counts:
        devs = np.array(order[:k])
        bounds = np.cumsum(rate[devs]) / rate[devs].sum()
        rows.append(devs[np.minimum(np.searchsorted(bounds, frac, side="right"), k - 1)])
    return np.stack(rows) if rows else np.zeros((0, problem.n_ops), dtype=np.int64)


def site_devices(problem) -> list[list[int]]:
    """Each site's devices, fastest first (then by index), sites in the
    order of their first device."""
    rate = problem.rate
    sites: dict[int, list[int]] = {}
    for d in range(problem.n_devices):
        sites.setdefault(int(problem.site[d]), []).append(d)
    return [sorted(ds, key=lambda d: (-rate[d], d)) for ds in sites.values()]


def site_pipelines(problem, max_stages: int) -> np.ndarray:
    """Device per op (rows): even pipelines inside each site over its first
    2..``max_stages`` devices (fastest first). The global order puts the
    site of the largest total speed first; a smaller site can hold the
    fastest links (two speed classes over three sites: a pair of fast GPUs
    joined at 86 GB/s beside a site of four at 26 GB/s)."""
    rows = [_pipelines_over(problem, ds, range(2, min(len(ds), max_stages) + 1))
            for ds in site_devices(problem) if len(ds) > 1]
    return np.concatenate(rows) if rows else np.zeros((0, problem.n_ops), dtype=np.int64)


def site_replicas(problem) -> list[tuple[int, ...]]:
    """Device sets for whole-graph data parallelism: in each site, its 2,
    3, ... fastest devices of its fastest speed class (within 1%). On a
    graph of thousands of small ops one pipeline stage per device pays a
    transfer at every cut; replicas over a fast link pay one all-reduce."""
    out = []
    for ds in site_devices(problem):
        fast = [d for d in ds if problem.rate[d] >= 0.99 * problem.rate[ds[0]]]
        out += [tuple(sorted(fast[:k])) for k in range(2, len(fast) + 1)]
    return out


def crossing_bytes(problem) -> np.ndarray:
    """``c[i]``: bytes of the edges a cut between ops ``i - 1`` and ``i``
    (in ``problem.ids`` order) crosses, for ``i`` in ``0..n_ops``."""
    lo = np.minimum(problem.edge_src, problem.edge_dst)
    hi = np.maximum(problem.edge_src, problem.edge_dst)
    c = np.zeros(problem.n_ops + 1)
    np.add.at(c, lo + 1, problem.edge_bytes)
    np.add.at(c, hi + 1, -problem.edge_bytes)
    return np.cumsum(c)


def cheap_cuts(problem, rows: np.ndarray, variants: int = 1) -> np.ndarray:
    """Pipelines (device per op rows) with each stage boundary moved to a
    cheap cut within half of each neighbouring stage, the stages' devices
    and order kept: variant ``r`` (of ``variants`` per row) takes each
    boundary's ``r``-th best cut, by the bytes it crosses (within 5%, so
    the equal cuts between a transformer's blocks tie) and then nearness
    to the boundary balanced by work. Such a boundary can fall inside a
    block whose activations are far larger than those between blocks (an
    MoE layer's expert outputs: 1.7 GB against 50 MB a few ops away), and
    the block boundary nearest to it need not be the best once colocated
    ops (tied embeddings) weigh on a stage."""
    cross = crossing_bytes(problem)
    level = np.floor(np.log(np.maximum(cross, 1.0)) / np.log(1.05))
    out: dict[bytes, np.ndarray] = {}
    for row in rows:
        starts = np.r_[0, np.flatnonzero(np.diff(row)) + 1, len(row)]
        for r in range(variants):
            new = row.copy()
            left = 0                   # the (moved) start of the current stage
            for j in range(1, len(starts) - 1):
                pos = int(starts[j])
                lo = max(left + 1, pos - (pos - int(starts[j - 1])) // 2)
                hi = min(int(starts[j + 1]) - 1, pos + (int(starts[j + 1]) - pos) // 2)
                cand = np.arange(lo, hi + 1)
                order = np.lexsort((np.abs(cand - pos), level[cand])) if len(cand) else []
                cut = int(cand[order[min(r, len(order) - 1)]]) if len(cand) else pos
                new[left:cut] = row[starts[j - 1]]
                left = cut
            new[left:] = row[-1]
            out.setdefault(new.tobytes(), new)
    return np.stack(list(out.values())) if out else rows[:0]


def class_pipelines(problem, counts) -> np.ndarray:
    """Device per op (rows): pipelines that keep colocation classes whole,
    for each ``k`` of ``counts``. Ops are grouped by class (ops without one
    alone), the classes' graph condensed to a DAG (its strongly connected
    parts merged) and cut, in a topological order of it, into ``k``
    stages with work in proportion to their devices' speeds (the devices
    as :func:`even_pipelines` orders them). An unrolled recurrence whose
    layers share weights is a pipeline of layers this way; cutting its
    topological order of ops (by time step) and keeping classes whole
    puts it all on one device. No rows when the graph has no classes."""
    import networkx as nx
    labels = [problem.graph.op(op).colocate for op in problem.ids]
    if not any(labels):
        return np.zeros((0, problem.n_ops), dtype=np.int64)
    names: dict = {}
    cls = np.array([names.setdefault(("c", lab) if lab else ("o", i), len(names))
                    for i, lab in enumerate(labels)], dtype=np.int64)
    g = nx.DiGraph()
    g.add_nodes_from(range(len(names)))
    a, b = cls[problem.edge_src], cls[problem.edge_dst]
    g.add_edges_from((int(x), int(y)) for x, y in zip(a[a != b], b[a != b]))
    dag = nx.condensation(g)
    part = np.array([dag.graph["mapping"][c] for c in range(len(names))], dtype=np.int64)
    order = list(nx.lexicographical_topological_sort(dag))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    pos = rank[part[cls]]                               # each op's place in the order
    work = problem.flops + (problem.bwd_flops if problem.training else 0.0)
    per = np.bincount(pos, work, minlength=len(order))
    frac = (np.cumsum(per) - per / 2) / max(per.sum(), 1e-30)
    rows = []
    D = problem.n_devices
    rate = problem.rate
    site_rate = np.bincount(problem.site, rate)
    devices = sorted(range(D), key=lambda d: (-site_rate[problem.site[d]], problem.site[d],
                                              -rate[d], d))
    for k in counts:
        devs = np.array(devices[:k])
        bounds = np.cumsum(rate[devs]) / rate[devs].sum()
        stage = np.minimum(np.searchsorted(bounds, frac, side="right"), k - 1)
        rows.append(devs[stage][pos])
    return np.stack(rows) if rows else np.zeros((0, problem.n_ops), dtype=np.int64)


def colocated(problem, rows: np.ndarray) -> np.ndarray:
    """Rows with every colocation group moved to its first member's device."""
    rows = rows.copy()
    first: dict[str, int] = {}
    for i, op_id in enumerate(problem.ids):
        label = problem.graph.op(op_id).colocate
        if label is None:
            continue
        if label in first:
            rows[:, i] = rows[:, first[label]]
        else:
            first[label] = i
    return rows


def reference_time(cost_model, problem) -> float:
    """Step time of the best simple heuristic plan (see
    :func:`pipeline_assignments`); the reward's reference."""
    return reference(cost_model, problem)[0]


#: placer.search heuristics whose plans join the reference (fast ones)
HEURISTICS = ("even_pipeline",)


def heuristic_plans(cost_model, problem, names=HEURISTICS) -> list[tuple[float, np.ndarray | None]]:
    """``(objective, device per op or None)`` of placer.search heuristics;
    the row is None for a plan with data-parallel groups (not a policy
    action). Heuristics that are not available are skipped."""
    from placer.search.base import Budget, get_strategy
    from placer.errors import PlacerError
    out = []
    for name in names:
        try:
            plan = get_strategy(name).search(problem, cost_model, Budget(time=5.0), seed=0)
        except (PlacerError, ImportError):
            continue
        objective = float(plan.predicted.get("objective", plan.predicted.get("step_time")))
        single = all(len(v) == 1 for v in plan.placement.values())
        row = np.array([problem.device_index[plan.placement[i][0]] for i in problem.ids],
                       dtype=np.int64) if single else None
        out.append((objective, row))
    return out


def reference(cost_model, problem, heuristics=HEURISTICS) -> tuple[float, np.ndarray]:
    """``(step time, device per op)``: the time of the best heuristic plan
    (:func:`pipeline_assignments` and the ``heuristics`` of placer.search)
    and the best single-device-per-op plan among them (the imitation target)."""
    rows = colocated(problem, pipeline_assignments(problem))
    t, _, _ = best_times(cost_model, problem, rows, microbatch_choices(problem))
    best = int(np.argmin(t))
    time, row = float(t[best]), rows[best]
    teacher_time = time
    for objective, other in heuristic_plans(cost_model, problem, heuristics):
        time = min(time, objective)
        if other is not None and objective < teacher_time:
            teacher_time, row = objective, other
    return time, row


def reward(times: np.ndarray, reference: float, floor: float = -5.0,
           ceiling: float = 5.0) -> np.ndarray:
    """log(reference / time), clipped to [``floor``, ``ceiling``]: > 0 when a
    plan beats the reference. Infeasible plans (objective >= INFEASIBLE) get
    at most ``floor``, still ranked by how far over memory they are."""
    times = np.asarray(times, dtype=float)
    r = np.log(reference / np.maximum(times, 1e-30))
    over = times >= INFEASIBLE
    r = np.clip(r, floor, ceiling)
    r[over] = floor - np.log(times[over] / INFEASIBLE)
    return r

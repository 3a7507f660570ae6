"""The genome of ``dtfm`` and the genetic algorithm's operators on it.

A :class:`Partition` is a device permutation read as consecutive
data-parallel groups of ``sizes`` devices, in pipeline order; devices past
``sum(sizes)`` are left unused. Groups may differ in size (a fast device
alone beside pairs of slower ones), so the classic ``D_pp x D_dp`` shape is
the special case of equal sizes (:meth:`Partition.uniform`).

Operators (each with an explicit ``numpy.random.Generator``): swap a device
into the group of a device near it (by bandwidth), swap two devices, move
a device to another group (or in or out of use), split a group or merge two
neighbours, change to a neighbouring uniform shape, move a group in the
pipeline order, change microbatches or schedule; crossover transplants a
whole group of one parent into the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import networkx as nx
import numpy as np

if TYPE_CHECKING:
    from placer.plan import Plan

    from placer.space import Space


@dataclass
class Partition:
    """Devices ``perm`` cut into groups of ``sizes`` (pipeline order; the
    rest unused), plus microbatches, schedule and ``chunks``: the pipeline
    passes the groups in order that many times (interleaved virtual stages,
    each group holding ``chunks`` slices of the layers)."""

    perm: np.ndarray
    sizes: tuple
    microbatches: int = 1
    schedule: str = "1f1b"
    origin: str = ""
    chunks: int = 1
    fitness: object = field(default=None, repr=False, compare=False)

    @classmethod
    def uniform(cls, perm, pp: int, dp: int, microbatches: int = 1, schedule: str = "1f1b",
                origin: str = "") -> "Partition":
        """``pp`` groups of ``dp`` devices (the paper's ``D_pp x D_dp``)."""
        return cls(np.asarray(perm, dtype=np.int64), (int(dp),) * int(pp), int(microbatches),
                   schedule, origin)

    @classmethod
    def of_groups(cls, groups: Sequence[Sequence[int]], n_devices: int, microbatches: int = 1,
                  schedule: str = "1f1b", origin: str = "") -> "Partition":
        """The partition with these (disjoint, non-empty) groups in this order."""
        flat = [int(d) for g in groups for d in g]
        taken = set(flat)
        rest = [d for d in range(n_devices) if d not in taken]
        return cls(np.array(flat + rest, dtype=np.int64), tuple(len(g) for g in groups),
                   int(microbatches), schedule, origin)

    @property
    def pp(self) -> int:
        """Number of groups (pipeline stages)."""
        return len(self.sizes)

    @property
    def dp(self) -> int | None:
        """The common group size; None when sizes differ."""
        return self.sizes[0] if len(set(self.sizes)) == 1 else None

    @property
    def used(self) -> int:
        return int(sum(self.sizes))

    def copy(self) -> "Partition":
        return Partition(self.perm.copy(), tuple(self.sizes), self.microbatches,
                         self.schedule, self.origin, self.chunks)

    def groups(self) -> list[tuple]:
        """Device indices of each group (sorted), in pipeline order."""
        out, lo = [], 0
        for k in self.sizes:
            out.append(tuple(sorted(int(d) for d in self.perm[lo:lo + k])))
            lo += k
        return out

    def unused(self) -> list[int]:
        return [int(d) for d in self.perm[self.used:]]

    def key(self) -> tuple:
        return (tuple(self.groups()), self.microbatches, self.schedule, self.chunks)

    def stages(self) -> list[tuple]:
        """The pipeline's stages: the groups, ``chunks`` times over."""
        return self.groups() * self.chunks

    def set_groups(self, groups: Sequence[Sequence[int]]) -> "Partition":
        """Replace the groups (in order); devices not in them become unused."""
        other = Partition.of_groups([g for g in groups if len(g)], len(self.perm))
        self.perm, self.sizes = other.perm, other.sizes
        return self


# --- mutations -------------------------------------------------------------------------

def _lists(x: Partition) -> tuple[list[list[int]], list[int]]:
    return [list(g) for g in x.groups()], x.unused()


def mut_near_swap(space: "Space", x: Partition, rng, shapes, max_groups) -> Partition:
    """Put a device beside a near one (by bandwidth): swap it with a member
    of that device's group, or with the near device itself when it is
    unused or alone."""
    groups, free = _lists(x)
    if not groups:
        return x
    s = int(rng.integers(len(groups)))
    d = groups[s][int(rng.integers(len(groups[s])))]
    near = space.near[d]
    if not len(near):
        return x
    e = int(near[int(min(rng.geometric(0.3) - 1, len(near) - 1))])
    if e in free:
        groups[s][groups[s].index(d)] = e
        return x.set_groups(groups)
    t = next(k for k, g in enumerate(groups) if e in g)
    if t == s:
        return x
    others = [f for f in groups[t] if f != e] or [e]
    f = int(rng.choice(others))
    groups[s][groups[s].index(d)] = f
    groups[t][groups[t].index(f)] = d
    return x.set_groups(groups)


def mut_swap(space: "Space", x: Partition, rng, shapes, max_groups) -> Partition:
    """Swap two random devices (groups keep their sizes)."""
    i, j = rng.integers(len(x.perm), size=2)
    x.perm[i], x.perm[j] = x.perm[j], x.perm[i]
    return x


def mut_move(space: "Space", x: Partition, rng, shapes, max_groups) -> Partition:
    """Move one device to another group, out of use, or (if unused) into a group."""
    groups, free = _lists(x)
    D = len(x.perm)
    d = int(x.perm[int(rng.integers(D))])
    src = next((k for k, g in enumerate(groups) if d in g), None)
    if src is None:
        groups[int(rng.integers(len(groups)))].append(d)
        return x.set_groups(groups)
    choices = [k for k in range(len(groups)) if k != src]
    if x.used > 1:
        choices.append(-1)                      # out of use
    if not choices:
        return x
    t = int(rng.choice(choices))
    groups[src].remove(d)
    if t >= 0:
        groups[t].append(d)
    return x.set_groups(groups)


def mut_split(space: "Space", x: Partition, rng, shapes, max_groups) -> Partition:
    """Split a group in two neighbouring stages, the faster devices together
    (a group runs at its slowest member's pace)."""
    groups, _ = _lists(x)
    big = [k for k, g in enumerate(groups) if len(g) > 1]
    if not big or len(groups) >= max_groups:
        return x
    s = int(rng.choice(big))
    rate = space.problem.rate
    members = sorted(groups[s], key=lambda d: (-rate[d], float(rng.random())))
    cut = int(rng.integers(1, len(members)))
    groups[s:s + 1] = [members[:cut], members[cut:]]
    return x.set_groups(groups)


def mut_merge(space: "Space", x: Partition, rng, shapes, max_groups) -> Partition:
    """Merge two neighbouring groups into one data-parallel group."""
    groups, _ = _lists(x)
    if len(groups) < 2:
        return x
    s = int(rng.integers(len(groups) - 1))
    groups[s:s + 2] = [groups[s] + groups[s + 1]]
    return x.set_groups(groups)


def mut_reorder(space: "Space", x: Partition, rng, shapes, max_groups) -> Partition:
    """Move one group to another place in the pipeline order."""
    groups, _ = _lists(x)
    if len(groups) < 2:
        return x
    s, t = (int(v) for v in rng.choice(len(groups), size=2, replace=False))
    groups.insert(t, groups.pop(s))
    return x.set_groups(groups)


def mut_shape(space: "Space", x: Partition, rng, shapes, max_groups) -> Partition:
    """Read the permutation as a neighbouring uniform ``(D_pp, D_dp)`` shape."""
    if len(shapes) < 2:
        return x
    cur = (x.pp, x.dp)
    k = shapes.index(cur) if cur in shapes else min(
        range(len(shapes)), key=lambda i: abs(shapes[i][0] * shapes[i][1] - x.used))
    k = min(max(k + (1 if rng.random() < 0.5 else -1), 0), len(shapes) - 1)
    pp, dp = shapes[k]
    x.sizes = (dp,) * pp
    return x


def mut_pipeline(space: "Space", x: Partition, rng, shapes, max_groups) -> Partition:
    """Step the microbatch count or the chunks, or switch schedule."""
    ms = space.microbatch_choices
    r = rng.random()
    if r < 0.3:
        x.chunks = min(max(x.chunks + (1 if rng.random() < 0.5 else -1), 1), MAX_CHUNKS)
    elif len(space.schedule_choices) > 1 and r < 0.5:
        x.schedule = [s for s in space.schedule_choices if s != x.schedule][0]
    elif len(ms) > 1:
        i = ms.index(x.microbatches) if x.microbatches in ms else 0
        x.microbatches = ms[min(max(i + (1 if rng.random() < 0.5 else -1), 0), len(ms) - 1)]
    return x


#: most passes of the pipeline over its groups
MAX_CHUNKS = 4

#: (operator, weight) of :func:`mutate`
MUTATIONS = ((mut_near_swap, 0.30), (mut_swap, 0.10), (mut_move, 0.15), (mut_split, 0.07),
             (mut_merge, 0.07), (mut_reorder, 0.11), (mut_shape, 0.10), (mut_pipeline, 0.10))


def mutate(space: "Space", x: Partition, rng, shapes, max_groups: int,
           uniform: bool = False) -> Partition:
    """One random operator of :data:`MUTATIONS` (``uniform``: only those
    that keep groups of equal size, as in the paper)."""
    ops = [(f, w) for f, w in MUTATIONS
           if not uniform or f in (mut_near_swap, mut_swap, mut_reorder, mut_shape,
                                   mut_pipeline)]
    w = np.array([w for _, w in ops])
    op = ops[int(rng.choice(len(ops), p=w / w.sum()))][0]
    x = op(space, x, rng, shapes, max_groups)
    if x.pp > max_groups:                       # merge the tail back under the limit
        groups = x.groups()
        x.set_groups(groups[:max_groups - 1] + [sum(groups[max_groups - 1:], ())])
    x.chunks = max(1, min(x.chunks, space.n_ops // x.pp))
    x.origin = "dtfm"
    return x


def transplant(a: Partition, b: Partition, rng, max_groups: int) -> Partition:
    """Crossover: one of ``b``'s groups moves whole into ``a``. Into a group
    of ``a`` of the same size when there is one (the displaced devices take
    the incoming ones' places, so every size is kept); else its devices
    leave their groups in ``a`` (groups left empty vanish) and it is put
    in at a random place."""
    src = b.groups()
    g = src[int(rng.integers(len(src)))]
    same = [t for t, k in enumerate(a.sizes) if k == len(g)]
    if same:
        t = same[int(rng.integers(len(same)))]
        lo = int(sum(a.sizes[:t]))
        pos = {int(d): i for i, d in enumerate(a.perm.tolist())}
        for k, d in enumerate(g):
            i, j = pos[d], lo + k
            if i != j:
                x, y = int(a.perm[i]), int(a.perm[j])
                a.perm[i], a.perm[j] = y, x
                pos[x], pos[y] = j, i
    else:
        groups = [[d for d in h if d not in g] for h in a.groups()]
        groups = [h for h in groups if h]
        groups.insert(int(rng.integers(len(groups) + 1)), list(g))
        if len(groups) <= max_groups:
            a.set_groups(groups)
    if rng.random() < 0.5:
        a.microbatches, a.schedule = b.microbatches, b.schedule
    a.origin = "dtfm"
    return a


def neighbours(space: "Space", x: Partition, rng, tries: int) -> list[Partition]:
    """Up to ``tries`` partitions one step from ``x``: two devices of
    different groups (or one unused) swapped, one device moved to another
    group or out of use, two groups swapped in the pipeline order, one
    chunk more or fewer."""
    groups, free = _lists(x)
    cands: list[tuple] = []
    for s, g in enumerate(groups):
        for d in g:
            for t, h in enumerate(groups):
                if t > s:
                    cands.extend(("swap", d, e) for e in h)
                if t != s and len(g) > 1:
                    cands.append(("move", d, t))
            cands.extend(("swap", d, e) for e in free)
            if len(g) > 1:
                cands.append(("move", d, -1))
    cands.extend(("order", s, t) for s in range(len(groups)) for t in range(s + 1, len(groups)))
    cands.extend(("chunks", v, 0) for v in (x.chunks - 1, x.chunks + 1)
                 if 1 <= v <= MAX_CHUNKS and v * len(groups) <= space.n_ops)
    if len(cands) > tries:
        cands = [cands[i] for i in np.sort(rng.choice(len(cands), size=tries, replace=False))]
    out = []
    for kind, u, v in cands:
        gs = [list(g) for g in groups]
        if kind == "chunks":
            c = x.copy()
            c.chunks, c.origin = u, "dtfm"
            out.append(c)
            continue
        if kind == "swap":
            where = {d: (k, i) for k, g in enumerate(gs) for i, d in enumerate(g)}
            su, iu = where[u]
            if v in where:
                sv, iv = where[v]
                gs[su][iu], gs[sv][iv] = v, u
            else:
                gs[su][iu] = v
        elif kind == "move":
            src = next(k for k, g in enumerate(gs) if u in g)
            gs[src].remove(u)
            if v >= 0:
                gs[v].append(u)
        else:
            gs[u], gs[v] = gs[v], gs[u]
        c = x.copy().set_groups(gs)
        c.origin = "dtfm"
        out.append(c)
    return out


# --- reading plans and clusters --------------------------------------------------------

def partition_of(space: "Space", plan: "Plan") -> Partition | None:
    """The partition of a plan whose device sets (in order of first use
    along the topological order; a set may come back, as colocation does to
    tied weights) are disjoint, so the GA can start from its grouping; None
    when two sets share a device."""
    index = space.problem.device_index
    stages: list[tuple] = []
    for op_id in space.problem.ids:
        devs = tuple(sorted(index[d] for d in plan.placement[op_id]))
        if devs not in stages:
            stages.append(devs)
    flat = [d for g in stages for d in g]
    if len(set(flat)) != len(flat) or len(stages) > space.n_ops:
        return None
    return Partition.of_groups(stages, space.n_devices, int(plan.microbatches), plan.schedule,
                               f"from-{plan.extra.get('from', plan.method)}")


def islands(space: "Space", ratio: float = 0.5) -> list[list[int]]:
    """Devices joined by fast links: connected components of the links of
    at least ``ratio`` times either end's fastest link (a node's GPUs, a
    site's machines), fastest island first."""
    p = space.problem
    D = space.n_devices
    bw = np.where(np.eye(D, dtype=bool), 0.0, p.bandwidth)
    best = bw.max(axis=1)
    fast = (bw >= ratio * best[:, None]) & (bw >= ratio * best[None, :]) & (bw > 0)
    g = nx.Graph()
    g.add_nodes_from(range(D))
    g.add_edges_from(zip(*(x.tolist() for x in np.nonzero(fast))))
    comps = {min(c): sorted(c) for c in nx.connected_components(g)}
    rate = p.rate
    return sorted(comps.values(), key=lambda g: (-rate[g].min() * len(g), g[0]))


def by_model(space: "Space", group: Sequence[int]) -> list[list[int]]:
    """``group`` split into devices of equal speed and memory, fastest first."""
    p = space.problem
    kinds: dict[tuple, list[int]] = {}
    for d in group:
        kinds.setdefault((-float(p.rate[d]), -float(p.memory[d])), []).append(int(d))
    return [kinds[k] for k in sorted(kinds)]


__all__ = ["MUTATIONS", "Partition", "by_model", "islands", "mutate", "neighbours",
           "partition_of", "transplant"]

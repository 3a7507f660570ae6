"""Balanced stage/replica layouts of the plan space: the pipeline x
data-parallel shapes worth trying on a cluster, one chain of devices that
keeps consecutive stages on fast links, and the layouts built from them
(evolution's and dtfm's seeds, the policy's baseline rows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .genome import LayoutGenome, OpGenome, Space

if TYPE_CHECKING:
    from placer.cost import Problem
    from placer.plan import Plan


def shapes_for(D: int, n_ops: int) -> list[tuple[int, int]]:
    """(D_pp, D_dp) candidates with ``D_pp <= n_ops`` and ``D_pp * D_dp <= D``:
    every factorisation of ``D`` (all devices busy) and, since slow links
    can make extra replicas or stages cost more than they give, smaller
    shapes with powers of two (or the largest fitting count) on each axis."""
    def axis(limit: int) -> list[int]:
        vals = {1, limit}
        v = 2
        while v <= limit:
            vals.add(v)
            v *= 2
        return sorted(x for x in vals if 1 <= x <= limit)
    out = {(D // dp, dp) for dp in range(1, D + 1) if D % dp == 0 and D // dp <= n_ops}
    for dp in axis(D):
        for pp in axis(min(n_ops, D // dp)):
            out.add((pp, dp))
    return sorted(out)


def device_chain(space: Space) -> list[int]:
    """All devices in one chain: from the fastest, each next the nearest
    unvisited (so consecutive devices share fast links)."""
    D = space.n_devices
    start = int(space.by_speed[0])
    chain = [start]
    seen = {start}
    while len(chain) < D:
        nxt = next((int(d) for d in space.near[chain[-1]] if int(d) not in seen), None)
        if nxt is None:
            nxt = next(d for d in range(D) if d not in seen)
        chain.append(nxt)
        seen.add(nxt)
    return chain


def layout_seeds(space: Space, limit: int = 16,
                 max_devices: int | None = None) -> list[OpGenome]:
    """Balanced stage/replica layouts: the (stages, replicas) shapes of
    :func:`shapes_for` (every factorisation of the device
    count, and powers of two; those over at most ``max_devices`` devices
    if given), devices taken along :func:`device_chain`, each at every
    microbatch count (the population keeps the best)."""
    D, n = space.n_devices, space.n_ops
    chain = device_chain(space)
    shapes = [s for s in shapes_for(D, n) if max_devices is None or s[0] * s[1] <= max_devices]
    # prefer shapes using more devices, then fewer replicas
    shapes.sort(key=lambda s: (-s[0] * s[1], s[1]))
    out: list[OpGenome] = []
    for pp, dp in shapes[:limit]:
        stages = [tuple(chain[s * dp:(s + 1) * dp]) for s in range(pp)]
        layout = LayoutGenome.balanced(space, stages, 1, space.schedule_choices[0],
                                       origin=f"layout-{pp}x{dp}")
        base = layout.decode(space)
        for m in space.microbatch_choices:
            genome = base.copy()
            genome.microbatches = m
            out.append(genome)
    return out


def even_allocation(problem: "Problem", pp: int, dp: int, microbatches: int = 1,
                    schedule: str = "1f1b", order: Sequence[int] | None = None) -> Plan:
    """The even, Megatron-style plan: devices in ``order`` (rank order by
    default) cut into ``pp`` groups of ``dp``, layers split evenly by work."""
    space = Space(problem, [microbatches], [schedule])
    order = list(range(problem.n_devices)) if order is None else list(order)
    stages = [tuple(order[s * dp:(s + 1) * dp]) for s in range(pp)]
    genome = LayoutGenome.balanced(space, stages, microbatches, schedule, "even").decode(space)
    return genome.to_plan(space, "even")


__all__ = ["device_chain", "even_allocation", "layout_seeds", "shapes_for"]

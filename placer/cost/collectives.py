"""Pricing all-reduce on the actual links of a cluster.

Two algorithms, and :func:`allreduce` takes the cheaper:

- **ring** over the group (ordered by site, so a ring crosses each site
  boundary once): ``2(k-1)`` steps, each moving ``P/k`` bytes over every ring
  link at once, so a step costs its slowest link's ``latency + P/k/bandwidth``;
  on uniform links that is ``2(k-1)/k * P/bw + 2(k-1) * latency``.
- **hierarchical**: reduce-scatter inside each site, all-reduce of the
  ``P/l`` shards across sites (``l`` parallel rings, one per local rank), then
  all-gather inside each site.

A link's speed is capped by both ends' network interfaces.

>>> import numpy as np
>>> bw = np.full((4, 4), 1e9); lat = np.full((4, 4), 1e-3)
>>> nic = np.full(4, np.inf); site = np.zeros(4, dtype=int)
>>> round(float(ring_time([0, 1, 2, 3], 4e9, bw, lat, nic)), 6)   # 2*3/4*4 + 6e-3
6.006
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _link_speed(a: int, b: int, bandwidth, nic) -> float:
    return min(bandwidth[a, b], nic[a], nic[b])


def ring_step(ring: Sequence[int], nbytes: float, bandwidth, latency, nic) -> float:
    """Time of one ring step moving ``nbytes`` over every ring link at once."""
    k = len(ring)
    worst = 0.0
    for i in range(k):
        a, b = ring[i], ring[(i + 1) % k]
        worst = max(worst, latency[a, b] + nbytes / _link_speed(a, b, bandwidth, nic))
    return worst


def ring_time(ring: Sequence[int], nbytes: float, bandwidth, latency, nic) -> float:
    """Ring all-reduce of ``nbytes`` over devices ``ring`` (in ring order)."""
    k = len(ring)
    if k < 2 or nbytes <= 0:
        return 0.0
    return 2 * (k - 1) * ring_step(ring, nbytes / k, bandwidth, latency, nic)


def _ring_links(ring: Sequence[int], nbytes: float) -> list[tuple[int, int, float]]:
    k = len(ring)
    if k < 2:
        return []
    per = 2 * (k - 1) / k * nbytes
    return [(ring[i], ring[(i + 1) % k], per) for i in range(k)]


def hierarchical_time(by_site: list[list[int]], nbytes: float, bandwidth, latency,
                      nic) -> tuple[float, list[tuple[int, int, float]]]:
    """Hierarchical all-reduce over devices grouped by site; returns the time
    and the bytes each link carries."""
    local = min(len(s) for s in by_site)
    intra = 0.0
    links: list[tuple[int, int, float]] = []
    for members in by_site:
        size = len(members)
        if size > 1:
            # reduce-scatter and all-gather: (l-1) steps of P/l bytes each
            intra = max(intra, (size - 1) * ring_step(members, nbytes / size, bandwidth,
                                                      latency, nic))
            per = 2 * (size - 1) / size * nbytes
            links += [(members[i], members[(i + 1) % size], per) for i in range(size)]
    shard = nbytes / local
    inter = 0.0
    for rank in range(local):
        leaders = [members[rank] for members in by_site]
        inter = max(inter, ring_time(leaders, shard, bandwidth, latency, nic))
        links += _ring_links(leaders, shard)
    return 2 * intra + inter, links


def allreduce(devices: Sequence[int], nbytes: float, bandwidth, latency, nic,
              site) -> tuple[float, list[tuple[int, int, float]], str]:
    """Cheaper of ring and hierarchical all-reduce of ``nbytes`` over
    ``devices``: (seconds, [(src, dst, bytes)...], algorithm name)."""
    devices = sorted(devices, key=lambda d: (site[d], d))
    if len(devices) < 2 or nbytes <= 0:
        return 0.0, [], "none"
    best = (ring_time(devices, nbytes, bandwidth, latency, nic),
            _ring_links(devices, nbytes), "ring")
    by_site: dict[int, list[int]] = {}
    for d in devices:
        by_site.setdefault(int(site[d]), []).append(d)
    if 1 < len(by_site) < len(devices):
        t, links = hierarchical_time(list(by_site.values()), nbytes, bandwidth, latency, nic)
        if t < best[0]:
            best = (t, links, "hierarchical")
    return best


def allreduce_coefficients(devices: Sequence[int], bandwidth, latency, nic,
                           site) -> tuple[float, float, float, float]:
    """Linear bounds ``alpha + beta * bytes`` of ring and hierarchical
    all-reduce over ``devices`` (slowest latency and slowest link speed of
    each phase): ``(alpha_ring, beta_ring, alpha_hier, beta_hier)``. Exact on
    uniform links; the analytical model uses them to price many plans at
    once."""
    devices = sorted(devices, key=lambda d: (site[d], d))
    k = len(devices)
    if k < 2:
        return 0.0, 0.0, 0.0, 0.0

    def worst(ring):
        lat, speed = 0.0, np.inf
        for i in range(len(ring)):
            a, b = ring[i], ring[(i + 1) % len(ring)]
            lat = max(lat, latency[a, b])
            speed = min(speed, _link_speed(a, b, bandwidth, nic))
        return lat, speed

    lat, speed = worst(devices)
    ar, br = 2 * (k - 1) * lat, 2 * (k - 1) / k / speed
    by_site: dict[int, list[int]] = {}
    for d in devices:
        by_site.setdefault(int(site[d]), []).append(d)
    if not 1 < len(by_site) < k:
        return ar, br, ar, br
    groups = list(by_site.values())
    local = min(len(g) for g in groups)
    ah = bh = 0.0
    for g in groups:
        if len(g) > 1:
            lat, speed = worst(g)
            ah = max(ah, 2 * (len(g) - 1) * lat)
            bh = max(bh, 2 * (len(g) - 1) / len(g) / speed)
    s = len(groups)
    lat_x, speed_x = 0.0, np.inf
    for rank in range(local):
        lat, speed = worst([g[rank] for g in groups])
        lat_x, speed_x = max(lat_x, lat), min(speed_x, speed)
    ah += 2 * (s - 1) * lat_x
    bh += 2 * (s - 1) / s / local / speed_x
    return ar, br, ah, bh

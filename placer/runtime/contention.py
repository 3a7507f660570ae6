"""Ranks that share a host's cores: predictions that charge them for it.

Calibrated ranks on one host measure two shares of a core
(:func:`placer.runtime.profile.cpu_share`, written into each device's
``extra``): ``cpu_share`` while the rank computes alone (the others wait)
and ``cpu_share_all`` while every rank computes at once. A rank runs at the
first share while it computes alone and at the second while another rank of
its host computes too; how much of its work overlaps another's depends on
the plan (data-parallel replicas compute at once, pipeline stages partly
take turns). :func:`predict_shared` simulates the plan, measures each
device's overlap in the predicted timeline, gives every device the share
that overlap implies, and simulates again, until the shares settle.
"""

from __future__ import annotations

import copy

__all__ = ["overlap", "predict_shared", "message_weight", "MESSAGE_IDLE_SHARE",
           "slower_together"]


def overlap(events, devices: list[str]) -> dict[str, float]:
    """Per device, the fraction of its compute time (forward and backward
    bars of ``events``) during which another of ``devices`` computes too."""
    bars = {d: sorted((e.start, e.start + e.duration) for e in events
                      if e.lane == d and e.category in ("forward", "backward") and e.duration > 0)
            for d in devices}
    out = {}
    for d, mine in bars.items():
        others = sorted(iv for o, ivs in bars.items() if o != d for iv in ivs)
        merged: list[list[float]] = []
        for a, b in others:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        total = sum(b - a for a, b in mine)
        both = sum(max(0.0, min(b, y) - max(a, x)) for a, b in mine for x, y in merged)
        out[d] = both / total if total > 0 else 0.0
    return out


def _with_devices(cluster, change):
    """A copy of ``cluster`` whose devices are copies, each passed to
    ``change`` (which edits it in place)."""
    from ..cluster import Cluster
    devices = []
    for dev in cluster.devices:
        dev = copy.deepcopy(dev)
        change(dev)
        devices.append(dev)
    return Cluster(cluster.name, devices, cluster.bandwidth, cluster.latency,
                   meta=getattr(cluster, "meta", None))


def slower_together(cluster, k: float):
    """A copy of ``cluster`` whose devices compute ``k`` times slower while
    another rank of their host computes too (``cpu_share_all`` over ``k``;
    a device without one starts from its ``cpu_share``). The fit no longer
    does this (see :func:`placer.runtime.calibration.reference_factor`);
    :func:`placer.runtime.calibration.unfitted` undoes it in calibrations
    kept by earlier versions."""
    def slower(dev):
        both = dev.extra.get("cpu_share_all", dev.extra.get("cpu_share", 1.0))
        dev.extra["cpu_share_all"] = both / k
    return _with_devices(cluster, slower)


def _share(dev, frac: float) -> float:
    """A device's effective share when ``frac`` of its work overlaps another
    rank's: its work runs at ``cpu_share_all`` for that part, at
    ``cpu_share`` for the rest (times add, so the rates combine harmonically)."""
    alone = dev.extra.get("cpu_share", 1.0)
    both = dev.extra.get("cpu_share_all", alone)
    return 1.0 / ((1.0 - frac) / alone + frac / both)


#: the part of a message's fixed CPU cost (``message_overhead``) a rank's
#: work waits for while no other rank of its host computes (see
#: :func:`message_weight`)
MESSAGE_IDLE_SHARE = 0.25


def message_weight(fracs: dict[str, float]) -> float:
    """What a message's fixed CPU cost weighs in a plan whose devices'
    compute overlaps another rank's by ``fracs`` (:func:`overlap`): from
    :data:`MESSAGE_IDLE_SHARE` when the ranks take turns to 1 when they
    all compute at once (the mean overlap in between).

    Why: the cost is the process's CPU time per message end (the watcher
    thread's wake-up, the transport's calls, the kernel's copies), measured
    while the other rank sends; a rank's work waits for it only while the
    host's cores are all busy. Priced in full, plans cut at every other
    op, whose ranks take turns, were predicted 1.4-2.3x their step
    (inception's round_robin over loopback, 391 message ends a rank:
    205 ms against 90.7 measured; 113 so weighted), while the pipeline
    and the message plan the calibration is fitted on overlap most of
    their compute. The idle share was chosen on
    the kept sets of three full fidelity runs (24 cases): 0 met every
    target in 17, 0.2 in 21, 0.25 and 0.3 in 20, pricing every message in
    full in 20; the largest 90th-percentile error 40%, 31%, 31%, 35% and
    52%. With the calibration's factor in place of its fitted cost per
    message, 0, 0.25 and 0.5 each met every target in 43 of 48 cases."""
    if not fracs or len(fracs) < 2:
        return 1.0
    busy = sum(fracs.values()) / len(fracs)
    return MESSAGE_IDLE_SHARE + (1.0 - MESSAGE_IDLE_SHARE) * busy


def predict_shared(graph, cluster, plan, *, op_overhead: float, rounds: int = 3,
                   task_overhead: float = 0.0, **options):
    """The simulator's report for ``plan`` on ranks that share a host's
    cores. ``graph`` holds op times at a whole core (calibrated with a
    share of 1) and ``cluster``'s devices their measured shares in
    ``extra`` (see the module doc); ``op_overhead`` is the launch cost at a
    whole core, ``task_overhead`` a runtime task's (see
    :class:`placer.cost.Problem`). Devices without ``cpu_share_all`` keep
    ``cpu_share``.
    The plan is predicted as the runtime runs it (:func:`placer.runtime.common.as_run`).
    The report's ``extra["cpu_shares"]`` gives the shares used."""
    from ..cost import simulate
    from .common import as_run
    plan = as_run(graph, plan)
    used = sorted(plan.devices_used())
    fracs = {d: 1.0 for d in used}   # first guess: every rank computes at once
    report = None
    for _ in range(max(1, rounds)):
        shares = {d: _share(cluster.device(d), fracs[d]) for d in used}

        def at_share(dev):
            if dev.name in shares:
                dev.efficiency = min(1.0, (dev.efficiency or 1.0) * shares[dev.name])
        scaled = _with_devices(cluster, at_share)
        # one launch cost for all devices (the cost model has one): at the
        # mean share
        mean = sum(shares.values()) / len(shares)
        opts = dict(options)
        if opts.get("message_overhead"):
            opts["message_overhead"] = opts["message_overhead"] * message_weight(fracs)
        report = simulate(graph, scaled, plan, op_overhead=op_overhead / mean,
                          task_overhead=task_overhead / mean, **opts)
        new = overlap(report.events(), used)
        if all(abs(new[d] - fracs[d]) < 0.02 for d in used):
            break
        fracs = new
    report.extra["cpu_shares"] = shares
    return report

"""Which rank hosts which plan device, on which torch device and backend,
and on which cores: what the launcher and every rank compute alike."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..errors import PlacerError, PlanError
from .devices import as_device, choose_backend, torch_device


def rank_torch_device(name: str, backend: str | None = None, cluster=None,
                      device=None) -> torch.device:
    """The torch device of the rank hosting plan device ``name``: ``device``
    when given, a usable torch device name as itself, a device named as a
    GPU (:func:`placer.runtime.devices.gpu_named`) or any NCCL rank on
    CUDA device ``LOCAL_RANK`` (modulo this host's count), else the CPU."""
    if device is not None:
        return torch.device(device)
    local = int(os.environ.get("LOCAL_RANK", 0))
    tdev = torch_device(name, local, cluster)
    if tdev.type == "cpu" and backend == "nccl" and torch.cuda.is_available() \
            and as_device(name) is None:
        tdev = torch.device("cuda", local % torch.cuda.device_count())
    return tdev


def this_rank(devs: list[str], cluster=None, device=None) -> tuple[str, str, torch.device]:
    """``(plan device, backend, torch device)`` of this rank, ``devs`` being
    the plan's devices in rank order; the process group must be up and
    have one rank per device. The backend is ``"nccl"`` when the group's
    names NCCL (``"cpu:gloo,cuda:nccl"`` names both), else ``"gloo"``."""
    world = dist.get_world_size()
    if len(devs) != world:
        raise PlanError(f"the plan uses {len(devs)} devices but WORLD_SIZE is {world}",
                        fix=f"start {len(devs)} processes (one per device)")
    me = devs[dist.get_rank()]
    backend = "nccl" if "nccl" in str(dist.get_backend()) else "gloo"
    return me, backend, rank_torch_device(me, backend, cluster, device)


def launch_backend(plan, cluster=None, device=None) -> str:
    """The backend :func:`launch` uses when none is named: NCCL when every
    rank's device (:func:`rank_torch_device`) is CUDA, else gloo."""
    devs = rank_devices(plan, cluster)
    return choose_backend([rank_torch_device(d, None, cluster, device)
                           if device is not None else torch_device(d, r, cluster)
                           for r, d in enumerate(devs)])


def rank_devices(plan, cluster=None) -> list[str]:
    """The plan's devices in rank order (see the module doc)."""
    used = plan.devices_used()
    if cluster is not None:
        return [d for d in cluster.names if d in used]
    seen: list[str] = []
    for devices in plan.placement.values():
        for d in devices:
            if d not in seen:
                seen.append(d)
    return seen


class RankError(PlacerError):
    """A rank of a distributed run died, failed or hung."""


def pin_cores(local_rank: int, local_world: int) -> list[int] | None:
    """Give this process its own share of the cores it may use: the usable
    cores cut into ``local_world`` equal runs, run ``local_rank`` for this
    rank (``os.sched_setaffinity``; threads started later inherit it).
    Ranks on one host then stop preempting each other at their every
    synchronisation. Returns the cores, or None (nothing changed) when
    there are fewer usable cores than ranks or the OS cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    usable = sorted(os.sched_getaffinity(0))
    per = len(usable) // max(1, local_world)
    if per < 1 or not 0 <= local_rank < local_world:
        return None
    cores = usable[local_rank * per:(local_rank + 1) * per]
    os.sched_setaffinity(0, cores)
    global _PINNED
    _PINNED = cores
    return cores


#: the cores :func:`pin_cores` gave this process (None: not pinned)
_PINNED: list[int] | None = None


def pinned_cores() -> list[int] | None:
    """The cores :func:`pin_cores` gave this process, or None when it was not pinned."""
    return _PINNED


def auto_pin(pin: bool | None, world: int) -> bool:
    """``pin=None``: pin when every rank can have a core of its own."""
    if pin is not None:
        return pin
    return hasattr(os, "sched_getaffinity") and world <= len(os.sched_getaffinity(0))

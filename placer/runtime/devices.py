"""Which torch device runs a plan device, and which backend joins the ranks.

A plan device is *named as a GPU* when its name says so (``cuda:1``,
``gpu0``, ``a100-0``, ``h100_3``...) or when the cluster gives it a GPU
``kind`` (``"A100-80GB"``). Such a device runs on a CUDA device when this
host has one, else on the CPU, and then :func:`cpu_fallback_line` says so in
one line: its measured times are CPU times, and the runtime does not compare
them with a prediction made for the GPU.
"""

from __future__ import annotations

import re
import sys

import torch

__all__ = ["gpu_named", "torch_device", "choose_backend", "cpu_fallback_line",
           "nccl_available", "as_device"]

#: names (or cluster kinds) of GPUs: a prefix, then a digit, a separator or the end
_GPU = re.compile(r"^(cuda|gpu|a100|a10g?|a40|a30|a6000|h100|h200|h20|gh200|b100|b200|gb200|"
                  r"v100|p100|k80|t4|l4|l40s?|rtx|titan|mi\d{2,3}x?|tesla)(\b|[-_:.\d]|$)",
                  re.IGNORECASE)


def gpu_named(name: str, cluster=None) -> bool:
    """Whether plan device ``name`` is named as a GPU (its name, or its
    ``kind`` in ``cluster``)."""
    if _GPU.match(str(name)):
        return True
    if cluster is not None and name in getattr(cluster, "names", ()):
        kind = cluster.device(name).kind or ""
        return bool(_GPU.match(kind)) or "gpu" in kind.lower()
    return False


def torch_device(name: str, index: int = 0, cluster=None) -> torch.device:
    """The torch device running plan device ``name``: a usable torch device
    name as itself (``"cpu"``, ``"cuda:1"``); a device named as a GPU on
    CUDA device ``index`` modulo this host's count when there is one; else
    the CPU."""
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        dev = None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dev is not None and dev.type == "cpu":
        return dev
    if dev is not None and dev.type == "cuda" and count:
        if (dev.index or 0) < count:
            return torch.device("cuda", dev.index or 0)
    if gpu_named(name, cluster) and count:
        return torch.device("cuda", index % count)
    return torch.device("cpu")


def nccl_available() -> bool:
    """Whether this torch can run NCCL process groups on a GPU here."""
    try:
        import torch.distributed as dist
        return bool(torch.cuda.is_available() and dist.is_nccl_available())
    except Exception:  # noqa: BLE001 - a torch without distributed
        return False


def choose_backend(devices) -> str:
    """``"nccl"`` when every rank's torch device (``devices``) is CUDA and
    NCCL is available, else ``"gloo"`` (CPU ranks; a CUDA rank among CPU
    ones stages its messages through host memory)."""
    devices = [torch.device(d) for d in devices]
    if devices and all(d.type == "cuda" for d in devices) and nccl_available():
        return "nccl"
    return "gloo"


def cpu_fallback_line(names) -> str:
    """The one line saying that devices ``names`` (named as GPUs) ran on
    the CPU."""
    names = list(names)
    many = len(names) > 1
    return (f"placer: plan device{'s' if many else ''} {', '.join(names)} "
            f"{'are' if many else 'is'} named as {'GPUs' if many else 'a GPU'} but "
            f"ran on the CPU (no CUDA device here, or a device map chose the CPU): "
            "measured times are CPU times and are not compared with the prediction")


def warn_cpu_fallback(names) -> None:
    """Print :func:`cpu_fallback_line` to stderr when ``names`` is not empty."""
    if names:
        print(cpu_fallback_line(names), file=sys.stderr, flush=True)


def as_device(name: str) -> torch.device | None:
    """``name`` as a torch device of this host (``"cpu"``, ``"cuda:1"`` when
    that GPU exists), or None when it names none here."""
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        return None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda" and torch.cuda.is_available():
        index = dev.index or 0
        if index < torch.cuda.device_count():
            return torch.device("cuda", index)
    return None

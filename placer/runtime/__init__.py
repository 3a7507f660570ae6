"""The built-in runtime: run a plan and measure it.

- :func:`run` (``placer.run``): one process drives every device of the plan
  (CUDA GPUs and the CPU; a plan device that is not a torch device runs on
  the CPU, so any plan can be checked for correctness on a laptop).
- :func:`launch` / ``placer launch``: one process per plan device through
  ``torch.distributed`` (see :mod:`placer.runtime.dist`).
- :func:`profile` / ``placer profile``: per-op times measured on the local
  devices, written into the graph, and per-device efficiency fitted into the
  cluster (see :mod:`placer.runtime.profile`).
"""

from __future__ import annotations

from .run import MeasuredReport, RunResult, default_device_map, default_loss, run

__all__ = ["MeasuredReport", "RunResult", "default_device_map", "default_loss", "run",
           "launch", "profile"]


def launch(*args, **kwargs):
    """Run a plan in several processes; see :func:`placer.runtime.dist.launch`."""
    from .dist import launch as _launch
    return _launch(*args, **kwargs)


def profile(*args, **kwargs):
    """Measure per-op times; see :func:`placer.runtime.profile.profile`."""
    from .profile import profile as _profile
    return _profile(*args, **kwargs)

"""Saving and loading policies: a state dict of tensors (``NAME.pt``, loaded
with ``torch.load(weights_only=True)``) and a JSON config beside it
(``NAME.json``), both written atomically.

>>> import tempfile, pathlib
>>> from gnn.model import PlacementPolicy, PolicyConfig
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> save_policy(folder / "p", PlacementPolicy(PolicyConfig(hidden=16, layers=1)))
>>> load_policy(folder / "p").config.hidden
16
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path

import torch

from placer._io import MAX_FILE_BYTES, short_repr, atomic_write_bytes, atomic_write_text, dump_json, load_document
from placer.errors import FormatError

from .model import PlacementPolicy, PolicyConfig

__all__ = ["save_policy", "load_policy", "default_checkpoint", "checkpoint_paths",
           "save_tensors", "load_tensors"]

FORMAT = "placer.policy/v1"


def default_checkpoint() -> Path:
    """The shipped checkpoint (stem; ``.pt`` and ``.json`` beside it)."""
    return Path(__file__).resolve().parent / "checkpoints" / "policy"


def checkpoint_paths(stem) -> tuple[Path, Path]:
    """``(weights, config)`` paths of checkpoint ``stem`` (a ``.pt`` or
    ``.json`` suffix is dropped)."""
    stem = Path(stem)
    if stem.suffix in (".pt", ".json"):
        stem = stem.with_suffix("")
    return stem.with_name(stem.name + ".pt"), stem.with_name(stem.name + ".json")


def save_tensors(path, state) -> None:
    """``torch.save`` ``state`` (tensors and plain containers) atomically."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_tensors(path):
    """Load what :func:`save_tensors` wrote, refusing pickled code."""
    path = Path(path)
    if not path.is_file():
        raise FormatError("checkpoint not found", file=str(path),
                          fix="train one with train_policy.py or give the right path")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise FormatError(f"larger than {MAX_FILE_BYTES // 2**20} MiB (the limit on files "
                          "placer reads)", file=str(path), fix="check that this is the right file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):
            raise FormatError(f"cannot read checkpoint: {exc}", file=str(path),
                              fix="re-create it with train_policy.py") from None
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise FormatError(f"holds pickled Python objects{what}, not only tensors: refused, "
                          "as loading them could run code", file=str(path),
                          fix="re-create it with train_policy.py; a checkpoint holds "
                              "tensors, numbers and strings only") from None
    except Exception as exc:  # torch raises several kinds for corrupt files
        raise FormatError(f"cannot read checkpoint: {exc}", file=str(path),
                          fix="re-create it with train_policy.py") from None


def save_policy(stem, policy: PlacementPolicy, info: dict | None = None) -> None:
    """Write ``policy``'s weights and a JSON config (plus ``info``)."""
    weights, config = checkpoint_paths(stem)
    state = {k: v.detach().clone().contiguous() for k, v in policy.state_dict().items()}
    save_tensors(weights, state)
    data = {"format": FORMAT, "weights": weights.name, "policy": policy.config.to_dict()}
    data.update(info or {})
    atomic_write_text(config, dump_json(data))


def load_policy(stem=None) -> PlacementPolicy:
    """The policy saved at ``stem`` (default: the shipped one), in eval mode."""
    weights, config = checkpoint_paths(stem if stem is not None else default_checkpoint())
    if not config.is_file():
        raise FormatError("checkpoint config not found", file=str(config),
                          fix="train one with train_policy.py or give the right path")
    data = load_document(config, FormatError)
    if not isinstance(data, dict):
        raise FormatError(f"expected a mapping, got {type(data).__name__}", file=str(config))
    if data.get("format") != FORMAT:
        raise FormatError(f"expected format {FORMAT!r}, got {short_repr(data.get('format'))}",
                          file=str(config), field="format")
    policy = PlacementPolicy(PolicyConfig.from_dict(data.get("policy") or {}, str(config)))
    state = load_tensors(weights)
    try:
        policy.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError, KeyError, ValueError) as exc:
        raise FormatError(f"weights do not fit the config: {str(exc).splitlines()[0]}",
                          file=str(weights)) from None
    policy.info = data
    return policy.eval()

"""The model zoo: standard models in pure PyTorch, by name, with example inputs.

Every model is written so ``torch.fx.symbolic_trace`` records it whole (no
data-dependent Python control flow in ``forward``). Large configurations are
built on the ``meta`` device, so asking for ``gpt-6.7b`` allocates nothing.

>>> from placer import zoo
>>> module, inputs = zoo.build("gpt-125m", batch=1, seq=16, tiny=True)
>>> module(*inputs).shape
torch.Size([1, 16, 128])
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from .cnn import CNNConfig, Inception, ResNet, UNet
from .dlrm import DLRM, DLRMConfig
from .rnn import GNMT, GNMTConfig
from .transformer import BERT, GPT, TransformerConfig, UTransformer

#: Parameters (and buffers) above this many bytes are built on ``meta``.
META_THRESHOLD_BYTES = 1e9


@dataclass(frozen=True)
class Entry:
    """One zoo model: its family, how to build it and its default inputs.

    ``config`` holds the defaults of the family's config dataclass that this
    entry changes; ``tiny`` overrides make a seconds-fast CPU version for tests.
    ``seq`` means tokens for sequence models, the image side in pixels for
    image models and indices per bag for DLRM.
    """

    name: str
    family: str
    config_cls: type
    build: Callable[[Any], nn.Module]
    inputs: Callable[[Any, int, int, torch.device, torch.Generator | None], tuple]
    config: dict = field(default_factory=dict)
    batch: int = 8
    seq: int = 1024
    tiny: dict = field(default_factory=dict)
    tiny_batch: int = 2
    tiny_seq: int = 16
    description: str = ""


_REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    """Add (or replace) a model in the zoo."""
    _REGISTRY[entry.name] = entry
    return entry


def names() -> list[str]:
    """Names of all zoo models, sorted."""
    return sorted(_REGISTRY)


def entry(name: str) -> Entry:
    """The registry entry of ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(names())}") from None


def family(name: str) -> str:
    """The family of a zoo model (e.g. ``"gpt"`` for ``"gpt-1.3b"``)."""
    return entry(name).family


def config(name: str, batch: int | None = None, seq: int | None = None,
           tiny: bool = False, **overrides):
    """The config dataclass ``build`` would use for these arguments."""
    e = entry(name)
    values = dict(e.config)
    if tiny:
        values.update(e.tiny)
    values.update(overrides)
    known = {f.name for f in dataclasses.fields(e.config_cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"{name}: unknown config field(s) {', '.join(unknown)}; "
                        f"known: {', '.join(sorted(known))}")
    batch, seq = _batch_seq(e, batch, seq, tiny)
    # Sizes that a sequence length fixes at construction.
    if "tokens" in known and "tokens" not in overrides:
        values["tokens"] = batch * seq
    if e.config_cls is GNMTConfig and "seq" not in overrides:
        values["seq"] = seq
    if e.config_cls is DLRMConfig and "pooling" not in overrides:
        values["pooling"] = seq
    cfg = e.config_cls(**values)
    if isinstance(cfg, TransformerConfig) and seq > cfg.max_seq:
        raise ValueError(f"{name}: seq {seq} exceeds max_seq {cfg.max_seq}")
    return cfg


def _batch_seq(e: Entry, batch, seq, tiny) -> tuple[int, int]:
    batch = int(batch if batch is not None else (e.tiny_batch if tiny else e.batch))
    seq = int(seq if seq is not None else (e.tiny_seq if tiny else e.seq))
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be >= 1, got {batch}, {seq}")
    return batch, seq


def param_bytes(module: nn.Module) -> int:
    """Bytes of distinct parameters and buffers (shared weights counted once)."""
    seen: dict[int, int] = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def num_params(module: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in module.parameters())


def build(name: str, batch: int | None = None, seq: int | None = None,
          device: str | torch.device | None = None, *, tiny: bool = False,
          seed: int = 0, **overrides) -> tuple[nn.Module, tuple]:
    """Build zoo model ``name`` and example inputs for one training step.

    ``batch``/``seq`` default per model (e.g. GPT: 8 x 1024); ``overrides``
    change config fields (e.g. ``n_layer=2``); ``tiny=True`` applies the
    entry's small test config. The model is built on ``meta`` (nothing
    allocated, inputs on ``meta`` too) when ``device="meta"`` or when its
    parameters exceed :data:`META_THRESHOLD_BYTES`; otherwise on ``device``
    (default CPU) with weights and inputs drawn from ``seed``.
    """
    e = entry(name)
    cfg = config(name, batch, seq, tiny, **overrides)
    batch, seq = _batch_seq(e, batch, seq, tiny)
    with torch.device("meta"):
        module = e.build(cfg)
    target = torch.device(device) if device is not None else torch.device("cpu")
    if target.type != "meta" and param_bytes(module) <= META_THRESHOLD_BYTES:
        with _seeded(seed), torch.device(target):
            module = e.build(cfg)
    else:
        target = torch.device("meta")
    generator = None
    if target.type != "meta":
        generator = torch.Generator(device="cpu").manual_seed(seed)
    inputs = tuple(t.to(target) for t in e.inputs(cfg, batch, seq, target, generator))
    return module, inputs


def materialize(module: nn.Module, device: str | torch.device = "cpu",
                seed: int = 0) -> nn.Module:
    """Allocate a meta-built model on ``device`` and initialise it
    deterministically, keeping tied weights tied.

    Each module holding parameters or buffers of its own is initialised by
    its ``reset_parameters`` under a seed of its own (from ``seed`` and its
    name), so any part of the model gets the same values when materialised
    alone (see :func:`materialize_tensor`): the runtime builds only the
    pieces a device runs. Values are drawn on the CPU, so they do not depend
    on ``device``."""
    aliases: dict[int, list[str]] = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for p_name, p in mod.named_parameters(recurse=False):
            aliases.setdefault(id(p), []).append(f"{mod_name}.{p_name}".lstrip("."))
    module.to_empty(device="cpu")
    for name, mod in module.named_modules():
        if _owns_state(mod) and hasattr(mod, "reset_parameters"):
            _reset(mod, name, seed)
    module.to(device)
    for names_ in aliases.values():
        first = module.get_parameter(names_[0])
        for alias in names_[1:]:
            owner, _, attr = alias.rpartition(".")
            setattr(module.get_submodule(owner), attr, first)
    return module


def materialize_tensor(module: nn.Module, name: str, device: str | torch.device = "cpu",
                       seed: int = 0, *, cache: dict | None = None) -> torch.Tensor:
    """The value :func:`materialize` gives parameter or buffer ``name`` (its
    first name, for tied weights) of the meta-built ``module``, computed
    alone: a copy of its owning module is allocated on ``device`` and
    initialised the same way. ``cache`` (owner name -> copy) lets the
    other tensors of one owner reuse its copy. An owner with submodules is
    copied with them (its ``reset_parameters`` may draw for them first), so
    a weight held directly by a large container costs that container's
    memory while it is built."""
    from ..errors import PlanError
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    part = None if cache is None else cache.get(owner_name)
    if part is None:
        if not hasattr(owner, "reset_parameters"):
            raise PlanError(f"parameter {name!r} is on the meta device and its module "
                            f"({type(owner).__name__}) has no reset_parameters to "
                            f"initialise it", field="model",
                            fix="materialise the model's weights before running it "
                            "(e.g. placer.zoo.materialize, or load a state dict)")
        part = copy.deepcopy(owner).to_empty(device="cpu")
        _reset(part, owner_name, seed)
        part.to(device)
        if cache is not None:
            cache[owner_name] = part
    return getattr(part, attr)


def _owns_state(mod: nn.Module) -> bool:
    return any(True for _ in mod.parameters(recurse=False)) or \
        any(True for _ in mod.buffers(recurse=False))


def _reset(mod: nn.Module, name: str, seed: int) -> None:
    """``mod.reset_parameters()`` under a seed from ``seed`` and the module's
    name (a stable digest: Python's string hash differs between processes)."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    with _seeded(int.from_bytes(digest, "little") >> 1), torch.no_grad():
        mod.reset_parameters()


@contextlib.contextmanager
def _seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# --- inputs ---------------------------------------------------------------

def _tokens(vocab, batch, seq, device, generator):
    if device.type == "meta":
        return torch.empty(batch, seq, dtype=torch.long, device="meta")
    return torch.randint(0, vocab, (batch, seq), generator=generator)


def _gpt_inputs(cfg, batch, seq, device, generator):
    return (_tokens(cfg.vocab, batch, seq, device, generator),)


def _bert_inputs(cfg, batch, seq, device, generator):
    ids = _tokens(cfg.vocab, batch, seq, device, generator)
    types = torch.zeros(batch, seq, dtype=torch.long,
                        device="meta" if device.type == "meta" else "cpu")
    types[:, seq // 2:] = 1
    return ids, types


def _image_inputs(cfg, batch, seq, device, generator):
    shape = (batch, cfg.in_channels, seq, seq)
    if device.type == "meta":
        return (torch.empty(shape, device="meta"),)
    return (torch.randn(shape, generator=generator),)


def _gnmt_inputs(cfg, batch, seq, device, generator):
    return (_tokens(cfg.vocab, batch, cfg.seq, device, generator),
            _tokens(cfg.vocab, batch, cfg.seq, device, generator))


def _dlrm_inputs(cfg, batch, seq, device, generator):
    tables = len(cfg.rows)
    if device.type == "meta":
        return (torch.empty(batch, cfg.dense_features, device="meta"),
                torch.empty(batch, tables, cfg.pooling, dtype=torch.long, device="meta"))
    dense = torch.rand(batch, cfg.dense_features, generator=generator)
    rows = torch.tensor(cfg.rows).view(1, tables, 1)
    sparse = (torch.rand(batch, tables, cfg.pooling, generator=generator) * rows).long()
    return dense, sparse


# --- the registry ------------------------------------------------------------

_TINY_TF = dict(vocab=128, n_layer=2, n_head=2, d_model=32, max_seq=64)

for _name, _cfg in {"gpt-125m": dict(n_layer=12, n_head=12, d_model=768),
                    "gpt-350m": dict(n_layer=24, n_head=16, d_model=1024),
                    "gpt-1.3b": dict(n_layer=24, n_head=16, d_model=2048),
                    "gpt-6.7b": dict(n_layer=32, n_head=32, d_model=4096)}.items():
    register(Entry(_name, "gpt", TransformerConfig, GPT, _gpt_inputs, config=_cfg,
                   batch=8, seq=1024, tiny=_TINY_TF,
                   description="GPT-3-style decoder (Brown et al. 2020 sizes), tied embeddings"))

for _name, _cfg in {"bert-base": dict(n_layer=12, n_head=12, d_model=768),
                    "bert-large": dict(n_layer=24, n_head=16, d_model=1024)}.items():
    register(Entry(_name, "bert", TransformerConfig, BERT, _bert_inputs,
                   config=dict(_cfg, vocab=30522, max_seq=512), batch=32, seq=512,
                   tiny=_TINY_TF,
                   description="BERT encoder (Devlin et al. 2019) with the MLM head"))

register(Entry("moe", "moe", TransformerConfig, lambda cfg: GPT(cfg, moe=True), _gpt_inputs,
               config=dict(n_layer=12, n_head=12, d_model=768, n_expert=16, top_k=2,
                           moe_every=2, max_seq=1024),
               batch=8, seq=1024, tiny=dict(_TINY_TF, n_expert=4),
               description="GShard/Tutel-style MoE decoder: 12 layers, every 2nd with "
                           "16 top-2 experts, capacity factor 1.25"))

register(Entry("utransformer", "utransformer", TransformerConfig, UTransformer, _gpt_inputs,
               config=dict(n_layer=8, n_head=8, d_model=512, max_seq=1024),
               batch=8, seq=1024, tiny=_TINY_TF,
               description="U-shaped transformer: token pooling down, unpooling up, skips"))

_TINY_CNN = dict(width=0.125, blocks=(1, 1, 1, 1), depth=2, num_classes=10)
register(Entry("resnet50", "resnet", CNNConfig, ResNet, _image_inputs,
               batch=64, seq=224, tiny=_TINY_CNN, tiny_seq=32,
               description="ResNet-50 v1.5 (He et al. 2016), ImageNet 224x224"))
register(Entry("inception", "inception", CNNConfig, Inception, _image_inputs,
               batch=64, seq=224, tiny=_TINY_CNN, tiny_seq=32,
               description="GoogLeNet / Inception-v1 (Szegedy et al. 2015), 224x224"))
register(Entry("unet", "unet", CNNConfig, UNet, _image_inputs,
               config=dict(in_channels=3, num_classes=2, depth=4),
               batch=8, seq=256, tiny=_TINY_CNN, tiny_seq=32,
               description="U-Net (Ronneberger et al. 2015), same-padded, 256x256"))

register(Entry("gnmt", "gnmt", GNMTConfig, GNMT, _gnmt_inputs,
               batch=64, seq=32, tiny=dict(vocab=64, hidden=16, n_layer=3), tiny_seq=4,
               description="GNMT-8 (Wu et al. 2016): 8+8 LSTM layers of 1024, unrolled"))

register(Entry("dlrm", "dlrm", DLRMConfig, DLRM, _dlrm_inputs,
               batch=2048, seq=1,
               tiny=dict(rows=(50, 20, 1000, 7), dim=8, bottom=(16,), top=(16,)), tiny_seq=2,
               description="DLRM (Naumov et al. 2019), Criteo Kaggle tables, dim 128"))

__all__ = ["Entry", "META_THRESHOLD_BYTES", "build", "config", "entry", "family",
           "materialize", "materialize_tensor", "names", "num_params", "param_bytes", "register",
           "BERT", "DLRM", "GNMT", "GPT", "Inception", "ResNet", "UNet", "UTransformer",
           "CNNConfig", "DLRMConfig", "GNMTConfig", "TransformerConfig"]

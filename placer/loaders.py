"""Resolving what a user named on a command line: a model (``MODULE:FACTORY``
or a zoo name), a graph (file, shipped or synthetic name, or a model to
trace), a cluster (file or preset) and the stem of output files. Shared by
:mod:`placer.cli`, the runtime's command lines (:mod:`placer.cli_runtime`)
and :mod:`placer.export`; below all of them."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from ._cli import slow_stage
from .errors import PlacerError, TraceError

#: what ``trace``, ``plan MODEL`` and every other command that traces a model
#: make of it unless ``--granularity`` says otherwise
DEFAULT_GRANULARITY = "module"


def is_graph_file(text: str) -> bool:
    """Whether ``text`` names a graph file (by its suffix, or an existing path)."""
    return text.endswith((".json", ".json.gz")) or (os.path.sep in text and Path(text).is_file())


def parse_shape(text: str) -> tuple[int, ...]:
    """``--input-shape`` text (``8,3,224,224`` or ``8x1024``) -> the sizes."""
    try:
        shape = tuple(int(x) for x in text.lower().replace("x", ",").split(",") if x)
    except ValueError:
        raise PlacerError(f"bad input shape {text!r}", field="--input-shape",
                          fix="write sizes like 8,3,224,224 or 8x1024") from None
    if not shape or min(shape) < 1:
        raise PlacerError(f"bad input shape {text!r}", field="--input-shape",
                          fix="sizes must be positive integers")
    return shape


def load_factory(spec: str):
    """``MODULE:FACTORY`` -> the callable, imported from the current directory."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        # the one import of user code: named on the command line by the user
        # themselves, never read from a graph, cluster or plan file
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything on import
        raise TraceError(f"cannot import {module_name!r}: {exc}", field="MODEL",
                         fix="give MODULE:FACTORY importable from the current directory") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise TraceError(f"{module_name!r} has no callable {attr!r}", field="MODEL",
                         fix="FACTORY must be a function or class returning the model")
    return factory


def input_dtype_of(name: str):
    """``--input-dtype`` text -> the torch dtype."""
    import torch
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise PlacerError(f"unknown dtype {name!r}", field="--input-dtype",
                          fix="use e.g. float32 or int64")
    return dtype


def unknown_model(spec: str) -> PlacerError:
    """The one-line error for a model name that is neither a zoo model nor MODULE:FACTORY."""
    from . import datasets
    return PlacerError(f"unknown model {spec!r}", field="MODEL",
                       fix="give MODULE:FACTORY, a graph file, or a zoo model: "
                       + ", ".join(datasets.models()))


def check_model(spec: str, input_shapes: list[str] | None = None,
                input_dtype: str = "float32") -> None:
    """Raise the one-line error :func:`load_model` would raise for a model
    that cannot be found, without building it (for launchers that build it
    in other processes)."""
    from . import datasets
    if ":" in spec:
        load_factory(spec)
        input_dtype_of(input_dtype)
        for text in input_shapes or []:
            parse_shape(text)
    elif spec not in datasets.models():
        raise unknown_model(spec)


def load_model(spec: str, input_shapes: list[str] | None = None, input_dtype: str = "float32",
               batch: int | None = None, seq: int | None = None, tiny: bool = False,
               seed: int = 0, config: dict | None = None):
    """``module:factory`` or a zoo name -> ``(module, example_inputs)``.

    The one loader of ``trace``, ``plan``, ``run`` and ``launch`` (and the
    ranks under torchrun): the same spec and seed give the same weights and
    inputs in every process. ``config`` goes to the factory as keyword
    arguments (zoo models: config overrides such as ``n_layer``)."""
    import torch
    from . import datasets

    if ":" in spec:
        factory = load_factory(spec)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                made = factory(**(config or {}))
            except TypeError as exc:
                if config:
                    raise PlacerError(f"{spec} does not take {sorted(config)}: {exc}",
                                      field="--config",
                                      fix="give only keyword arguments the factory accepts"
                                      ) from None
                raise
        if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
            return made
        if not isinstance(made, torch.nn.Module):
            raise TraceError(f"{spec} returned {type(made).__name__}, not a torch.nn.Module",
                             field="MODEL", fix="return the model, or (model, example_inputs)")
        if not input_shapes:
            raise TraceError(f"{spec} returned only a model", field="--input-shape",
                             fix="pass --input-shape (e.g. 8,3,224,224) or return (model, inputs)")
        generator = torch.Generator().manual_seed(seed)
        dtype = input_dtype_of(input_dtype)
        inputs = []
        for text in input_shapes:
            shape = parse_shape(text)
            if dtype.is_floating_point:
                inputs.append(torch.randn(shape, generator=generator, dtype=dtype))
            else:
                inputs.append(torch.randint(0, 2, shape, generator=generator, dtype=dtype))
        return made, tuple(inputs)
    if spec in datasets.models():
        from . import zoo
        return zoo.build(spec, batch, seq, tiny=tiny, seed=seed, **(config or {}))
    raise unknown_model(spec)


def load_graph(spec: str, args: argparse.Namespace | None = None):
    """A graph file, a shipped graph name, a zoo model or ``module:factory``."""
    from . import datasets
    from .graph import Graph

    if is_graph_file(spec):
        with slow_stage(f"placer {getattr(args, 'command', None) or 'trace'}",
                        f"loading {spec}"):
            return Graph.load(spec)
    if ":" not in spec and spec in datasets.graphs() and not getattr(args, "tiny", False):
        return datasets.graph(spec)
    granularity = getattr(args, "granularity", None) or DEFAULT_GRANULARITY
    if ":" not in spec and spec not in datasets.models():
        try:
            return datasets.graph(spec)  # synthetic names like layered-n100-w8-s0
        except PlacerError:
            pass
    from .trace import trace
    model, inputs = load_model(spec, getattr(args, "input_shape", None),
                               getattr(args, "input_dtype", "float32"),
                               getattr(args, "batch", None), getattr(args, "seq", None),
                               getattr(args, "tiny", False))
    with slow_stage(f"placer {getattr(args, 'command', None) or 'trace'}",
                    f"tracing {spec} ({granularity} granularity)"):
        return trace(model, inputs, granularity=granularity, name=spec.rpartition(":")[2])


def load_cluster(spec: str):
    """A cluster file or a preset name."""
    from .cluster import Cluster

    if spec.endswith((".yaml", ".yml", ".json")) or os.path.sep in spec:
        return Cluster.load(spec)
    if spec == "local":
        return Cluster.local()
    return Cluster.preset(spec)

def outputs_next_to(path: str) -> str:
    """``path`` without its ``.json``/``.json.gz`` suffix: the stem of files written beside it."""
    p = str(path)
    for suffix in (".json.gz", ".json"):
        if p.endswith(suffix):
            return p[: -len(suffix)]
    return p

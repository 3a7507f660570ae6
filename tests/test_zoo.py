"""The model zoo: every model builds small, runs, fx-traces; big ones stay on meta."""

from __future__ import annotations

import pytest
import torch
import torch.fx

import placer
from placer import zoo

REQUIRED = {"gpt-125m", "gpt-350m", "gpt-1.3b", "gpt-6.7b", "bert-base", "bert-large",
            "resnet50", "inception", "unet", "moe", "gnmt", "dlrm"}


def test_registry_lists_the_required_models():
    assert REQUIRED <= set(zoo.names())
    assert placer.datasets.models() == zoo.names()


@pytest.mark.parametrize("name", zoo.names())
def test_tiny_model_runs_and_fx_traces(name):
    module, inputs = placer.datasets.model(name, tiny=True)
    assert all(p.device.type == "cpu" for p in module.parameters())
    out = module(*inputs)
    assert torch.isfinite(out).all()
    traced = torch.fx.symbolic_trace(module)
    assert torch.allclose(traced(*inputs), out, atol=1e-6)
    out.float().sum().backward()
    assert any(p.grad is not None for p in module.parameters())


def test_overrides_and_explicit_sizes():
    module, (idx,) = placer.datasets.model("gpt-125m", batch=3, seq=12, vocab=100,
                                           n_layer=2, d_model=64, n_head=4)
    assert idx.shape == (3, 12) and int(idx.max()) < 100
    assert len(module.blocks) == 2
    assert module(idx).shape == (3, 12, 100)


def test_unknown_override_and_too_long_sequence_are_rejected():
    with pytest.raises(TypeError, match="unknown config field"):
        zoo.build("gpt-125m", tiny=True, n_layers=2)
    with pytest.raises(ValueError, match="max_seq"):
        zoo.build("gpt-125m", seq=4096, device="meta")
    with pytest.raises(KeyError):
        zoo.build("no-such-model")


def test_builds_are_deterministic():
    a, in_a = zoo.build("bert-base", tiny=True)
    b, in_b = zoo.build("bert-base", tiny=True)
    for x, y in zip(in_a, in_b):
        assert torch.equal(x, y)
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name


def test_tied_embeddings():
    module, _ = zoo.build("gpt-125m", tiny=True)
    assert module.lm_head.weight is module.wte.weight


@pytest.mark.parametrize("name, expected", [
    ("gpt-125m", 125e6), ("gpt-350m", 350e6), ("gpt-1.3b", 1.3e9), ("gpt-6.7b", 6.7e9),
    ("bert-base", 110e6), ("bert-large", 340e6), ("resnet50", 25.6e6),
    ("inception", 6.8e6), ("unet", 31e6)])
def test_standard_configs_have_the_published_size(name, expected):
    module, inputs = zoo.build(name, device="meta")
    assert zoo.num_params(module) == pytest.approx(expected, rel=0.15)
    assert all(p.is_meta for p in module.parameters())
    assert all(t.is_meta for t in inputs)


@pytest.mark.parametrize("name", ["gpt-1.3b", "gpt-6.7b", "dlrm", "moe"])
def test_large_models_build_on_meta_automatically(name):
    module, inputs = zoo.build(name)
    assert zoo.param_bytes(module) > zoo.META_THRESHOLD_BYTES
    assert all(p.is_meta for p in module.parameters())
    assert all(t.is_meta for t in inputs)


def test_meta_forward_gives_the_output_shape():
    module, inputs = zoo.build("gpt-1.3b", batch=2, seq=128)
    assert module(*inputs).shape == (2, 128, 50257)


def test_moe_routes_to_top_k_with_static_capacity():
    module, (idx,) = zoo.build("moe", batch=2, seq=16, tiny=True)
    moe = next(m for m in module.modules() if isinstance(m, zoo.transformer.MoE))
    assert moe.top_k == 2 and moe.capacity == int(1.25 * 2 * 16 * 2 / 4)
    names = {n.target for n in torch.fx.symbolic_trace(module).graph.nodes
             if n.op == "call_module"}
    assert any(".experts.3." in str(t) for t in names)  # experts are separate ops


def test_gnmt_is_unrolled():
    module, inputs = zoo.build("gnmt", tiny=True, seq=5)
    cells = [n for n in torch.fx.symbolic_trace(module).graph.nodes
             if n.op == "call_module" and str(n.target).startswith(("enc", "dec"))]
    assert len(cells) >= 5 * 3


def test_materialize_allocates_and_keeps_ties():
    module, _ = zoo.build("gpt-125m", tiny=True, device="meta")
    zoo.materialize(module, "cpu")
    assert module.lm_head.weight is module.wte.weight
    assert not any(p.is_meta for p in module.parameters())
    idx = torch.zeros(1, 4, dtype=torch.long)
    assert torch.isfinite(module(idx)).all()

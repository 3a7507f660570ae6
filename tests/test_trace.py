"""Tests of placer.trace: capture, FLOPs, bytes, shared weights, meta models."""

from __future__ import annotations

import math
import resource

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import placer
from placer._flops import FusedAttentionOnMeta, flop_counter, model_flops
from placer.errors import TraceError
from placer.trace import trace


# --- small models ----------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, d, heads, sdpa=True):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.size()
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            y = att.softmax(dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d=32, heads=4, sdpa=True):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, sdpa)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=100, d=32, layers=2, heads=4, seq=16, sdpa=True):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight        # tied

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class Inception(nn.Module):
    """Parallel branches joined by a concat, then a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.Conv2d(8, 4, 1)
        self.b3 = nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU(inplace=True),
                                nn.Conv2d(4, 6, 3, padding=1))
        self.b5 = nn.Sequential(nn.Conv2d(8, 2, 1), nn.ReLU(), nn.Conv2d(2, 4, 5, padding=2))
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(8, 2, 1))
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.stem(x))
        y = torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], dim=1)
        y = self.bn(y)
        return self.fc(y.mean(dim=(2, 3)))


class ShapeBranch(nn.Module):
    """fx cannot follow a branch on a shape; torch.export specializes it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x):
        if x.shape[0] > 2:
            x = self.a(x).relu()
        return self.b(x)


class Gated(nn.Module):
    """Data-dependent control flow: only runs on real data."""

    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.alt = nn.Linear(d, d)

    def forward(self, x):
        if x.sum() > 0:
            return self.lin(x)
        return self.alt(x) * 2


class GatedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Gated(), Gated()])
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def unique_param_bytes(model):
    seen = {}
    for p in model.parameters():
        seen[id(p)] = p.numel() * p.element_size()
    return sum(seen.values())


def check_flops(model, args, graph, counter=flop_counter):
    fwd, bwd = model_flops(model, args, counter=counter)
    assert graph.total_flops() == fwd
    assert graph.total_bwd_flops() == bwd
    assert fwd > 0 and bwd > 0


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --- tests -----------------------------------------------------------------
def test_transformer_block_ops_and_costs():
    model = Block(sdpa=False)
    x = torch.randn(2, 16, 32)
    graph = trace(model, x)
    assert graph.meta["tracer"] == "fx"
    assert graph.op("x").op == "input"
    assert graph.op("x").output_bytes == x.numel() * 4
    qkv = graph.op("attn.qkv")
    assert qkv.op == "linear"
    assert qkv.flops == 2 * 2 * 16 * 32 * 96
    assert qkv.extra["module"] == "attn.qkv" and qkv.extra["shape"] == [2, 16, 96]
    assert graph.edge("ln1", "attn.qkv").bytes == x.numel() * 4
    assert graph.op("mlp.0").op == "linear" and graph.op("ln1").op == "layernorm"
    assert graph.total_param_bytes() == unique_param_bytes(model)
    assert graph.topological_order()[0] == "x"
    check_flops(model, (x,), graph, counter=lambda: torch.utils.flop_counter.FlopCounterMode(
        display=False))


def test_split_outputs_travel_as_pieces():
    graph = trace(Block(sdpa=False), torch.randn(2, 16, 32))
    split = [op for op in graph if op.op == "split"]
    assert len(split) == 1
    # q, k and v leave the split as three tensors, none of them the whole tuple.
    for succ in graph.successors(split[0].id):
        assert graph.edge(split[0].id, succ).bytes == 2 * 16 * 32 * 4
    assert not [op for op in graph if op.op == "getitem"]
    assert not [op for op in graph if op.op in ("size", "getattr")]


@pytest.mark.parametrize("make, args", [
    (lambda: Block(sdpa=False), lambda: (torch.randn(2, 16, 32),)),
    (lambda: Block(sdpa=True), lambda: (torch.randn(2, 16, 32),)),
    (lambda: GPT(), lambda: (torch.randint(0, 100, (2, 16)),)),
    (lambda: Inception(), lambda: (torch.randn(2, 3, 12, 12),)),
    (lambda: ShapeBranch(), lambda: (torch.randn(4, 8),)),
])
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_flop_sums_match_whole_model(make, args, device):
    model, inputs = make(), args()
    graph = trace(model, inputs, device=device)
    check_flops(model, inputs, graph)
    assert graph.meta["execution"] == ("meta" if device == "auto" else "cpu")


def test_backward_is_measured_not_assumed():
    # The first Linear sees an input without gradient: only its weight gradient
    # is computed, so its backward equals its forward, not twice it.
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    graph = trace(model, torch.randn(2, 8))
    assert graph.op("0").bwd_flops == graph.op("0").flops
    assert graph.op("2").bwd_flops == 2 * graph.op("2").flops
    assert graph.op("1").bwd_flops == 0


def test_inception_branches_and_concat():
    model = Inception()
    x = torch.randn(2, 3, 12, 12)
    stats = model.bn.running_mean.clone()
    graph = trace(model, x, device="cpu")
    assert torch.equal(model.bn.running_mean, stats)      # the model is not modified
    assert all(p.grad is None for p in model.parameters()) and model.training
    cat = next(op for op in graph if op.op == "cat")
    assert len(graph.predecessors(cat.id)) == 4
    assert cat.extra["shape"] == [2, 16, 12, 12]
    assert graph.op("bn").extra["buffer_bytes"] > 0
    relu = [op for op in graph if op.op == "relu" and op.extra["module"] is None]
    assert len(relu) == 1 and len(graph.successors(relu[0].id)) == 4
    assert graph.total_param_bytes() == unique_param_bytes(model)


def test_shared_weights_colocated_and_counted_once():
    model = GPT()
    graph = trace(model, torch.randint(0, 100, (2, 16)))
    assert graph.op("wte").colocate == graph.op("lm_head").colocate == "shared:lm_head.weight" \
        or graph.op("wte").colocate == "shared:wte.weight"
    groups = graph.colocation_groups()
    assert list(groups.values()) == [["wte", "lm_head"]]
    assert graph.op("wte").param_bytes == 100 * 32 * 4
    assert graph.op("lm_head").param_bytes == 0
    assert graph.total_param_bytes() == unique_param_bytes(model)


def test_functional_weight_shared_by_two_calls():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return F.linear(F.linear(x, self.w).relu(), self.w)

    model = Twice()
    graph = trace(model, torch.randn(3, 8))
    users = [op for op in graph if op.op == "linear"]
    assert len(users) == 2 and {op.colocate for op in users} == {"shared:w"}
    assert graph.total_param_bytes() == 8 * 8 * 4
    check_flops(model, (torch.randn(3, 8),), graph)


def test_export_fallback_on_shape_branch():
    model = ShapeBranch()
    graph = trace(model, torch.randn(4, 8))
    assert graph.meta["tracer"] == "export"
    assert graph.total_param_bytes() == unique_param_bytes(model)
    linears = [op for op in graph if op.op == "linear"]
    assert [op.extra["module"] for op in linears] == ["a", "b"]
    assert sum(op.param_bytes for op in linears) == unique_param_bytes(model)


def test_module_granularity_with_data_dependent_leaves():
    model = GatedNet()
    x = torch.randn(3, 4)
    graph = trace(model, x, granularity="module")
    assert graph.ids == ["x", "inp", "blocks.0", "blocks.1", "out"]
    assert graph.op("blocks.0").op == "gated"
    assert graph.meta["execution"] == "cpu"          # meta could not decide the branch
    assert graph.meta["granularity"] == "module"
    assert graph.total_param_bytes() == unique_param_bytes(model)
    check_flops(model, (x,), graph)


def test_module_granularity_gpt_blocks():
    model = GPT(layers=3)
    graph = trace(model, torch.randint(0, 100, (2, 16)), granularity="module")
    blocks = [op.id for op in graph if op.op == "block"]
    assert blocks == ["h.0", "h.1", "h.2"]
    assert {"wte", "wpe", "ln_f", "lm_head"} <= set(graph.ids)
    assert graph.op("wte").colocate == graph.op("lm_head").colocate is not None
    check_flops(model, (torch.randint(0, 100, (2, 16)),), graph)


def test_module_granularity_block_rule():
    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.b(self.a(x).relu())

    class Encoder(nn.Module):                # holds the stack: looked through
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Cell(), Cell()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Linear(4, 8), nn.ReLU())   # torch.nn only: one block
            self.encoder = Encoder()
            self.head = nn.Sequential(Cell(), nn.Linear(8, 2))      # looked through

        def forward(self, x):
            return self.head(self.encoder(self.stem(x)))

    graph = trace(Net(), torch.randn(3, 4), granularity="module")
    assert graph.ids == ["x", "stem", "encoder.layers.0", "encoder.layers.1", "head.0", "head.1"]
    assert graph.op("stem").op == "sequential" and graph.op("head.0").op == "cell"


def test_leaf_modules_override():
    model = GPT(layers=2)
    idx = torch.randint(0, 100, (2, 16))
    by_class = trace(model, idx, leaf_modules=[Attention])
    assert by_class.op("h.0.attn").op == "attention"
    assert "h.0.attn.qkv" not in by_class
    by_name = trace(model, idx, granularity="module", leaf_modules=["h.1", "Block"])
    assert [op.id for op in by_name if op.op == "block"] == ["h.0", "h.1"]


def test_untraceable_model_raises_trace_error():
    model = GatedNet()
    with pytest.raises(TraceError) as info:
        trace(model, torch.randn(3, 4))
    message = str(info.value)
    assert "Gated" in message and 'granularity="module"' in message
    assert "\n" not in message


@pytest.mark.parametrize("bad", ["text", 3, None])
def test_bad_inputs_raise_trace_error(bad):
    with pytest.raises(TraceError, match="example_inputs"):
        trace(nn.Linear(4, 4), bad)


def test_bad_options_raise_trace_error():
    with pytest.raises(TraceError, match="granularity"):
        trace(nn.Linear(4, 4), torch.randn(2, 4), granularity="layer")
    with pytest.raises(TraceError, match="Module"):
        trace(lambda x: x, torch.randn(2, 4))
    with pytest.raises(TraceError, match="forward"):
        trace(nn.Linear(4, 4), (torch.randn(2, 4), torch.randn(2, 4)))
    with pytest.raises(TraceError, match="failed"):
        trace(nn.Linear(4, 4), torch.randn(2, 5))


def test_kwargs_and_optional_arguments():
    class WithMask(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, mask=None, scale=2):
            y = self.lin(x) * scale
            if mask is not None:
                y = y + mask
            return y

    model = WithMask()
    plain = trace(model, {"x": torch.randn(2, 4)})
    assert "mask" not in plain and plain.meta["batch_inputs"] == {"x": [2, 4]}
    masked = trace(model, (torch.randn(2, 4), torch.randn(2, 4)))
    assert "mask" in masked and masked.successors("mask")


def test_inference_graph():
    graph = trace(Block(), torch.randn(2, 16, 32), training=False)
    assert not graph.training
    assert graph.total_bwd_flops() == 0 and graph.total_flops() > 0


def test_round_trip_and_determinism(tmp_path):
    model = GPT()
    idx = torch.randint(0, 100, (2, 16))
    graph = trace(model, idx, name="tiny-gpt")
    again = trace(GPT(), idx, name="tiny-gpt")
    assert graph.fingerprint() == again.fingerprint()
    path = tmp_path / "g.json.gz"
    graph.save(path)
    loaded = placer.Graph.load(path)
    assert loaded.fingerprint() == graph.fingerprint()
    assert loaded.meta["tracer"] == "fx"
    assert loaded.op("wte").colocate == graph.op("wte").colocate


def test_placer_trace_is_callable_after_submodule_import():
    import placer.trace as module
    graph = placer.trace(nn.Linear(4, 2), torch.randn(3, 4))
    assert module is not None and len(graph) == 2


def test_meta_model_with_1_3b_parameters_traces_without_allocating():
    with torch.device("meta"):
        model = GPT(vocab=50257, d=2048, layers=24, heads=16, seq=2048)
    n_params = sum(p.numel() for p in model.parameters())
    assert 1.2e9 < n_params < 1.4e9
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    graph = trace(model, torch.randint(0, 50257, (1, 128)))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 0.05 * n_params * 4
    assert graph.total_param_bytes() == pytest.approx(n_params * 4)
    assert graph.meta["execution"] == "meta"
    with torch.device("meta"), FusedAttentionOnMeta():
        fwd, bwd = model_flops(model, (torch.randint(0, 50257, (1, 128), device="meta"),))
    assert graph.total_flops() == fwd and graph.total_bwd_flops() == bwd


def test_meta_model_with_data_dependent_leaf_explains():
    with torch.device("meta"):
        model = GatedNet()
    with pytest.raises(TraceError, match="meta device"):
        trace(model, torch.randn(3, 4), granularity="module")


def _gpt2_small_figures() -> None:
    """Tracing time and size of a GPT-2-small-sized model (for the report)."""
    import time

    model = GPT(vocab=50257, d=768, layers=12, heads=12, seq=1024)
    idx = torch.randint(0, 50257, (8, 1024))
    for granularity in ("op", "module"):
        start = time.perf_counter()
        graph = trace(model, idx, granularity=granularity)
        took = time.perf_counter() - start
        print(f"{granularity:>6}: {took:6.2f} s  ops={len(graph)}  edges={len(graph.edges)}  "
              f"flops={graph.total_flops():.4g}  bwd={graph.total_bwd_flops():.4g}  "
              f"params={graph.total_param_bytes():.4g} B  exec={graph.meta['execution']}")


if __name__ == "__main__":
    _gpt2_small_figures()

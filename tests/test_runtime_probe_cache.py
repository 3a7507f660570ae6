"""The split's meta probes are kept (:func:`placer.runtime.split.probe`):
a module of the same code, weights and inputs gets what a fresh probe
finds, anything that changes them probes again."""

from __future__ import annotations

import torch

from placer.runtime import split as split_mod


def _gm(width: int = 8):
    model = torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    return model, torch.fx.symbolic_trace(model)


def _fresh(gm, inputs, batch, small):
    with split_mod._kept_state(gm):
        full, part, _meta = split_mod._probe(gm, inputs, batch, small)
    return full, part


def test_a_kept_probe_equals_a_fresh_one_and_counts_as_one_entry(monkeypatch):
    monkeypatch.setattr(split_mod, "_PROBES", {})
    _, gm = _gm()
    inputs = [torch.randn(6, 8)]
    first = split_mod.probe(gm, inputs, 6, 3)
    assert len(split_mod._PROBES) == 1
    # a second trace of the same model is the same module: kept, equal
    _, again = _gm()
    assert split_mod.probe(again, inputs, 6, 3) == first == _fresh(gm, inputs, 6, 3)
    assert len(split_mod._PROBES) == 1


def test_other_shapes_batches_or_weights_probe_again(monkeypatch):
    monkeypatch.setattr(split_mod, "_PROBES", {})
    _, gm = _gm()
    split_mod.probe(gm, [torch.randn(6, 8)], 6, 3)
    full, _ = split_mod.probe(gm, [torch.randn(10, 8)], 10, 5)
    assert (10, 4) in {desc[1] for desc in full.values()}
    split_mod.probe(gm, [torch.randn(6, 8)], 6, 2)
    _, wider = _gm(12)
    full, _ = split_mod.probe(wider, [torch.randn(6, 12)], 6, 3)
    assert len(split_mod._PROBES) == 4
    assert full == _fresh(wider, [torch.randn(6, 12)], 6, 3)[0]


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(split_mod, "_PROBES", {})
    monkeypatch.setattr(split_mod, "PROBE_CACHE_SIZE", 2)
    _, gm = _gm()
    for rows in (4, 6, 8):
        split_mod.probe(gm, [torch.randn(rows, 8)], rows, 2)
    assert len(split_mod._PROBES) == 2


class _SliceBetween(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.a(x)[:, :8])


def test_two_cuts_with_alike_top_code_are_kept_apart(monkeypatch):
    """A split module's own code and weights can be the same for two cuts
    (two pieces called in turn, the slice between the layers on either
    side of the cut); what crosses between them is not."""
    from torch.fx.passes.split_module import split_module
    monkeypatch.setattr(split_mod, "_PROBES", {})
    model = _SliceBetween()
    inputs = [torch.randn(6, 8)]
    tops = []
    for last in ("a", "getitem"):      # the first piece ends before / after the slice
        gm = torch.fx.symbolic_trace(model)
        names = [n.name for n in gm.graph.nodes]
        tops.append(split_module(gm, model, lambda n, last=last: int(
            names.index(n.name) > names.index(last))))
    assert tops[0].code == tops[1].code
    first = split_mod.probe(tops[0], inputs, 6, 3)
    second = split_mod.probe(tops[1], inputs, 6, 3)
    assert first != second and second == _fresh(tops[1], inputs, 6, 3)

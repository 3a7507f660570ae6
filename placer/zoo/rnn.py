"""GNMT-like LSTM encoder-decoder (Wu et al. 2016), unrolled in time.

Each layer is an ``nn.LSTMCell`` called once per time step over a sequence
length fixed at construction, so the traced graph has ``layers x steps`` small
cells with wavefront parallelism: cell (layer l, step t) needs only (l-1, t)
and (l, t-1). As in GNMT the first encoder layer is bidirectional, residual
connections start at the third layer, and the decoder attends over the encoder
outputs at every step (additive input feeding of the attention context).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GNMTConfig:
    """``n_layer`` encoder and ``n_layer`` decoder LSTM layers of ``hidden``
    units, unrolled over ``seq`` steps (source and target)."""

    vocab: int = 32000
    hidden: int = 1024
    n_layer: int = 8
    seq: int = 32


class GNMT(nn.Module):
    """``forward(src, tgt)`` takes token ids ``(batch, seq)`` each and returns
    logits ``(batch, seq, vocab)``."""

    def __init__(self, cfg: GNMTConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.src_emb = nn.Embedding(cfg.vocab, h)
        self.tgt_emb = nn.Embedding(cfg.vocab, h)
        self.enc_fwd = nn.LSTMCell(h, h)
        self.enc_bwd = nn.LSTMCell(h, h)
        self.enc = nn.ModuleList([nn.LSTMCell(2 * h, h)] +
                                 [nn.LSTMCell(h, h) for _ in range(cfg.n_layer - 2)])
        self.dec = nn.ModuleList([nn.LSTMCell(2 * h, h)] +
                                 [nn.LSTMCell(2 * h, h) for _ in range(cfg.n_layer - 1)])
        self.attn_query = nn.Linear(h, h, bias=False)
        self.out = nn.Linear(h, cfg.vocab)

    def _run(self, cell, inputs, zeros, residual_from=None):
        state = (zeros, zeros)
        outputs = []
        for t, x in enumerate(inputs):
            state = cell(x, state)
            y = state[0]
            if residual_from is not None:
                y = y + residual_from[t]
            outputs.append(y)
        return outputs

    def forward(self, src, tgt):
        steps = self.cfg.seq
        src_e = self.src_emb(src)
        tgt_e = self.tgt_emb(tgt)
        zeros = torch.zeros_like(src_e[:, 0])
        xs = [src_e[:, t] for t in range(steps)]
        fwd = self._run(self.enc_fwd, xs, zeros)
        bwd = self._run(self.enc_bwd, xs[::-1], zeros)[::-1]
        xs = [torch.cat([f, b], dim=-1) for f, b in zip(fwd, bwd)]
        for i, cell in enumerate(self.enc):
            xs = self._run(cell, xs, zeros, residual_from=xs if i >= 1 else None)
        memory = torch.stack(xs, dim=1)                              # (B, S, h)

        # Decoder: the first layer's output queries the encoder memory; the
        # layers above get [input, this step's context], the first layer the
        # previous step's context (input feeding).
        states = [(zeros, zeros) for _ in self.dec]
        outputs = []
        context = zeros
        for t in range(steps):
            x = tgt_e[:, t]
            for i, cell in enumerate(self.dec):
                states[i] = cell(torch.cat([x, context], dim=-1), states[i])
                y = states[i][0]
                if i == 0:
                    scores = torch.bmm(memory, self.attn_query(y).unsqueeze(2))
                    weights = F.softmax(scores, dim=1)               # (B, S, 1)
                    context = (weights * memory).sum(dim=1)
                x = y + x if i >= 2 else y
            outputs.append(x)
        return self.out(torch.stack(outputs, dim=1))

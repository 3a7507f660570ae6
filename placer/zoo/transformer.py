"""Transformer families: GPT-style decoder, BERT-style encoder, a GShard/Tutel
style mixture-of-experts decoder and a U-shaped transformer.

Every ``forward`` is free of data-dependent Python control flow so that
``torch.fx.symbolic_trace`` records the whole model: shapes are split with
``unflatten``/``flatten`` on sizes fixed at construction, attention is
``F.scaled_dot_product_attention``, and MoE routing is a dense dispatch with
one-hot masks and a static per-expert capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TransformerConfig:
    """Sizes of a transformer; ``d_ff`` 0 means ``4 * d_model``.

    ``max_seq`` is the length of the learned position table. The MoE fields
    (``n_expert``, ``top_k``, ``moe_every``, ``capacity_factor``) are used only
    by the MoE model; ``tokens`` (batch x seq, filled in by the zoo) fixes the
    experts' static capacity.
    """

    vocab: int = 50257
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    d_ff: int = 0
    max_seq: int = 2048
    type_vocab: int = 2
    n_expert: int = 8
    top_k: int = 2
    moe_every: int = 2
    capacity_factor: float = 1.25
    tokens: int = 8192

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection."""

    def __init__(self, cfg: TransformerConfig, causal: bool):
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_head {cfg.n_head}")
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.causal = causal
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, self.n_head, self.head_dim)).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    """Position-wise feed-forward: Linear, GELU, Linear."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff)
        self.proj = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class MoE(nn.Module):
    """Top-k gated mixture of experts with GShard/Tutel dense dispatch.

    Tokens are routed to their ``top_k`` experts; each expert takes at most
    ``capacity`` tokens (later ones are dropped, as in GShard). Dispatch and
    combine are einsums with a (tokens, experts, capacity) one-hot tensor, so
    the traced graph has no data-dependent indexing. Experts are separate
    modules so a placement can spread them over devices (expert parallelism).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_expert = cfg.n_expert
        self.top_k = min(cfg.top_k, cfg.n_expert)
        self.capacity = max(1, int(cfg.capacity_factor * cfg.tokens * self.top_k
                                   / cfg.n_expert))
        self.gate = nn.Linear(cfg.d_model, cfg.n_expert, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.d_model, cfg.ff) for _ in range(cfg.n_expert))

    def forward(self, x):
        tokens = x.flatten(0, -2)                                   # (N, d)
        probs = F.softmax(self.gate(tokens), dim=-1)                # (N, E)
        top_p, top_i = torch.topk(probs, self.top_k, dim=-1)        # (N, k)
        top_p = top_p / top_p.sum(-1, keepdim=True)
        chosen = F.one_hot(top_i, self.n_expert).to(x.dtype)        # (N, k, E)
        # Slot of each token in its expert's buffer: earlier tokens (and a
        # token's first choice before its second) get the lower slots.
        flat = chosen.transpose(0, 1).flatten(0, 1)                 # (k*N, E)
        slot = (torch.cumsum(flat, dim=0) - 1.0) * flat
        slot = slot.unflatten(0, (self.top_k, -1)).transpose(0, 1)  # (N, k, E)
        keep = chosen * (slot < self.capacity).to(x.dtype)
        slot_1h = F.one_hot(slot.sum(-1).long().clamp(0, self.capacity - 1),
                            self.capacity).to(x.dtype)              # (N, k, C)
        dispatch = torch.einsum("nke,nkc->nec", keep, slot_1h)      # (N, E, C)
        combine = torch.einsum("nk,nke,nkc->nec", top_p, keep, slot_1h)
        expert_in = torch.einsum("nec,nd->ecd", dispatch, tokens)   # (E, C, d)
        outs = [expert(expert_in[e]) for e, expert in enumerate(self.experts)]
        expert_out = torch.stack(outs, dim=0)                       # (E, C, d)
        y = torch.einsum("nec,ecd->nd", combine, expert_out)
        return y.view_as(x)


class DecoderBlock(nn.Module):
    """Pre-LayerNorm transformer block (GPT-2 style), dense or MoE feed-forward."""

    def __init__(self, cfg: TransformerConfig, causal: bool = True, moe: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg, causal)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MoE(cfg) if moe else MLP(cfg.d_model, cfg.ff)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-style decoder-only language model with tied input/output embeddings.

    ``forward(idx)`` takes token ids ``(batch, seq)`` and returns logits
    ``(batch, seq, vocab)``. With ``moe=True`` every ``moe_every``-th block
    (the 2nd, 4th, ...) has a mixture-of-experts feed-forward.
    """

    def __init__(self, cfg: TransformerConfig, moe: bool = False):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq, cfg.d_model)
        self.blocks = nn.ModuleList(
            DecoderBlock(cfg, causal=True, moe=moe and (i % cfg.moe_every == cfg.moe_every - 1))
            for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class BertLayer(nn.Module):
    """Post-LayerNorm encoder layer (BERT style), bidirectional attention."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.attn = SelfAttention(cfg, causal=False)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg.d_model, cfg.ff)
        self.ln2 = nn.LayerNorm(cfg.d_model)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class BERT(nn.Module):
    """BERT-style encoder with a masked-language-model head (tied decoder).

    ``forward(input_ids, token_type_ids)`` returns MLM logits
    ``(batch, seq, vocab)``.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab, cfg.d_model)
        self.position = nn.Embedding(cfg.max_seq, cfg.d_model)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.d_model)
        self.ln_emb = nn.LayerNorm(cfg.d_model)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.n_layer))
        self.head_dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.head_ln = nn.LayerNorm(cfg.d_model)
        self.decoder = nn.Linear(cfg.d_model, cfg.vocab)
        self.decoder.weight = self.word.weight

    def forward(self, input_ids, token_type_ids):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        x = (self.word(input_ids) + self.position(positions)
             + self.token_type(token_type_ids))
        x = self.ln_emb(x)
        for layer in self.layers:
            x = layer(x)
        return self.decoder(self.head_ln(F.gelu(self.head_dense(x))))


class UTransformer(nn.Module):
    """A U-shaped transformer: encoder blocks at shrinking token counts
    (tokens pooled in pairs), a bottleneck, then decoder blocks upsampling back
    and adding the skip from the matching encoder level (as in U-Net).

    ``forward(idx)`` returns logits ``(batch, seq, vocab)``; ``seq`` must be
    divisible by ``2 ** (n_layer // 2)``.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.levels = max(1, cfg.n_layer // 2)
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq, cfg.d_model)
        self.down = nn.ModuleList(DecoderBlock(cfg, causal=False) for _ in range(self.levels))
        self.pool = nn.ModuleList(nn.Linear(2 * cfg.d_model, cfg.d_model)
                                  for _ in range(self.levels))
        self.mid = DecoderBlock(cfg, causal=False)
        self.unpool = nn.ModuleList(nn.Linear(cfg.d_model, 2 * cfg.d_model)
                                    for _ in range(self.levels))
        self.up = nn.ModuleList(DecoderBlock(cfg, causal=False) for _ in range(self.levels))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        skips = []
        for block, pool in zip(self.down, self.pool):
            x = block(x)
            skips.append(x)
            x = pool(x.unflatten(1, (-1, 2)).flatten(2))           # halve the tokens
        x = self.mid(x)
        for block, unpool, skip in zip(self.up, self.unpool, reversed(skips)):
            x = unpool(x).unflatten(2, (2, -1)).flatten(1, 2)      # double the tokens
            x = block(x + skip)
        return self.lm_head(self.ln_f(x))

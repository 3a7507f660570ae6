"""DLRM-like recommender (Naumov et al. 2019): large sparse embedding tables,
a bottom MLP over dense features, pairwise dot-product interaction, top MLP.

The default table sizes are the 26 categorical cardinalities of the Criteo
Kaggle display-advertising data set, so the tables hold ~34 M rows: with 128-wide
fp32 rows that is ~17 GB of parameters, the memory-bound, placement-critical
part of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

CRITEO_KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
                      8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18,
                      15, 286181, 105, 142572)


@dataclass
class DLRMConfig:
    """``rows`` per embedding table, ``dim`` the embedding width (the last
    bottom-MLP width too), ``pooling`` indices summed per bag."""

    rows: tuple = CRITEO_KAGGLE_ROWS
    dim: int = 128
    dense_features: int = 13
    bottom: tuple = (512, 256)
    top: tuple = (1024, 1024, 512, 256)
    pooling: int = 1


def mlp(sizes: list[int], final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """``forward(dense, sparse)``: dense features ``(batch, dense_features)``
    float, sparse indices ``(batch, tables, pooling)`` long; returns click
    probabilities ``(batch, 1)``."""

    def __init__(self, cfg: DLRMConfig):
        super().__init__()
        self.cfg = cfg
        self.bottom = mlp([cfg.dense_features, *cfg.bottom, cfg.dim], final_activation=True)
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, cfg.dim, mode="sum")
                                    for n in cfg.rows)
        self.features = len(cfg.rows) + 1
        pairs = self.features * (self.features - 1) // 2
        self.top = mlp([cfg.dim + pairs, *cfg.top, 1], final_activation=False)

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        embedded = [table(sparse[:, i]) for i, table in enumerate(self.tables)]
        features = torch.stack([x, *embedded], dim=1)               # (B, F, dim)
        dots = torch.bmm(features, features.transpose(1, 2))        # (B, F, F)
        # Index built in forward (not a buffer) so meta-built models carry no
        # uninitialised index tensors.
        li, lj = torch.tril_indices(self.features, self.features, -1, device=dots.device)
        pairs = dots[:, li, lj]                                     # (B, F*(F-1)/2)
        return torch.sigmoid(self.top(torch.cat([x, pairs], dim=1)))

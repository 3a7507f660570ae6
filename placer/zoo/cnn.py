"""Convolutional families: ResNet-50, an Inception (GoogLeNet) network and a U-Net.

Written from the papers (He et al. 2016; Szegedy et al. 2015; Ronneberger et
al. 2015) without torchvision so the zoo has no extra dependency.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class CNNConfig:
    """Sizes of a CNN: ``width`` scales every channel count (1.0 = the paper's),
    ``blocks`` is ResNet's blocks per stage, ``depth`` U-Net's number of
    down/up levels and ``in_channels``/``num_classes`` the input and output."""

    width: float = 1.0
    blocks: tuple = (3, 4, 6, 3)
    depth: int = 4
    in_channels: int = 3
    num_classes: int = 1000

    def ch(self, channels: int) -> int:
        return max(4, int(round(channels * self.width)))


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, padding: int | None = None):
    """Conv (no bias), BatchNorm, ReLU."""
    pad = k // 2 if padding is None else padding
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, pad, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=False))


class Bottleneck(nn.Module):
    """ResNet bottleneck: 1x1 reduce, 3x3, 1x1 expand (x4), residual add."""

    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        cout = 4 * mid
        self.conv1 = conv_bn(cin, mid, 1)
        self.conv2 = conv_bn(mid, mid, 3, stride)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        y = self.bn3(self.conv3(self.conv2(self.conv1(x))))
        return F.relu(y + identity)


class ResNet(nn.Module):
    """ResNet-50 (v1.5: stride on the 3x3). ``forward(images)`` -> logits."""

    def __init__(self, cfg: CNNConfig):
        super().__init__()
        c = cfg.ch
        self.stem = nn.Sequential(conv_bn(cfg.in_channels, c(64), 7, 2),
                                  nn.MaxPool2d(3, 2, 1))
        stages = []
        cin = c(64)
        for i, n in enumerate(cfg.blocks):
            mid = c(64 * 2 ** i)
            blocks = []
            for j in range(n):
                blocks.append(Bottleneck(cin, mid, 2 if (j == 0 and i > 0) else 1))
                cin = 4 * mid
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, cfg.num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class InceptionBlock(nn.Module):
    """Four parallel branches (1x1; 1x1->3x3; 1x1->5x5; pool->1x1), concatenated."""

    def __init__(self, cin, c1, c3r, c3, c5r, c5, cp):
        super().__init__()
        self.b1 = conv_bn(cin, c1, 1)
        self.b3 = nn.Sequential(conv_bn(cin, c3r, 1), conv_bn(c3r, c3, 3))
        self.b5 = nn.Sequential(conv_bn(cin, c5r, 1), conv_bn(c5r, c5, 5))
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv_bn(cin, cp, 1))
        self.out_channels = c1 + c3 + c5 + cp

    def forward(self, x):
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], dim=1)


# GoogLeNet's table 1: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj).
_GOOGLENET = {"3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
              "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
              "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
              "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
              "5b": (384, 192, 384, 48, 128, 128)}


class Inception(nn.Module):
    """GoogLeNet-style Inception network (9 four-branch blocks), no auxiliary heads."""

    def __init__(self, cfg: CNNConfig):
        super().__init__()
        c = cfg.ch
        self.stem = nn.Sequential(conv_bn(cfg.in_channels, c(64), 7, 2), nn.MaxPool2d(3, 2, 1),
                                  conv_bn(c(64), c(64), 1), conv_bn(c(64), c(192), 3),
                                  nn.MaxPool2d(3, 2, 1))
        layers = []
        cin = c(192)
        for name, sizes in _GOOGLENET.items():
            if name in ("4a", "5a"):
                layers.append(nn.MaxPool2d(3, 2, 1))
            block = InceptionBlock(cin, *(c(s) for s in sizes))
            layers.append(block)
            cin = block.out_channels
        self.blocks = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, cfg.num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class DoubleConv(nn.Sequential):
    def __init__(self, cin: int, cout: int):
        super().__init__(conv_bn(cin, cout, 3), conv_bn(cout, cout, 3))


class UNet(nn.Module):
    """U-Net: ``depth`` down levels (double conv, max-pool), a bottleneck, and
    up levels (transposed conv, concat skip, double conv); same-padded so the
    output has the input's height and width. ``forward(images)`` returns
    per-pixel logits ``(batch, num_classes, H, W)``; H and W must be divisible
    by ``2 ** depth``."""

    def __init__(self, cfg: CNNConfig):
        super().__init__()
        c = cfg.ch
        chans = [c(64 * 2 ** i) for i in range(cfg.depth + 1)]
        self.inc = DoubleConv(cfg.in_channels, chans[0])
        self.downs = nn.ModuleList(DoubleConv(chans[i], chans[i + 1])
                                   for i in range(cfg.depth))
        self.ups = nn.ModuleList(nn.ConvTranspose2d(chans[i + 1], chans[i], 2, 2)
                                 for i in reversed(range(cfg.depth)))
        self.up_convs = nn.ModuleList(DoubleConv(2 * chans[i], chans[i])
                                      for i in reversed(range(cfg.depth)))
        self.head = nn.Conv2d(chans[0], cfg.num_classes, 1)

    def forward(self, x):
        x = self.inc(x)
        skips = []
        for down in self.downs:
            skips.append(x)
            x = down(F.max_pool2d(x, 2))
        for up, conv, skip in zip(self.ups, self.up_convs, reversed(skips)):
            x = conv(torch.cat([skip, up(x)], dim=1))
        return self.head(x)

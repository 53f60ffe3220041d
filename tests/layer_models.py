"""Small models for the layer tests, whose MACs are counted by hand in test_layers.py."""

from __future__ import annotations

import torch.nn as nn


def small_cnn() -> nn.Module:
    """conv 3->8 3x3 pad 1, BN, ReLU, max pool 2, conv 8->16 3x3 pad 1, ReLU, pool, linear."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def tiny_mlp() -> nn.Module:
    """Three layers: few enough plans for brute force."""
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))

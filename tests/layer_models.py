"""Models for the layer tests: small ones, whose MACs test_layers.py counts by hand, and VGG16."""

from __future__ import annotations

import torch
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


VGG16_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                512, 512, 512, "M")


class Vgg16(nn.Module):
    """torchvision's VGG16 (its module names too), so that its rows are tests/data/layers'.

    Why not torchvision's own: it is not importable beside every torch build.
    """

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in VGG16_LAYOUT:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                channels = int(v)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, 4096),
            nn.ReLU(True), nn.Dropout(), nn.Linear(4096, 1000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))

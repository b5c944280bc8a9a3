"""Networks as a user writes them, chosen with ``--model.arch=tests.support.user_nets.<name>``: factories called with
``num_classes`` and ``in_channels``, none of them known to the machinery. Small, for 32 px test images."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


def _conv(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def sequential_convnet(num_classes: int, in_channels: int) -> nn.Sequential:
    """An ``nn.Sequential`` of four named children: it declares nothing, and splits at its children."""
    return nn.Sequential(
        OrderedDict(
            stem=_conv(in_channels, 8, 1),
            block1=_conv(8, 16, 2),
            block2=_conv(16, 32, 2),
            head=nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(32, num_classes)),
        )
    )


class TwoPartNet(nn.Module):
    """Not an ``nn.Sequential``: a feature extractor and a classifier, with pooling in ``forward``."""

    def __init__(self, num_classes: int, in_channels: int) -> None:
        super().__init__()
        self.features = nn.Sequential(_conv(in_channels, 8, 1), _conv(8, 16, 2))
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean(dim=(2, 3)))


class DeclaredNet(TwoPartNet):
    """The same network, declaring its blocks itself."""

    def network_blocks(self) -> list[tuple[str, nn.Module]]:
        pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), self.classifier)
        return [("features.0", self.features[0]), ("features.1", self.features[1]), ("classifier", pool)]


def undeclared_net(num_classes: int, in_channels: int) -> TwoPartNet:
    return TwoPartNet(num_classes, in_channels)


def declared_net(num_classes: int, in_channels: int) -> DeclaredNet:
    return DeclaredNet(num_classes, in_channels)


def mismatched_net(num_classes: int, in_channels: int) -> nn.Sequential:
    """A user's mistake: a classifier whose input size does not match its features, which fails at the first
    forward pass."""
    return nn.Sequential(nn.Flatten(1), nn.Linear(7, num_classes))

"""The bare networks: torchvision classification models, built by name, without pretrained weights.

Kept apart from the LightningModule so a network can be used, tested or swapped on its own.
"""

from __future__ import annotations

import torchvision
from torch import nn

from project.toolkit.errors import ProjectError


def available_archs() -> list[str]:
    """Names of torchvision's image-classification builders (``resnet50``, ``mobilenet_v2``, ...).

    >>> {"mobilenet_v2", "resnet50"} <= set(available_archs())
    True
    """
    return torchvision.models.list_models(module=torchvision.models)


def build_network(arch: str, num_classes: int) -> nn.Module:
    """A randomly initialised torchvision classifier with ``num_classes`` outputs.

    >>> net = build_network("mobilenet_v2", num_classes=10)
    >>> net.classifier[-1].out_features
    10
    """
    choices = available_archs()
    if arch not in choices:
        raise ProjectError(
            f"model.arch={arch!r} is not a torchvision classification model; choose one of: {', '.join(choices)}"
        )
    if num_classes < 2:
        raise ProjectError(f"model.num_classes={num_classes} is not allowed: it must be an integer >= 2")
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)

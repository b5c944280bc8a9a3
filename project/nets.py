"""The networks: a torchvision classifier by name, or your own by dotted path, randomly initialised or from
pretrained weights (``--model.weights``: a torchvision weight name, or a state-dict file).

``--model.arch`` takes either
- a torchvision builder name (``mobilenet_v2``, ``resnet50``, ...; ``available_archs()`` lists them), or
- ``package.module.name``: any callable returning an ``nn.Module``, called as
  ``name(num_classes=..., in_channels=...)`` (both come from the data set).

Kept apart from the LightningModule so a network can be used, tested or swapped on its own.

``fsdp`` and ``pipeline`` split a network into blocks; :func:`network_blocks` says how (see its docstring).
"""

from __future__ import annotations

import difflib

import torchvision
from torch import nn
from torchvision.models import MobileNetV2, ResNet

from project.toolkit.blocks import default_blocks
from project.toolkit.dotted import import_object
from project.toolkit.errors import ProjectError
from project.toolkit.weights import load_weights


def available_archs() -> list[str]:
    """Names of torchvision's image-classification builders (``resnet50``, ``mobilenet_v2``, ...).

    >>> {"mobilenet_v2", "resnet50"} <= set(available_archs())
    True
    """
    return torchvision.models.list_models(module=torchvision.models)


def build_network(arch: str, num_classes: int, in_channels: int = 3, weights: str | None = None) -> nn.Module:
    """A classifier with ``num_classes`` outputs for ``in_channels``-channel images: randomly initialised, or from
    ``weights`` (a torchvision weight name or a state-dict file; a head of another size is left fresh: see
    :func:`project.toolkit.weights.load_weights`).

    >>> net = build_network("mobilenet_v2", num_classes=10)
    >>> net.classifier[-1].out_features
    10
    >>> build_network("resnet18", num_classes=10, in_channels=1).conv1.in_channels
    1
    """
    if num_classes < 2:
        raise ProjectError(f"model.num_classes={num_classes} is not allowed: it must be an integer >= 2")
    if in_channels < 1:
        raise ProjectError(f"model.in_channels={in_channels} is not allowed: it must be an integer >= 1")
    if "." in arch:
        net = _build_from_path(arch, num_classes, in_channels)
    elif arch not in (choices := available_archs()):
        near = difflib.get_close_matches(arch.lower(), choices, n=2)
        hint = f"; did you mean {' or '.join(near)}?" if near else ";"
        raise ProjectError(
            f"model.arch={arch!r} is neither a torchvision classification model nor package.module.name{hint} "
            f"torchvision's are: {', '.join(choices)}"
        )
    else:
        net = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
        net = net if in_channels == 3 else _with_input_channels(net, in_channels)
    if weights is not None:
        head = classifier_head(net)
        load_weights(net, weights, arch, head=head[0] if head else None)
    return net


def classifier_head(net: nn.Module) -> tuple[str, nn.Linear] | None:
    """The classifier's last layer, ``(name, layer)``, which ``--model.weights`` replaces where its size differs and
    ``--model.freeze_backbone`` trains alone: the last ``nn.Linear`` in the module tree (ResNet's ``fc``, MobileNetV2's
    ``classifier[-1]``); None where there is none. Another network: add a branch here."""
    return next(((n, m) for n, m in reversed(list(net.named_modules())) if isinstance(m, nn.Linear)), None)


def _build_from_path(path: str, num_classes: int, in_channels: int) -> nn.Module:
    """Call the network factory ``package.module.name`` with the data set's class and channel counts."""
    try:
        factory = import_object(path)
    except ProjectError as err:  # said as the option the path came from
        raise ProjectError(f"model.arch={err}; is its package on PYTHONPATH?") from None
    net = factory(num_classes=num_classes, in_channels=in_channels)
    if not isinstance(net, nn.Module):
        raise ProjectError(f"model.arch={path!r} returned {type(net).__name__}, not an nn.Module")
    return net


def _with_input_channels(net: nn.Module, in_channels: int) -> nn.Module:
    """``net`` with its first convolution rebuilt for ``in_channels`` input channels (torchvision's
    networks take 3); everything else, its initialisation included, as built."""
    for parent in net.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                conv = nn.Conv2d(
                    in_channels,
                    child.out_channels,
                    child.kernel_size,
                    child.stride,
                    child.padding,
                    child.dilation,
                    child.groups if child.groups == 1 else in_channels,
                    bias=child.bias is not None,
                )
                setattr(parent, name, conv)
                return net
    raise ProjectError(f"{type(net).__name__} has no convolution to take {in_channels}-channel images")


def network_blocks(net: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The blocks ``fsdp`` shards at (one unit each) and ``pipeline`` balances over its stages: an ordered list
    of ``(name, module)``, each module made of the network's own submodules, which applied one after the other
    compute ``net``'s forward. Only those two strategies ask; single device, ddp and dp need nothing.

    To declare your network's: give its class a method ``network_blocks(self)`` returning that list, or add a
    branch here. An ``nn.Sequential`` needs nothing: it splits at its children. None (declared nowhere) makes
    fsdp and pipeline refuse the network in one line. (docs/strategies.md, "What a network declares".)

    >>> [name for name, _ in network_blocks(torchvision.models.resnet18(num_classes=10))][:3]
    ['stem', 'layer1.0', 'layer1.1']
    >>> [name for name, _ in network_blocks(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()))]
    ['0', '1']
    """
    if isinstance(net, ResNet):
        stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
        layers = [
            (f"{layer}.{i}", block)
            for layer in ("layer1", "layer2", "layer3", "layer4")
            for i, block in enumerate(getattr(net, layer))
        ]
        return [("stem", stem), *layers, ("fc", nn.Sequential(net.avgpool, nn.Flatten(1), net.fc))]
    if isinstance(net, MobileNetV2):  # its forward pools and flattens between features and classifier
        head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), net.classifier)
        return [*((f"features.{i}", block) for i, block in enumerate(net.features)), ("classifier", head)]
    return default_blocks(net)

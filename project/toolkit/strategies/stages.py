"""Splitting a network into pipeline stages: its blocks in order (:func:`network_blocks`), each block's
cost (:func:`block_costs`), a split balanced by cost or named by the user (:func:`plan_split`), and one
rank's share of the network (:func:`build_stage`, :func:`release_other_stages`).

A block is a run of the network's own submodules, named as in its ``state_dict``: ResNets split into
``stem`` (conv1, bn1, relu, maxpool), ``layer1.0`` ... ``layer4.2`` (the Bottleneck or BasicBlock
blocks) and ``fc`` (average pool, flatten and the fully connected layer); MobileNetV2 into
``features.0`` ... ``features.18`` (the InvertedResidual blocks between the first and the last
convolution) and ``classifier`` (average pool, flatten, dropout and the linear layer). A stage is a run of
consecutive blocks; the blocks hold the network's own modules, so a stage trains the network's
parameters and a checkpoint keeps the network's key names.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torchvision.models import MobileNetV2, ResNet

from project.toolkit.errors import ProjectError


@dataclass(frozen=True)
class Block:
    """One unit of a split: its name, the paths of the network's submodules it runs (in order) and
    whether the output is flattened after its first submodule (the pooling before a classifier)."""

    name: str
    paths: tuple[str, ...]
    flatten_after_first: bool = False


def network_blocks(net: nn.Module, arch: str = "") -> list[Block]:
    """The blocks of a torchvision ResNet or MobileNetV2, in the order the network runs them.

    >>> from torchvision.models import resnet18
    >>> [b.name for b in network_blocks(resnet18(num_classes=10))][:3]
    ['stem', 'layer1.0', 'layer1.1']
    """
    if isinstance(net, ResNet):
        layers = [f"layer{i}.{j}" for i in range(1, 5) for j in range(len(getattr(net, f"layer{i}")))]
        return [
            Block("stem", ("conv1", "bn1", "relu", "maxpool")),
            *(Block(name, (name,)) for name in layers),
            Block("fc", ("avgpool", "fc"), flatten_after_first=True),
        ]
    if isinstance(net, MobileNetV2):
        features = [Block(f"features.{i}", (f"features.{i}",)) for i in range(len(net.features))]
        return [*features, Block("classifier", ("__pool__", "classifier"), flatten_after_first=True)]
    raise ProjectError(
        f"--trainer.strategy=pipeline splits ResNets and MobileNetV2 into stages; model.arch={arch or '?'} "
        f"({type(net).__name__}) is neither; use resnet50, mobilenet_v2 (or another ResNet), or ddp"
    )


def _module_at(net: nn.Module, path: str) -> nn.Module:
    """The submodule at ``path``; ``__pool__`` is the average pooling MobileNetV2 does in its forward."""
    return nn.AdaptiveAvgPool2d(1) if path == "__pool__" else net.get_submodule(path)


def block_module(net: nn.Module, block: Block) -> nn.Sequential:
    """The block as a module of its own that holds the network's submodules (not copies)."""
    modules = [_module_at(net, path) for path in block.paths]
    if block.flatten_after_first:
        modules.insert(1, nn.Flatten(1))
    return nn.Sequential(*modules)


def block_costs(net: nn.Module, blocks: list[Block], image_size: int | None) -> list[float]:
    """Each block's forward FLOPs for one image of ``image_size`` px (counted on a copy of the network
    on the ``meta`` device: no memory, no data); without an image size, each block's parameter count.
    A block's backward costs about twice its forward for every block alike, so the forward decides the
    balance."""
    if not image_size:
        return [float(sum(p.numel() for p in block_module(net, b).parameters())) or 1.0 for b in blocks]
    memo = {id(t): torch.empty_like(t, device="meta") for t in [*net.parameters(), *net.buffers()]}
    memo.update({id(p): nn.Parameter(memo[id(p)]) for p in net.parameters()})
    meta_net = copy.deepcopy(net, memo).eval()  # one image: BatchNorm in training mode would refuse a 1x1 map
    x = torch.empty(1, 3, image_size, image_size, device="meta")
    costs = []
    with torch.no_grad():
        for block in blocks:
            with FlopCounterMode(display=False) as counter:
                x = block_module(meta_net, block)(x)
            costs.append(float(counter.get_total_flops()) or 1.0)  # a block of no FLOPs (a ReLU) still counts
    return costs


def balanced_starts(costs: list[float], num_stages: int) -> list[int]:
    """The index of the first block of each stage after the first, for consecutive stages whose largest
    total cost is the smallest possible (dynamic programming over the split points).

    >>> balanced_starts([1, 1, 1, 1], 2), balanced_starts([3, 1, 1, 1], 2), balanced_starts([1, 2, 3, 4, 5], 3)
    ([2], [1], [3, 4])
    """
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[s][i]: the smallest largest-stage cost of the first i blocks in s stages; cut[s][i]: its last start
    best = [[float("inf")] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    starts, i = [], n
    for s in range(num_stages, 1, -1):
        i = cut[s][i]
        starts.append(i)
    return starts[::-1]


def named_starts(blocks: list[Block], split: str, num_stages: int) -> list[int]:
    """The stage starts the user named: ``split`` lists, comma-separated, the block each stage after the
    first starts at; a layer name (``layer3``) means its first block (``layer3.0``).

    >>> blocks = [Block(n, (n,)) for n in ("stem", "layer1.0", "layer2.0", "layer3.0", "fc")]
    >>> named_starts(blocks, "layer3", 2)
    [3]
    """
    names = [name.strip() for name in split.split(",") if name.strip()]
    allowed = [b.name for b in blocks]
    if len(names) != num_stages - 1:
        raise ProjectError(
            f"trainer.strategy.split={split!r} names {len(names)} block(s), but {num_stages} stages (devices) need "
            f"{num_stages - 1}: the block each stage after the first starts at"
        )
    starts = []
    for name in names:
        index = next((i for i, b in enumerate(blocks) if b.name == name or b.name.startswith(name + ".")), None)
        if index is None or index == 0:
            raise ProjectError(
                f"trainer.strategy.split={split!r}: {name!r} is not a block a later stage can start at; "
                f"choose from: {', '.join(allowed[1:])} (or a layer name such as layer3)"
            )
        starts.append(index)
    if starts != sorted(set(starts)):
        raise ProjectError(f"trainer.strategy.split={split!r}: the blocks must be named in the network's order, once")
    return starts


def plan_split(blocks: list[Block], costs: list[float], num_stages: int, split: str | None) -> list[list[Block]]:
    """The blocks of each stage: at the named starts, or balanced by cost when ``split`` is None."""
    if num_stages > len(blocks):
        raise ProjectError(f"{num_stages} pipeline stages need at least as many blocks; this network has {len(blocks)}")
    starts = named_starts(blocks, split, num_stages) if split else balanced_starts(costs, num_stages)
    bounds = [0, *starts, len(blocks)]
    return [blocks[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


class StageModule(nn.Module):
    """One stage: its blocks run in order. The input is first put in the form the network takes
    (``prepare``: the module's ``prepare_images``, channels_last by default). What crosses between stages
    -- the output, and the gradient sent back for the input -- is made contiguous: the receiving side
    allocates its buffer in that layout, and point-to-point messages need it."""

    def __init__(self, blocks: nn.Sequential, prepare: Callable[[torch.Tensor], torch.Tensor], is_last: bool) -> None:
        super().__init__()
        self.blocks, self.prepare, self.is_last = blocks, prepare, is_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad:
            x.register_hook(lambda grad: grad.contiguous())
        x = self.blocks(self.prepare(x))
        return x if self.is_last else x.contiguous()


def build_stage(
    net: nn.Module, stage_blocks: list[Block], prepare: Callable[[torch.Tensor], torch.Tensor], is_last: bool
) -> StageModule:
    """This rank's stage, made of the network's own submodules."""
    return StageModule(nn.Sequential(*(block_module(net, b) for b in stage_blocks)), prepare, is_last)


def release_other_stages(net: nn.Module, blocks: list[Block], own: list[Block]) -> None:
    """Replace every submodule of the other stages' blocks with an ``nn.Identity`` in ``net``, so this rank
    holds only its own stage's parameters and buffers, and ``net.state_dict()`` lists exactly those, under
    the full network's key names."""
    own_paths = {path for block in own for path in block.paths}
    for block in blocks:
        for path in block.paths:
            if path in own_paths or path == "__pool__":
                continue
            parent_path, _, name = path.rpartition(".")
            setattr(net.get_submodule(parent_path) if parent_path else net, name, nn.Identity())

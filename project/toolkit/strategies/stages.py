"""Splitting a network into pipeline stages of consecutive blocks: each block's cost, a split balanced by cost or
named by the user, and one rank's share of the network (its own modules: a checkpoint keeps its key names)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from project.toolkit.blocks import Block
from project.toolkit.errors import ProjectError
from project.toolkit.strategies.balance import balanced_starts
from project.toolkit.timing.flops import forward_flops_by_module

Prepare = Callable[[torch.Tensor], torch.Tensor]  # what puts a stage's input in the network's form


def block_costs(blocks: list[Block], image_size: int | None, in_channels: int = 3) -> list[float]:
    """Each block's forward FLOPs for one image, counted on a ``meta`` copy; without an image size, its parameters."""
    if not image_size:
        return [float(b.parameter_count) or 1.0 for b in blocks]
    chain = nn.Sequential(*(b.module for b in blocks))
    flops = forward_flops_by_module(chain, image_size, channels_last=False, in_channels=in_channels)
    return [float(flops.get(str(i), 0)) or 1.0 for i in range(len(blocks))]  # a block of no FLOPs (a ReLU) counts


def named_starts(blocks: list[Block], split: str, num_stages: int) -> list[int]:
    """The block index each stage after the first starts at, as ``split`` names them (``layer3``: ``layer3.0``)."""
    names = [name.strip() for name in split.split(",") if name.strip()]
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
                f"choose from: {', '.join(b.name for b in blocks[1:])} (or a name's part before its dot)"
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
    """One stage: its blocks in order, on the input put in the network's form (``prepare``). What crosses between
    stages (output, and the input's gradient) is made contiguous, as point-to-point messages need."""

    def __init__(self, blocks: nn.Sequential, prepare: Prepare, is_last: bool) -> None:
        super().__init__()
        self.blocks, self.prepare, self.is_last = blocks, prepare, is_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad:
            x.register_hook(lambda grad: grad.contiguous())
        x = self.blocks(self.prepare(x))
        return x if self.is_last else x.contiguous()


def build_stage(stage_blocks: list[Block], prepare: Prepare, is_last: bool) -> StageModule:
    """This rank's stage, made of the network's own submodules (its blocks' modules)."""
    return StageModule(nn.Sequential(*(b.module for b in stage_blocks)), prepare, is_last)


def release_other_stages(net: nn.Module, blocks: list[Block], own: list[Block]) -> None:
    """Replace the other stages' submodules in ``net`` with ``nn.Identity``: its state_dict keeps only this stage's."""
    own_paths = {path for block in own for path in block.paths}
    for path in (path for block in blocks for path in block.paths if path and path not in own_paths):
        parent_path, _, name = path.rpartition(".")
        setattr(net.get_submodule(parent_path) if parent_path else net, name, nn.Identity())

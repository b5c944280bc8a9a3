"""What the template's own strategies need of a LightningModule: the attributes of :class:`ParallelizableModule`
(:data:`REQUIRED` says which strategy needs which), checked in one ``error:`` line when a strategy sets the module
up. No strategy writes on the module (:mod:`.view`); :class:`project.model.ImageClassifier` has them all."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from project.toolkit.errors import ProjectError

EVERY = ("net", "criterion", "prepare_images", "training_loss")  # what dp_balanced and pipeline need
REQUIRED: dict[str, tuple[str, ...]] = {"dp": ("net",), "dp_balanced": EVERY, "fsdp": ("net",), "pipeline": EVERY}


@runtime_checkable
class ParallelizableModule(Protocol):
    """A LightningModule that ``dp``, ``dp_balanced``, ``fsdp`` and ``pipeline`` can run. Optional too:
    ``network_blocks() -> [(name, module), ...]``, the blocks ``fsdp`` and ``pipeline`` split ``net`` at."""

    net: nn.Module  # the network: dp wraps it, fsdp shards it, pipeline splits it into stages of blocks
    criterion: nn.Module  # mean loss(logits, labels): dp_balanced runs it in each replica, pipeline on its last stage

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor: ...  # what forward does before net

    # (mean loss, predicted classes); dp_balanced, pipeline replace it (pipeline also forward: net(prepare_images))
    def training_loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def check_module(module: object, strategy_name: str) -> None:
    """Refuse, in one line, a module that lacks what ``strategy_name`` needs of it."""
    needed = REQUIRED[strategy_name]
    missing = [name for name in needed if not hasattr(module, name)]
    if not missing and isinstance(module.net, nn.Module):
        return
    what = {"net": "its network in `net` (an nn.Module)", "criterion": "its loss in `criterion`"}
    what |= {"prepare_images": "`prepare_images(images)`", "training_loss": "`training_loss(images, labels)`"}
    lacking = " and ".join(f"`{name}`" for name in missing) or "`net` that is an nn.Module"
    raise ProjectError(
        f"--trainer.strategy={strategy_name} needs a LightningModule with {', '.join(what[n] for n in needed)}; "
        f"{type(module).__name__} has no {lacking} (see project/toolkit/strategies/contract.py); "
        "or use ddp, which works with any LightningModule"
    )

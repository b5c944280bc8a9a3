"""What the template's own strategies need of a LightningModule: one small contract, checked when a
strategy sets the module up, so a module that lacks it fails with one ``error:`` line instead of an
AttributeError deep inside a run.

Lightning's strategies (single device, ddp, xla, deepspeed) work with any LightningModule. The ones
this template adds reach into the module, through these attributes only:

====================  =============================================================================
``net``               the network, an ``nn.Module``: ``dp`` wraps it in ``nn.DataParallel``, ``fsdp``
                      shards it block by block, ``pipeline`` splits it into stages of blocks
``network_blocks``    optional, ``() -> [(name, module), ...]``: the blocks ``fsdp`` and ``pipeline``
                      split ``net`` at (:mod:`project.toolkit.strategies.blocks`); without it, the
                      network's own ``network_blocks()``, or an ``nn.Sequential``'s children
``criterion``         the loss, an ``nn.Module`` called as ``criterion(logits, labels)``, a mean:
                      ``dp_balanced`` computes it inside each replica, ``pipeline`` on its last stage
                      per micro-batch
``prepare_images``    ``images -> images``, what ``forward`` does before calling ``net`` (the memory
                      format): ``dp_balanced`` and ``pipeline`` call it before their own calls of ``net``
``training_loss``     ``(images, labels) -> (mean loss, predicted classes)``, used by the module's
                      ``training_step``: ``dp_balanced`` and ``pipeline`` replace it (``pipeline`` also
                      ``forward``, which must be ``net(prepare_images(images))``, for evaluation)
====================  =============================================================================

No strategy writes on the module: ``dp``, ``dp_balanced`` and ``pipeline`` run its steps through a view
of it that holds their replacements (:mod:`project.toolkit.strategies.view`).

:class:`project.model.ImageClassifier` has all of them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from project.toolkit.errors import ProjectError

# What each strategy reaches for.
REQUIRED: dict[str, tuple[str, ...]] = {
    "dp": ("net",),
    "dp_balanced": ("net", "criterion", "prepare_images", "training_loss"),
    "fsdp": ("net",),
    "pipeline": ("net", "criterion", "prepare_images", "training_loss"),
}


@runtime_checkable
class ParallelizableModule(Protocol):
    """A LightningModule that ``dp``, ``dp_balanced``, ``fsdp`` and ``pipeline`` can run (see the module's table)."""

    net: nn.Module
    criterion: nn.Module

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor: ...

    def training_loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def check_module(module: object, strategy_name: str) -> None:
    """Refuse, in one line, a module that lacks what ``strategy_name`` needs of it.

    >>> class Bare(nn.Module): ...
    >>> check_module(Bare(), "fsdp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    project.toolkit.errors.ProjectError: --trainer.strategy=fsdp needs a LightningModule with its network in `net` ...
    """
    needed = REQUIRED[strategy_name]
    missing = [name for name in needed if not hasattr(module, name)]
    if not missing and isinstance(module.net, nn.Module):
        return
    what = {
        "net": "its network in `net` (an nn.Module)",
        "criterion": "its loss in `criterion`",
        "prepare_images": "`prepare_images(images)`",
        "training_loss": "`training_loss(images, labels)`",
    }
    lacking = " and ".join(f"`{name}`" for name in missing) or "`net` that is an nn.Module"
    raise ProjectError(
        f"--trainer.strategy={strategy_name} needs a LightningModule with {', '.join(what[n] for n in needed)}; "
        f"{type(module).__name__} has no {lacking} (see project/toolkit/strategies/contract.py); "
        "or use ddp, which works with any LightningModule"
    )

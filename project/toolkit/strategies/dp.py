"""``dp`` and ``dp_balanced`` (the loss inside each replica): DataParallel for Lightning 2, which no longer ships it.
One process drives every GPU; only the network is wrapped, in a view of the module, so ``self.log`` and the
metrics run once in the main thread (wrapping the whole module would race them in the replica threads)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import nn

from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger
from project.toolkit.strategies.contract import StepsThroughView, check_module, module_view

log = get_logger(__name__)


class DataParallelStrategy(StepsThroughView, SingleDeviceStrategy):
    """``module.net`` under ``nn.DataParallel`` across the run's GPUs, registered as ``dp`` and ``dp_balanced``.

    Args:
        loss_in_replicas: Compute the loss inside each replica (``dp_balanced``), not on the root device (``dp``).
    """

    strategy_name = "dp"

    def __init__(self, loss_in_replicas: bool = False) -> None:
        super().__init__()
        self.loss_in_replicas = loss_in_replicas
        self.strategy_name = "dp_balanced" if loss_in_replicas else "dp"  # the run's name for it, in logs
        self.parallel_devices: list[torch.device] = []  # filled in by the Trainer, as for DDP

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[0] if self.parallel_devices else torch.device("cpu")

    @property
    def num_gpus(self) -> int:
        return sum(device.type == "cuda" for device in self.parallel_devices)

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)  # the module on the root device, the optimizers built
        if self.num_gpus < 2:
            why = "DataParallel needs 2 or more to split a batch, so this runs as a single-device run on"
            log.warning("%s: %d GPU(s) in this run; %s %s", self.strategy_name, self.num_gpus, why, self.root_device)
        module = self.lightning_module
        check_module(module, self.strategy_name)
        check_not_compiled(module.net, self.strategy_name)
        # The steps run through a view whose `net` is wrapped; the module keeps its own network, so its
        # checkpoints have the keys of every other strategy (net.features..., not net.module.features...).
        if self.loss_in_replicas:
            wrapped = data_parallel(NetWithLoss(module.net, module.criterion), self.parallel_devices)
            loss = functools.partial(_loss_in_replicas, wrapped, module.prepare_images)
            self.module_view = module_view(module, net=wrapped, training_loss=loss)
        else:
            self.module_view = module_view(module, net=data_parallel(module.net, self.parallel_devices))

    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        check_batch_splits_evenly(extract_batch_size(args[0]), self.num_gpus)
        return super().training_step(*args, **kwargs)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        plain = "DataParallel: one process, loss on the root GPU"
        strategy_registry.register("dp", cls, description=plain, override=True)
        balanced = "DataParallel with the loss computed inside each replica"
        strategy_registry.register("dp_balanced", cls, description=balanced, override=True, loss_in_replicas=True)


class NetWithLoss(nn.Module):
    """The network and the loss as one module: called with labels, it returns the summed loss (shape ``(1,)``) and
    the predicted classes, so DataParallel gathers one number and one class per image. Sums add up exactly."""

    def __init__(self, net: nn.Module, criterion: nn.Module) -> None:
        super().__init__()
        self.net, self.criterion = net, criterion

    def forward(
        self, images: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(images)
        if labels is None:  # evaluation: the logits, as the bare network gives them
            return logits
        loss_sum = self.criterion(logits, labels) * len(labels)
        return loss_sum.reshape(1), logits.argmax(dim=1)


def _loss_in_replicas(
    wrapped: nn.Module, prepare_images: Callable, images: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dp_balanced``'s ``training_loss``: each replica of ``wrapped`` returned the loss sum of its share."""
    loss_sums, predictions = wrapped(prepare_images(images), labels)
    return loss_sums.sum() / len(labels), predictions


def data_parallel(module: nn.Module, devices: list[torch.device]) -> nn.DataParallel:
    """``nn.DataParallel`` over the GPUs in ``devices``, the first the root. Off CUDA a pass-through built as
    DataParallel builds it without GPUs (given no devices on a machine with GPUs, it would fail)."""
    gpus = [device for device in devices if device.type == "cuda"]
    if gpus:
        return nn.DataParallel(module, device_ids=gpus, output_device=gpus[0])
    wrapper = nn.DataParallel.__new__(nn.DataParallel)
    nn.Module.__init__(wrapper)
    wrapper.module, wrapper.device_ids = module, []
    return wrapper


def check_not_compiled(net: nn.Module, strategy_name: str) -> None:
    """Refuse a network compiled in place: DataParallel's per-step copies would call the original's compiled code."""
    if getattr(net, "_compiled_call_impl", None) is not None:  # set by nn.Module.compile()
        raise ProjectError(
            f"--model.compile=true does not work with --trainer.strategy={strategy_name}: DataParallel copies "
            "the network onto every GPU at each step, and the copies would call the original's compiled code; use ddp"
        )


def check_batch_splits_evenly(batch_size: int, num_gpus: int) -> None:
    """Refuse a batch that does not split evenly across the GPUs: every replica does the same work."""
    if num_gpus > 1 and batch_size % num_gpus:
        raise ProjectError(
            f"data.batch_size={batch_size} does not split evenly across the {num_gpus} GPUs of dp; "
            f"use a multiple of {num_gpus}"
        )

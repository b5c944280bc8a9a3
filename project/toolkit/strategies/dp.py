"""``dp`` and ``dp_balanced``: DataParallel for Lightning 2, which no longer ships it.

One process drives every GPU of the machine, in the classic flow of ``nn.DataParallel``: the
LightningModule's step runs once, on the root device (the first GPU), and only the network,
``self.net``, is wrapped -- in a view of the module (:mod:`project.toolkit.strategies.view`) that the
strategy runs the steps through, so the module itself keeps its own network. Calling the wrapped
network scatters the batch across the GPUs, replicates the network onto each, runs the forward
passes in parallel threads and gathers the outputs on the root device, where the loss is computed;
backward reduces the gradients onto the root copy and one optimizer step updates it.
Metrics and ``self.log`` run once, in the main thread, as on a single device.

``dp_balanced`` wraps the network together with the loss (:class:`NetWithLoss`): each
replica computes the loss of its share, and only those losses (and predicted classes) are gathered,
so the root device no longer holds every replica's outputs.

Wrapping the whole LightningModule instead (what Lightning 1.x did) would run ``self.log`` and the
metric updates in several replica threads at once, where they race.
"""

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
from project.toolkit.strategies.contract import check_module
from project.toolkit.strategies.view import StepsThroughView, module_view

log = get_logger(__name__)


class DataParallelStrategy(StepsThroughView, SingleDeviceStrategy):
    """Lightning strategy that runs ``module.net`` under ``nn.DataParallel`` across the run's GPUs.

    Registered as ``dp`` and, with ``loss_in_replicas=True``, as ``dp_balanced``. It needs a
    LightningModule with the contract of :mod:`project.toolkit.strategies.contract` (the network in ``net``,
    and for ``loss_in_replicas`` the loss in ``criterion`` ...), as :class:`project.model.ImageClassifier` has.

    Args:
        loss_in_replicas: Compute the loss inside each replica (``dp_balanced``) instead of on the root
            device after gathering the outputs (``dp``).
    """

    strategy_name = "dp"

    def __init__(self, loss_in_replicas: bool = False) -> None:
        super().__init__()
        self.loss_in_replicas = loss_in_replicas
        self.strategy_name = "dp_balanced" if loss_in_replicas else "dp"  # the run's name for it, in logs
        # Filled in by the Trainer from --trainer.accelerator/--trainer.devices, as for DDP.
        self.parallel_devices: list[torch.device] = []

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[0] if self.parallel_devices else torch.device("cpu")

    @property
    def num_gpus(self) -> int:
        return sum(device.type == "cuda" for device in self.parallel_devices)

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)  # the module on the root device, the optimizers built
        if self.num_gpus < 2:
            log.warning(
                "%s: %d GPU(s) in this run; DataParallel needs 2 or more to split a batch, so this runs as a "
                "single-device run on %s",
                self.strategy_name,
                self.num_gpus,
                self.root_device,
            )
        module = self.lightning_module
        check_module(module, self.strategy_name)
        check_not_compiled(module.net, self.strategy_name)
        # The steps run through a view of the module whose `net` is the wrapped network (and whose
        # training_loss, for dp_balanced, takes the replicas' losses); the module keeps its own network, so
        # its checkpoints have the keys of every other strategy (net.features..., not net.module.features...).
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
        strategy_registry.register(
            "dp", cls, description="DataParallel: one process, loss on the root GPU", override=True
        )
        strategy_registry.register(
            "dp_balanced",
            cls,
            description="DataParallel with the loss computed inside each replica",
            override=True,
            loss_in_replicas=True,
        )


class NetWithLoss(nn.Module):
    """The network and the loss as one module. Called with labels, it returns the summed loss of its
    images (shape ``(1,)``) and their predicted classes instead of the logits.

    Wrapped in DataParallel (``dp_balanced``), every replica so computes the loss of its own share of
    the batch, and only one number and one class index per image are gathered on the root device,
    rather than every logit. Sums, not means, so replicas of unequal size add up exactly.

    >>> net_with_loss = NetWithLoss(nn.Linear(4, 3), nn.CrossEntropyLoss())
    >>> loss_sum, predictions = net_with_loss(torch.zeros(2, 4), torch.tensor([0, 1]))
    >>> loss_sum.shape, predictions.shape, net_with_loss(torch.zeros(2, 4)).shape
    (torch.Size([1]), torch.Size([2]), torch.Size([2, 3]))
    """

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
    wrapped: nn.Module,
    prepare_images: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dp_balanced``'s ``training_loss``: each replica of ``wrapped`` returned the loss sum of its share."""
    loss_sums, predictions = wrapped(prepare_images(images), labels)
    return loss_sums.sum() / len(labels), predictions


def data_parallel(module: nn.Module, devices: list[torch.device]) -> nn.DataParallel:
    """``nn.DataParallel`` over the GPUs in ``devices``, the first one the root.

    Off CUDA it is a plain pass-through, which is what DataParallel itself does on a machine without
    GPUs; given an empty device list on a machine WITH GPUs, DataParallel would instead fail, so that
    case is built here the same way its constructor builds the GPU-less one.

    >>> wrapped = data_parallel(nn.Linear(2, 2), [torch.device("cpu")])
    >>> isinstance(wrapped, nn.DataParallel), wrapped.device_ids
    (True, [])
    """
    gpus = [device for device in devices if device.type == "cuda"]
    if gpus:
        return nn.DataParallel(module, device_ids=gpus, output_device=gpus[0])
    wrapper = nn.DataParallel.__new__(nn.DataParallel)
    nn.Module.__init__(wrapper)
    wrapper.module, wrapper.device_ids = module, []
    return wrapper


def check_not_compiled(net: nn.Module, strategy_name: str) -> None:
    """Refuse a network compiled in place (``--model.compile=true``): DataParallel copies it onto every
    GPU at each step, and the copies would call the original's compiled code."""
    if getattr(net, "_compiled_call_impl", None) is not None:  # set by nn.Module.compile()
        raise ProjectError(
            f"--model.compile=true does not work with --trainer.strategy={strategy_name}: DataParallel copies "
            "the network onto every GPU at each step, and the copies would call the original's compiled code; use ddp"
        )


def check_batch_splits_evenly(batch_size: int, num_gpus: int) -> None:
    """DataParallel splits each batch across the GPUs; refuse a batch that does not split evenly, so
    every replica does the same work (and BatchNorm sees the same number of images on each).

    >>> check_batch_splits_evenly(256, 4)
    >>> check_batch_splits_evenly(30, 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    project.toolkit.errors.ProjectError: data.batch_size=30 does not split evenly across the 4 GPUs ... multiple of 4
    """
    if num_gpus > 1 and batch_size % num_gpus:
        raise ProjectError(
            f"data.batch_size={batch_size} does not split evenly across the {num_gpus} GPUs of dp; "
            f"use a multiple of {num_gpus}"
        )

"""Generic LightningModule pieces: a warmed-up cosine schedule, a per-sample mean and a confusion matrix that never
sync, the steps the loggers write at, fused optimizers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassConfusionMatrix

from project.toolkit.interfaces import data_settings, image_data
from project.toolkit.log import get_logger

log = get_logger(__name__)


class WarmupCosine:
    """``LambdaLR`` factor per step: linear warm-up to 1 over ``warmup_steps``, cosine down to 0 at ``total_steps``."""

    def __init__(self, warmup_steps: int, total_steps: int) -> None:
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


class SampleMean(MeanMetric):
    """The mean of per-sample values over every batch and rank. Unlike MeanMetric (whose NaN check syncs each update;
    ``nan_strategy="disable"`` drops the weights) it never reads its input on the host; a NaN shows in the mean."""

    def update(self, values: torch.Tensor) -> None:  # type: ignore[override]
        self.mean_value.add_(values.detach().sum(dtype=self.mean_value.dtype))  # in place: no Module.__setattr__
        self.weight.add_(values.numel())  # a Python number: no host-to-device copy

    def reset(self) -> None:
        with torch.inference_mode(False):  # ordinary tensors: the next updates may come outside inference mode
            super().reset()


class ConfusionMatrix(MulticlassConfusionMatrix):
    """torchmetrics' confusion matrix (row: true class) without torch.bincount, which on a GPU waits for the device."""

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        self.confmat.view(-1).index_add_(0, target * self.num_classes + preds, torch.ones_like(target))


def logging_step(step: int, trainer: Any) -> bool:
    """Whether the loggers write at training step ``step`` (counted from 1): every ``log_every_n_steps`` steps, every
    step of a ``fast_dev_run``. The host reads a device value only then, when the loggers wait for the device anyway."""
    every = trainer.log_every_n_steps
    return bool(trainer.fast_dev_run) or bool(every and step % every == 0)


def log_step_values(module: LightningModule, outputs: Any) -> None:
    """The step's loss straight to the loggers, where they write (:func:`logging_step`), after the step: a value given
    to ``self.log`` would be gathered again by Lightning at every later step of the epoch. (The learning rate of every
    param group: Lightning's LearningRateMonitor, which the trainer commands add where a logger is.)"""
    if not (module.loggers and logging_step(module.global_step, module.trainer)):
        return
    loss = outputs["loss"] if isinstance(outputs, dict) else outputs
    values = {"train/loss_step": float(loss), "epoch": module.current_epoch}
    for logger in module.loggers:  # at the step Lightning's own logging names: the batches stepped before this one
        logger.log_metrics(values, step=module.global_step - 1)


def lr_for_batch(lr: float, default_lr: float, trainer: Any) -> float:
    """``lr``; where it is ``default_lr`` and the data module lowered its default batch (a small data set), scaled with
    the batch (the linear scaling rule), said in one line."""
    data = image_data(trainer)
    lowered_from = data.batch_lowered_from if data is not None else None
    if not lowered_from or lr != default_lr:
        return lr
    batch = data_settings(trainer)["batch_size"]
    scaled = lr * batch / lowered_from
    log.warning(
        "model.lr=%g (the default, for data.batch_size=%d) is scaled to %.3g for the lowered batch of %d; "
        "--model.lr=X sets another",
        lr,
        lowered_from,
        scaled,
        batch,
    )
    return scaled


def fusable(parameters: Iterable[Any]) -> bool:
    """Whether an optimizer can run fused kernels on ``parameters``: plain tensors (no DTensor), all on one CUDA GPU."""
    parameters = list(parameters)
    devices = {p.device for p in parameters}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return False
    from torch.distributed.tensor import DTensor  # CUDA builds have torch.distributed

    return not any(isinstance(p, DTensor) for p in parameters)

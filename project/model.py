"""The LightningModule: image classification with a torchvision network, SGD with a warmed-up
cosine schedule and cross-entropy, as in the material the template is built from."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from project.errors import ProjectError
from project.nets import build_network


class WarmupCosine:
    """Learning-rate factor per optimizer step: a linear warm-up to 1 over ``warmup_steps``, then
    cosine annealing to 0 at ``total_steps`` (for ``torch.optim.lr_scheduler.LambdaLR``).

    >>> factor = WarmupCosine(warmup_steps=10, total_steps=110)
    >>> [round(factor(step), 3) for step in (0, 9, 10, 60, 110)]
    [0.1, 1.0, 1.0, 0.5, 0.0]
    """

    def __init__(self, warmup_steps: int, total_steps: int) -> None:
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


class ImageClassifier(LightningModule):
    """Trains ``arch`` (any torchvision classification model) on ``num_classes`` classes.

    Args:
        arch: torchvision builder name, e.g. ``mobilenet_v2`` or ``resnet50``.
        num_classes: Number of output classes; the CLI links it from the data module.
        lr: Peak learning rate of SGD, reached after the warm-up (0.1 suits global batch 256).
        momentum: SGD momentum.
        nesterov: Use Nesterov momentum.
        weight_decay: L2 penalty applied by SGD.
        label_smoothing: Cross-entropy label smoothing, 0 for plain cross-entropy.
        warmup_epochs: Length of the linear learning-rate warm-up, in (possibly fractional) epochs;
            the cosine annealing then runs over the rest of the run, stepped every iteration.
        channels_last: Keep activations in NHWC memory order, which convolutions run faster in.
    """

    def __init__(
        self,
        arch: str = "mobilenet_v2",
        num_classes: int = 10,
        lr: float = 0.1,
        momentum: float = 0.9,
        nesterov: bool = True,
        weight_decay: float = 5e-4,
        label_smoothing: float = 0.0,
        warmup_epochs: float = 1.0,
        channels_last: bool = True,
    ) -> None:
        super().__init__()
        _check_optimizer_options(lr, momentum, nesterov, weight_decay, label_smoothing, warmup_epochs)
        self.save_hyperparameters()
        self.net = build_network(arch, num_classes)
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        # Sample-weighted means, reduced across ranks by torchmetrics: exact whatever the shard sizes.
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.hparams.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = self.criterion(logits, labels)
        self.train_acc.update(logits, labels)  # computed once per epoch, not every step
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        self.log("train/lr", self.lr_schedulers().get_last_lr()[0], on_step=True, on_epoch=False)
        return loss

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> None:
        images, labels = batch
        logits = self(images)
        loss_metric, acc_metric = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        loss_metric.update(self.criterion(logits, labels), weight=len(labels))
        acc_metric.update(logits, labels)
        self.log(f"{stage}/loss", loss_metric, prog_bar=stage == "val")
        self.log(f"{stage}/acc", acc_metric, prog_bar=stage == "val")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The predicted class index of every image in the batch."""
        return self(batch[0]).argmax(dim=1)

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        optimizer = torch.optim.SGD(
            self.parameters(), lr=hp.lr, momentum=hp.momentum, nesterov=hp.nesterov, weight_decay=hp.weight_decay
        )
        total_steps = int(self.trainer.estimated_stepping_batches)
        steps_per_epoch = math.ceil(self.trainer.num_training_batches / self.trainer.accumulate_grad_batches)
        warmup_steps = min(total_steps, round(hp.warmup_epochs * steps_per_epoch))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup_steps, total_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def _check_optimizer_options(
    lr: float, momentum: float, nesterov: bool, weight_decay: float, label_smoothing: float, warmup_epochs: float
) -> None:
    """Refuse values SGD or the loss would reject later with a less helpful message."""
    rules = (
        ("lr", lr, lr > 0, "a number > 0"),
        ("momentum", momentum, 0 <= momentum < 1, "a number in [0, 1)"),
        ("weight_decay", weight_decay, weight_decay >= 0, "a number >= 0"),
        ("label_smoothing", label_smoothing, 0 <= label_smoothing < 1, "a number in [0, 1)"),
        ("warmup_epochs", warmup_epochs, warmup_epochs >= 0, "a number >= 0"),
    )
    for name, value, ok, allowed in rules:
        if not ok:
            raise ProjectError(f"model.{name}={value} is not allowed: it must be {allowed}")
    if nesterov and momentum == 0:
        raise ProjectError("model.nesterov=true needs model.momentum > 0; set a momentum or --model.nesterov=false")

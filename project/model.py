"""The LightningModule: image classification with any network (``--model.arch``, see
:mod:`project.nets`), SGD with a warmed-up cosine schedule and cross-entropy by default, as in the
material the template is built from; another optimizer or schedule is an option (``--model.optimizer``,
``--model.lr_scheduler``).

The module is the same under every strategy and names none of them: what the template's own
strategies need of it -- the network in ``net``, the loss in ``criterion``, ... -- is the
small contract of :mod:`project.toolkit.strategies.contract`, which they check and use.

The training and evaluation steps never read a device value on the host: on an accelerator such a read waits for every
queued kernel and leaves the device idle while the host prepares the next step. Values are read where they are shown or
written -- the loggers every ``log_every_n_steps`` steps, the epoch metrics once per epoch.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torch.nn import functional as F

from project.nets import build_network, classifier_head, network_blocks
from project.toolkit.errors import ProjectError
from project.toolkit.training import ConfusionMatrix, SampleMean, WarmupCosine, fusable, log_step_values, lr_for_batch

DEFAULT_LR = 0.1  # SGD's peak learning rate for the default global batch of 256
LR_TAG = {"name": "train/lr"}  # LearningRateMonitor logs the lr under it (train/lr/<group> for several groups)


class ImageClassifier(LightningModule):
    """Trains ``arch`` (a torchvision name or ``package.module.name``) on ``num_classes`` classes.

    Args:
        arch: A torchvision builder name (``mobilenet_v2``, ``resnet50``, ...) or ``package.module.name`` of a
            function returning an nn.Module, called with ``num_classes`` and ``in_channels`` (see project/nets.py).
        num_classes: Number of output classes; the CLI links it from the data module.
        in_channels: Channels of an input image (1 or 3); the CLI links it from the data module.
        weights: Pretrained weights, null: random initialisation. A torchvision weight name of ``arch`` (``DEFAULT``,
            ``IMAGENET1K_V1``, ...; downloaded once into torch.hub's cache) or, for any ``arch``, a state-dict file
            (``torch.save(net.state_dict(), path)``). A head of another size is replaced by a fresh one of
            ``num_classes``. Read to build the network only: with ``--ckpt_path`` the checkpoint's weights count.
        freeze_backbone: Train the classifier's last layer alone (see project/nets.py): every other parameter is
            frozen and every BatchNorm layer kept in eval mode, its running statistics unchanged. Not with pipeline.
        lr: Peak learning rate of SGD, reached after the warm-up (0.1 suits global batch 256; where the data module
            lowers its default batch on a small data set, the default lr is scaled with it).
        momentum: SGD momentum.
        nesterov: Use Nesterov momentum.
        weight_decay: L2 penalty applied by SGD.
        label_smoothing: Cross-entropy label smoothing, 0 for plain cross-entropy; mixed batches' targets too.
        warmup_epochs: Length of the linear learning-rate warm-up, in (possibly fractional) epochs;
            the cosine annealing then runs over the rest of the run, stepped every iteration.
        channels_last: Keep activations in NHWC memory order, which convolutions run faster in.
        compile: Compile the network with ``torch.compile`` (inductor; on a CPU it needs a C++ compiler). The first
            epoch, and the first validation, hold the compilation. Compiled in place: checkpoints load into an
            eager model and back. Not with DataParallel (it copies the network every step), nor on XLA.
        compile_mode: torch.compile's mode: ``default``, ``reduce-overhead`` (CUDA graphs: one launch a step;
            not with fsdp), or ``max-autotune-no-cudagraphs`` (slower to compile, faster kernels).
        optimizer: Another optimizer, called with the parameters, e.g. ``--model.optimizer=torch.optim.AdamW
            --model.optimizer.lr=0.001``; null: SGD with ``lr``, ``momentum``, ``nesterov`` and ``weight_decay``.
        lr_scheduler: Another schedule, called with the optimizer and stepped once per epoch, e.g.
            ``--model.lr_scheduler=torch.optim.lr_scheduler.StepLR --model.lr_scheduler.step_size=3``; null:
            the warm-up (``warmup_epochs``) and cosine annealing, stepped every iteration.
    """

    def __init__(
        self,
        arch: str = "mobilenet_v2",
        num_classes: int = 10,
        in_channels: int = 3,
        weights: str | None = None,
        freeze_backbone: bool = False,
        lr: float = DEFAULT_LR,
        momentum: float = 0.9,
        nesterov: bool = True,
        weight_decay: float = 5e-4,
        label_smoothing: float = 0.0,
        warmup_epochs: float = 1.0,
        channels_last: bool = True,
        compile: bool = False,
        compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = "default",
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        _check_optimizer_options(lr, momentum, nesterov, weight_decay, label_smoothing, warmup_epochs)
        self.save_hyperparameters()
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.net = build_network(arch, num_classes, in_channels, weights)
        if freeze_backbone and (head := classifier_head(self.net)) is None:
            raise ProjectError(
                f"model.freeze_backbone=true needs a classifier head (nn.Linear); model.arch={arch} has none"
            )
        if freeze_backbone:
            self.net.requires_grad_(False)
            head[1].requires_grad_(True)
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # Loss and accuracy as means of per-image values (accuracy: 1 where the predicted class is right), top-5 where
        # there are 10 classes or more; confusion matrices, read and reset by the callback in callbacks/evaluation.py.
        self.train_acc, self.val_acc, self.test_acc = SampleMean(), SampleMean(), SampleMean()
        self.train_loss, self.val_loss, self.test_loss = SampleMean(), SampleMean(), SampleMean()
        self.top5_names = ("acc_top5",) if num_classes >= 10 else ()
        self.val_acc_top5, self.test_acc_top5 = SampleMean(), SampleMean()
        self.val_confusion, self.test_confusion = ConfusionMatrix(num_classes), ConfusionMatrix(num_classes)
        self._compiled = False

    def train(self, mode: bool = True) -> ImageClassifier:
        """With ``freeze_backbone`` the BatchNorm layers stay in eval mode: their statistics stay the weights' own."""
        super().train(mode)
        for module in self.net.modules() if mode and self.hparams.get("freeze_backbone") else ():
            if getattr(module, "track_running_stats", False):
                module.eval()
        return self

    def on_train_epoch_start(self) -> None:
        if self.hparams.freeze_backbone:
            self.train()  # Lightning does not call train() as training starts

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(self.prepare_images(images))

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor:
        """The images as the network takes them: in channels_last memory order if so configured."""
        return images.contiguous(memory_format=torch.channels_last) if self.hparams.channels_last else images

    def network_blocks(self) -> list[tuple[str, nn.Module]] | None:
        """How the network splits into blocks for fsdp and pipeline: :func:`project.nets.network_blocks`."""
        return network_blocks(self.net)

    def training_loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean loss of the batch and the predicted class of each image; labels: classes or class probabilities."""
        logits = self(images)
        return self.criterion(logits, labels), logits.argmax(dim=1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss, predictions = self.training_loss(images, labels)
        # The epoch's loss and accuracy (of a mixed batch: its likeliest classes), computed once, at its end.
        self.train_loss.update(loss.expand(len(labels)))  # the batch's mean, once for each image
        self.train_acc.update(predictions == (labels if labels.ndim == 1 else labels.argmax(dim=1)))
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        log_step_values(self, outputs)

    def on_train_epoch_end(self) -> None:
        self._log_epoch_metrics("train", ("loss", "acc"))

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> None:
        images, labels = batch
        logits = self(images)
        losses = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing, reduction="none")
        getattr(self, f"{stage}_loss").update(losses)
        predicted = logits.argmax(dim=1)
        getattr(self, f"{stage}_acc").update(predicted == labels)
        getattr(self, f"{stage}_confusion").update(predicted, labels)
        if self.top5_names:
            getattr(self, f"{stage}_acc_top5").update((logits.topk(5, dim=1).indices == labels[:, None]).any(dim=1))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics("val", ("loss", "acc", *self.top5_names), prog_bar=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics("test", ("loss", "acc", *self.top5_names))

    def _log_epoch_metrics(self, stage: str, names: tuple[str, ...], prog_bar: bool = False) -> None:
        """Log the epoch's ``<stage>/<name>`` metrics (reduced across ranks by torchmetrics) and reset
        them. Once per epoch, not with ``self.log(metric)`` in every step: each such call moves the
        metric to the device (``Metric.to``), about a millisecond -- a tenth of a batch-1 test step."""
        for name in names:
            metric = getattr(self, f"{stage}_{name}")
            # compute() has reduced it across ranks already: every rank logs the same value, and
            # sync_dist=True (a mean of equal values, one small collective per epoch) says so to Lightning,
            # which otherwise warns on every multi-process run.
            self.log(f"{stage}/{name}", metric.compute(), prog_bar=prog_bar, sync_dist=True)
            metric.reset()

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The class probabilities of every image in the batch (``predictions.csv`` holds the top ones)."""
        return self(batch[0]).softmax(dim=1)

    def configure_model(self) -> None:
        """With ``compile``, compile the network in place. Lightning calls this for fit, validate, test
        and predict alike, before the strategy sets the module up: a network compiled already is left
        as it is. (A sharding strategy shards the network after this.)"""
        if self.hparams.compile and not self._compiled:
            if self.trainer.strategy.root_device.type == "xla":
                raise ProjectError("--model.compile=true is not for XLA, which compiles the graph itself; leave it off")
            # nn.Module.compile, not torch.compile(self.net): the module stays the same object, so
            # state_dict keys and checkpoints are those of an eager run.
            mode = self.hparams.compile_mode
            self.net.compile(mode=None if mode == "default" else mode)
            self._compiled = True

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        # Under a sharding strategy these are the sharded parameters already, so each rank's
        # optimizer keeps state for its own shard only. Frozen ones (freeze_backbone) are left out.
        parameters = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_factory is not None:
            optimizer = self.optimizer_factory(parameters)
        else:
            sgd = {"lr": lr_for_batch(hp.lr, DEFAULT_LR, self.trainer), "momentum": hp.momentum}
            sgd |= {"nesterov": hp.nesterov, "weight_decay": hp.weight_decay}
            # fused: one kernel launch for every parameter's update, where they all sit on one CUDA device
            optimizer = torch.optim.SGD(parameters, **sgd, fused=fusable(parameters) or None)
        if self.scheduler_factory is not None:  # stepped once per epoch
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer), **LR_TAG}}
        total_steps = int(self.trainer.estimated_stepping_batches)
        steps_per_epoch = math.ceil(self.trainer.num_training_batches / self.trainer.accumulate_grad_batches)
        warmup_steps = min(total_steps, round(hp.warmup_epochs * steps_per_epoch))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup_steps, total_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step", **LR_TAG}}


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

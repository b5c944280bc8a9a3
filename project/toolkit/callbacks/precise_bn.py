"""Precise BatchNorm statistics (``torch.optim.swa_utils.update_bn``, pycls, detectron2): why, the exponential average
the training steps keep follows the last ten or so batches; on a small data set, a few batches an epoch, it describes
neither the weights nor the data, and evaluation scores far below training."""

from __future__ import annotations

import math
import time
from typing import Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import move_data_to_device
from torch import nn

from project.toolkit.errors import ProjectError
from project.toolkit.interfaces import image_data, layout_of
from project.toolkit.log import get_logger

log = get_logger(__name__)

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
AUTO = "auto"


class PreciseBatchNorm(Callback):
    """Recompute the BatchNorm running statistics over up to ``batches`` training batches (augmented, the network in
    eval mode but for the BatchNorm layers the module trains) before each validation of a fit, and at an epoch's end
    that has none; under ddp and fsdp each process averages its own batches and the statistics are averaged across
    processes. Layers the module keeps in eval mode (``freeze_backbone``) are left alone. Each recalibration's
    seconds are logged as ``time/precise_bn_seconds``.

    Args:
        enabled: true, false, or auto: on where an epoch has at most ``auto_max_batches`` training batches (a small
            data set, or a large batch), where the running averages are noisiest; off for CIFAR-10 at batch 256.
        batches: Training batches (each process's) one recalibration averages; fewer if an epoch has fewer.
        auto_max_batches: The most training batches an epoch may have for ``enabled=auto`` to switch it on.
    """

    def __init__(self, enabled: bool | Literal["auto"] = AUTO, batches: int = 50, auto_max_batches: int = 100) -> None:
        if enabled not in (True, False, AUTO):
            raise ProjectError(f"precise_bn.enabled={enabled} is not allowed: use true, false or auto")
        for name, value in (("batches", batches), ("auto_max_batches", auto_max_batches)):
            if not isinstance(value, int) or value < 1:
                raise ProjectError(f"precise_bn.{name}={value} is not allowed: it must be an integer >= 1")
        self.enabled, self.batches, self.auto_max_batches = enabled, batches, auto_max_batches
        self.active = False
        self.seconds: list[float] = []  # each recalibration's
        self._done_at: int | None = None  # the global step of the last recalibration
        self._limit = batches  # the batches one recalibration reads: batches, or fewer if an epoch has fewer

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        steps, self.seconds, self._done_at = trainer.num_training_batches, [], None
        on = self.enabled is True or (self.enabled == AUTO and steps <= self.auto_max_batches)
        layers = [m for m in pl_module.modules() if isinstance(m, BATCH_NORMS) and m.track_running_stats]
        if on and layout_of(trainer.strategy).sample_copies > 1:  # pipeline: each process holds some stages
            log.info("precise BatchNorm statistics: not under %s", type(trainer.strategy).__name__)
            on = False
        if on and image_data(trainer) is None:
            log.info("precise BatchNorm statistics: not with %s (no training_batches)", type(trainer.datamodule))
            on = False
        self.active = on and bool(layers)
        # No more batches than the fit trains an epoch (limit_train_batches, fast_dev_run: 1).
        self._limit = min(self.batches, steps) if math.isfinite(steps) else self.batches
        if self.active:
            log.info(
                "precise BatchNorm statistics: recomputed over up to %d training batches before each validation "
                "(%s an epoch; --precise_bn.enabled=false switches it off)",
                self._limit,
                steps,
            )

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._recalibrate(trainer, pl_module)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._recalibrate(trainer, pl_module)  # before the epoch's checkpoint (ModelCheckpoint's hooks run last)

    def _recalibrate(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.active or self._done_at == trainer.global_step:
            return
        start = time.perf_counter()
        was_training = pl_module.training
        pl_module.train()  # the module's train(): which BatchNorm layers it trains
        layers = [m for m in pl_module.modules() if isinstance(m, BATCH_NORMS) and m.track_running_stats and m.training]
        pl_module.eval()
        kept = [
            (m.momentum, m.num_batches_tracked.clone(), m.running_mean.clone(), m.running_var.clone()) for m in layers
        ]
        for layer in layers:
            layer.reset_running_stats()
            layer.momentum = None  # a cumulative average of the batches' statistics
            layer.train()
        count = 0
        batches = image_data(trainer).training_batches(trainer.current_epoch)
        with torch.no_grad(), trainer.precision_plugin.forward_context():
            for batch in batches:
                images = move_data_to_device(batch[0], trainer.strategy.root_device)  # no batch hooks: made already
                pl_module(trainer.precision_plugin.convert_input(images))
                count += 1
                if count == self._limit:
                    break
        batches.close()  # its DataLoader's workers end now
        for layer, (momentum, tracked, mean, var) in zip(layers, kept, strict=True):
            layer.momentum = momentum
            layer.num_batches_tracked.copy_(tracked)
            if not count:  # no batch: the statistics stay as they were
                layer.running_mean.copy_(mean)
                layer.running_var.copy_(var)
        if count and trainer.world_size > 1 and layers:  # each process's means and variances: their mean, at once
            buffers = [b for layer in layers for b in (layer.running_mean, layer.running_var)]
            flat = trainer.strategy.reduce(torch.cat([b.reshape(-1) for b in buffers]), reduce_op="mean")
            for buffer, values in zip(buffers, flat.split([b.numel() for b in buffers]), strict=True):
                buffer.copy_(values.view_as(buffer))
        pl_module.train(was_training)
        self._done_at = trainer.global_step
        seconds = time.perf_counter() - start
        self.seconds.append(seconds)
        if trainer.is_global_zero and trainer.logger is not None:
            trainer.logger.log_metrics({"time/precise_bn_seconds": seconds}, step=trainer.global_step)

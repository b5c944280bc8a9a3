"""One line early in a long CPU fit with its estimated time and the faster choices: :class:`CpuTimeEstimate`."""

from __future__ import annotations

import math
import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.accelerators import CPUAccelerator

from project.toolkit.data.datamodule import data_settings
from project.toolkit.log import get_logger

log = get_logger(__name__)

SMALL_IMAGE_SIZE = 32  # CIFAR-10's own size: the cheapest --data.image_size that loses no detail
# Evaluating a batch is a forward pass only, about a third of a training step's forward + backward.
EVALUATION_SHARE_OF_A_STEP = 1 / 3


def format_duration(seconds: float) -> str:
    """``5400`` -> ``'1 h 30 min'``, ``150`` -> ``'3 min'``, ``20`` -> ``'20 s'``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds / 60 + 0.5)  # half up: round() rounds 2.5 to 2
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


class CpuTimeEstimate(Callback):
    """On a CPU, estimates the fit's time from its first iterations and says so when it is long.

    Args:
        iterations: Training iterations timed, after the first one (which pays for start-up).
        min_minutes: Print the estimate only for a fit expected to take longer than this.
    """

    def __init__(self, iterations: int = 3, min_minutes: float = 10.0) -> None:
        self.iterations, self.min_minutes = iterations, min_minutes
        self._started: float | None = None
        self._first_step = 0
        self._done = False

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._done = not isinstance(trainer.accelerator, CPUAccelerator) or bool(trainer.fast_dev_run)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not self._done and self._started is None and trainer.global_step >= 1:
            self._started, self._first_step = time.perf_counter(), trainer.global_step

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._done or self._started is None or trainer.global_step - self._first_step < self.iterations:
            return
        self._done = True
        seconds_per_step = (time.perf_counter() - self._started) / (trainer.global_step - self._first_step)
        if line := estimate_line(trainer, seconds_per_step, self.min_minutes):
            log.warning(line)


def estimate_line(trainer: Trainer, seconds_per_step: float, min_minutes: float) -> str | None:
    """The line :class:`CpuTimeEstimate` prints; None for a fit under ``min_minutes`` or without an end."""
    total_steps = trainer.estimated_stepping_batches
    if not math.isfinite(total_steps) or total_steps <= 0:
        return None
    steps_per_epoch = max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))
    epochs = math.ceil(total_steps / steps_per_epoch)
    validation_batches = sum(trainer.num_val_batches) if trainer.enable_validation else 0
    seconds = seconds_per_step * (total_steps + epochs * validation_batches * EVALUATION_SHARE_OF_A_STEP)
    if seconds < 60 * min_minutes:
        return None
    faster = []
    image_size = data_settings(trainer).get("image_size")
    if image_size and image_size > SMALL_IMAGE_SIZE:
        fewer = (image_size / SMALL_IMAGE_SIZE) ** 2
        faster.append(f"--data.image_size={SMALL_IMAGE_SIZE} ({fewer:.0f}x fewer pixels per image)")
    faster.append("a GPU (--trainer.accelerator=gpu)")
    return (
        f"This fit will take about {format_duration(seconds)} on this CPU ({seconds_per_step:.2f} s per step, "
        f"{total_steps} steps in {epochs} epoch(s), with validation); faster: {' or '.join(faster)}"
    )

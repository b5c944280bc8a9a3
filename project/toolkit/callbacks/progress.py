"""The progress bar: the logged training loss and the learning rate, no ``v_num``; rich where installed, else tqdm."""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from project.toolkit.training import logging_step


def rich_installed() -> bool:
    """Whether ``rich`` can be imported (the ``progress`` extra installs it)."""
    return importlib.util.find_spec("rich") is not None


class LossOnBar:
    """Mixin for a Lightning progress bar: the training loss where the loggers last wrote it (or at an epoch's end) and
    the learning rate, no ``v_num``; updated at most :data:`UPDATES_PER_SECOND` times a second (Lightning's: every
    step)."""

    UPDATES_PER_SECOND = 10  # as often as the rich bar redraws by default

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loss: float | None = None
        self._next_update = 0.0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        last = batch_idx + 1 >= self.total_train_batches  # type: ignore[attr-defined]
        read = last or logging_step(trainer.global_step, trainer)
        if read and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.loss = float(loss)  # read where the loggers, or the epoch's end, wait for the device anyway
        now = time.monotonic()
        if last or now >= self._next_update:
            self._next_update = now + 1 / self.UPDATES_PER_SECOND
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # type: ignore[misc]

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        shown = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        shown.pop("v_num", None)
        ours = {}
        if trainer.state.fn == "fit" and self.loss is not None:
            ours["loss"] = f"{self.loss:.3f}"
        lr = trainer.optimizers[0].param_groups[0].get("lr") if trainer.optimizers else None
        if isinstance(lr, float):
            ours["lr"] = f"{lr:.3g}"
        return {**ours, **shown}


class TQDMTrainingBar(LossOnBar, TQDMProgressBar):
    """Lightning's tqdm bar with the training loss and learning rate."""


class RichTrainingBar(LossOnBar, RichProgressBar):
    """Lightning's rich bar with the training loss and learning rate, finished before the end-of-stage tables.

    Args:
        refresh_rate: Redraws per second; 10 instead of Lightning's 100 spares its drawing thread a share of a core.
        kwargs: The other options of Lightning's RichProgressBar (``leave``, ``theme``, ...).
    """

    def __init__(self, refresh_rate: int = 10, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._finish(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_epoch_end(trainer, pl_module)
        if trainer.state.fn == "validate":  # the validate command, not fit's validation epochs
            self._finish(trainer, pl_module)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_test_epoch_end(trainer, pl_module)
        self._finish(trainer, pl_module)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_predict_epoch_end(trainer, pl_module)
        self._finish(trainer, pl_module)

    def _finish(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Let go of the terminal now, so the timing table and the summary print below the bar, not under it."""
        self.teardown(trainer, pl_module, str(trainer.state.stage or ""))


# The default bar (``--callbacks.progress_bar``); its options (``--progress_bar.*``) are Lightning's.
ProgressBar: type[LossOnBar] = RichTrainingBar if rich_installed() else TQDMTrainingBar

"""An exponential moving average of the weights, off by default (``--callbacks.ema=true``): the switch and its
options; the work, :class:`project.toolkit.callbacks.averaged_weights.AveragedWeights`, loads with a fit using it."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from project.toolkit.errors import ProjectError

# AveragedWeights's hooks besides setup, called once a fit made it.
HOOKS = ("on_load_checkpoint", "on_train_start", "on_train_batch_end", "on_validation_start", "on_validation_end")
HOOKS += ("on_train_end", "on_save_checkpoint")


class ExponentialMovingAverage(Callback):
    """Validation, the checkpoints (so test, predict and export) and the module at a fit's end use the average of the
    weights, updated on the device after each optimizer step: ``average = decay * average + (1 - decay) * weights``.

    Args:
        decay: The average's share at each update: 0 keeps the weights themselves, 1 the weights the fit started from.
    """

    def __init__(self, decay: float = 0.999) -> None:
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0 <= decay <= 1:
            raise ProjectError(f"ema.decay={decay} is not allowed: it must be a number from 0 to 1")
        self.decay, self.averaged = float(decay), None  # AveragedWeights, once a fit made it

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and self.averaged is None:
            from project.toolkit.callbacks.averaged_weights import AveragedWeights

            self.averaged = AveragedWeights(self.decay)
        if self.averaged is not None:
            self.averaged.setup(trainer, pl_module, stage)


def _forwarded(hook: str) -> Any:
    return lambda self, *args: None if self.averaged is None else getattr(self.averaged, hook)(*args)


for _hook in HOOKS:
    setattr(ExponentialMovingAverage, _hook, _forwarded(_hook))

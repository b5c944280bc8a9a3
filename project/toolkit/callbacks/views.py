"""What a run shows in TensorBoard beyond its scalars (:class:`TensorBoardViews`): a custom-scalars layout
(accuracy, loss, throughput, epoch time and memory side by side, every run overlaid) and, at the end of fit, the
hyperparameters against real metrics (the HPARAMS tab). Every scalar is against the global step.
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from project.toolkit.callbacks.timing import TimingCallback
from project.toolkit.callbacks.timing_report import run_description
from project.toolkit.data.datamodule import data_settings

# Category title -> chart title -> the tags (regular expressions) it overlays.
LAYOUT: dict[str, dict[str, list[str]]] = {
    "training": {
        "accuracy": [r"^train/acc$", r"^val/acc$"],
        "loss": [r"^train/loss$", r"^train/loss_step$", r"^val/loss$"],
        "samples per second (train)": [r"^time/train_samples_per_second$"],
        "seconds per epoch": [r"^time/train_epoch_seconds$", r"^time/val_epoch_seconds$"],
        "peak memory MiB per rank": [r"^memory/peak_mb/"],
    },
    "test and predict": {
        "accuracy (test)": [r"^test/acc$"],
        "ms per batch": [r"^time/(test|predict)/batch_latency_ms_(p50|p90|p99)$"],
        "samples per second": [r"^time/(test|predict)/samples_per_second$"],
        "peak memory MiB per rank": [r"^memory/(test|predict)/peak_mb/"],
    },
}

# The metrics of the HPARAMS tab, under their own group in the scalars.
HPARAM_METRICS = tuple(
    f"hparams/{k}" for k in ("val_acc", "best_val_acc", "train_samples_per_second", "epoch_seconds_mean")
)


class TensorBoardViews(Callback):
    """Writes the custom-scalars layout into every TensorBoard run, and at the end of fit the run's
    hyperparameters with its final and best ``val/acc`` and throughput. Put it after the TimingCallback."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            for logger in _tensorboard_loggers(trainer):
                logger.experiment.add_custom_scalars(_summary_writer_layout())

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loggers = _tensorboard_loggers(trainer)
        if not loggers or not trainer.is_global_zero:
            return
        metrics = {k: v for k, v in final_metrics(trainer).items() if v is not None and math.isfinite(v)}
        if not metrics:  # no validation and no timing: nothing to compare runs by
            return
        params = run_hparams(trainer, pl_module)
        step = max(trainer.global_step - 1, 0)  # the step of the last epoch's val/acc
        for logger in loggers:
            logger.log_hyperparams(params, metrics=metrics, step=step)


def _summary_writer_layout() -> dict[str, dict[str, list[Any]]]:
    """:data:`LAYOUT` in SummaryWriter's format (torch's and tensorboardX's): chart -> [kind, tags]."""
    return {
        category: {title: ["Multiline", tags] for title, tags in charts.items()} for category, charts in LAYOUT.items()
    }


def _tensorboard_loggers(trainer: Trainer) -> list[TensorBoardLogger]:
    return [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]


def _number(value: Any) -> float | None:
    if hasattr(value, "item"):  # a tensor from callback_metrics
        value = value.item()
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def final_metrics(trainer: Trainer) -> dict[str, float | None]:
    """The HPARAMS tab's metrics: the last and best ``val/acc``, the steady throughput and epoch time (None where
    the run has none)."""
    timing = next((c.report for c in trainer.callbacks if isinstance(c, TimingCallback)), {})
    checkpoint = trainer.checkpoint_callback
    best = checkpoint.best_model_score if isinstance(checkpoint, ModelCheckpoint) else None
    return {
        "hparams/val_acc": _number(trainer.callback_metrics.get("val/acc")),
        "hparams/best_val_acc": _number(best),
        "hparams/train_samples_per_second": _number(timing.get("train_samples_per_second")),
        "hparams/epoch_seconds_mean": _number(timing.get("epoch_seconds_mean")),
    }


def run_hparams(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    """The HPARAMS tab's columns: the model's and data's hyperparameters, how the run was spread, its length."""
    params = run_description(trainer, pl_module)  # arch, image and batch size among them, unprefixed
    data = data_settings(trainer)
    for name, value in [*pl_module.hparams.items(), *data.items()]:
        if not name.startswith("_"):  # LightningCLI's bookkeeping (_instantiator), not a setting
            params.setdefault(name, value)
    params["max_epochs"] = trainer.max_epochs
    return params

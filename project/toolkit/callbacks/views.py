"""What a run shows in TensorBoard beyond its scalars: :class:`TensorBoardViews`.

- A custom-scalars layout (TensorBoard's CUSTOM SCALARS tab, ``#custom_scalars``): accuracy, loss,
  throughput, epoch time and peak memory side by side in one row, test/predict latency in the next,
  every run of the log folder overlaid in each chart. TensorBoard merges the layouts of the runs it
  shows, skipping duplicates, so each run writing the same layout costs nothing.
- The hyperparameters with real metrics (the HPARAMS tab), written once at the end of fit: the
  model's and the data's hyperparameters and how the run was spread, against the final and best
  ``val/acc`` and the training throughput and epoch time the timing callback measured. Lightning's
  placeholder ``hp_metric=-1`` is not written.

Every scalar of a run is on one x axis, the global step (see :mod:`project.toolkit.callbacks.timing`), so the
charts of one row line up; Lightning's ``epoch`` scalar, whose chart TensorBoard opened on, is left out.

What TensorBoard does not let a run choose: the tab it opens on (the SCALARS tab; the end-of-run summary
and ``make tensorboard`` give the address of the CUSTOM SCALARS tab, ``http://localhost:6006/#custom_scalars``),
and the colours of the runs. A run's name is its folder; ``make tensorboard`` names each run by its
setup instead (:func:`project.toolkit.cli.run_dirs.tensorboard_logdir_spec`).
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
HPARAM_METRICS = (
    "hparams/val_acc",
    "hparams/best_val_acc",
    "hparams/train_samples_per_second",
    "hparams/epoch_seconds_mean",
)


class TensorBoardViews(Callback):
    """Writes the custom-scalars layout into every TensorBoard run, and at the end of fit the run's
    hyperparameters with its final and best ``val/acc`` and training throughput (no placeholder
    ``hp_metric``). Place it after the TimingCallback, whose figures it reports. Does nothing
    without a TensorBoardLogger."""

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
    """The HPARAMS tab's metrics: the last and the best ``val/acc`` (None without validation or
    checkpointing), the steady training throughput and epoch time (None without the timing callback,
    or with a single epoch for the epoch time)."""
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
    """The columns of the HPARAMS tab: the model's and the data's hyperparameters, how the run was
    spread (strategy, devices, precision, ...) and its length."""
    params = run_description(trainer, pl_module)  # arch, image and batch size among them, unprefixed
    data = data_settings(trainer)
    for name, value in [*pl_module.hparams.items(), *data.items()]:
        if not name.startswith("_"):  # LightningCLI's bookkeeping (_instantiator), not a setting
            params.setdefault(name, value)
    params["max_epochs"] = trainer.max_epochs
    return params

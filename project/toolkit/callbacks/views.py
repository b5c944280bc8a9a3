"""What a run shows in TensorBoard: no placeholder cards (:class:`TensorBoardLogger`), the first (:data:`FIRST_CARDS`),
a custom-scalars layout and, after fit, the hyperparameters against real metrics (:class:`TensorBoardViews`)."""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer, loggers
from lightning.pytorch.callbacks import ModelCheckpoint

from project.toolkit.callbacks.group import find_callback
from project.toolkit.interfaces import data_settings
from project.toolkit.timing.callback import TimingCallback
from project.toolkit.timing.report import run_description

# TIME SERIES, TensorBoard's first tab, filtered by the link runs print: accuracy, loss, the confusion matrix
FIRST_CARDS = r"^(train|val)/(acc|loss)$|^val/confusion$"
# Category title -> chart title -> the tags (regular expressions) it overlays.
LAYOUT: dict[str, dict[str, list[str]]] = {
    "training": {
        "accuracy": [r"^train/acc$", r"^val/acc$"],
        "loss": [r"^train/loss$", r"^train/loss_step$", r"^val/loss$"],
        "learning rate": [r"^train/lr($|/)"],  # LearningRateMonitor's: train/lr, or train/lr/<group> for each group
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


class TensorBoardLogger(loggers.TensorBoardLogger):
    """Lightning's TensorBoard logger without placeholder cards: ``default_hp_metric`` off, no ``epoch`` scalar."""

    def __init__(self, *args: Any, default_hp_metric: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, default_hp_metric=default_hp_metric, **kwargs)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics({name: value for name, value in metrics.items() if name != "epoch"}, step)


class TensorBoardViews(Callback):
    """Writes the custom-scalars layout into each TensorBoard run and, after fit, the HPARAMS tab (put after timing);
    other loggers get the run's setup (strategy, devices, precision, ...) as params."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.is_global_zero:  # the layout in SummaryWriter's format (torch's and tensorboardX's)
            layout = {c: {t: ["Multiline", tags] for t, tags in charts.items()} for c, charts in LAYOUT.items()}
            for logger in _tensorboard_loggers(trainer):
                logger.experiment.add_custom_scalars(layout)
            # Other loggers (CSV, MLflow) get the run's setup; Lightning then logs the model's and data's options (left
            # out here: MLflow refuses a param logged again with another value).
            own = {*pl_module.hparams, *data_settings(trainer)}
            for logger in [logger for logger in trainer.loggers if not isinstance(logger, loggers.TensorBoardLogger)]:
                logger.log_hyperparams({k: v for k, v in run_hparams(trainer, pl_module).items() if k not in own})

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loggers = _tensorboard_loggers(trainer)
        if not loggers or not trainer.is_global_zero:
            return
        metrics = {k: v for k, v in final_metrics(trainer).items() if v is not None and math.isfinite(v)}
        if not metrics:  # no validation and no timing: nothing to compare runs by
            return
        params, step = run_hparams(trainer, pl_module), max(trainer.global_step - 1, 0)  # step: the last val/acc's
        for logger in loggers:
            logger.log_hyperparams(params, metrics=metrics, step=step)


def _tensorboard_loggers(trainer: Trainer) -> list[loggers.TensorBoardLogger]:
    return [logger for logger in trainer.loggers if isinstance(logger, loggers.TensorBoardLogger)]


def final_metrics(trainer: Trainer) -> dict[str, float | None]:
    """The HPARAMS tab's metrics: the last and best ``val/acc``, steady throughput and epoch time (None: not run)."""
    timing = getattr(find_callback(trainer, TimingCallback), "report", {})
    checkpoint = trainer.checkpoint_callback
    best = checkpoint.best_model_score if isinstance(checkpoint, ModelCheckpoint) else None
    values = [trainer.callback_metrics.get("val/acc"), best]
    values += [timing.get("train_samples_per_second"), timing.get("epoch_seconds_mean")]  # in HPARAM_METRICS' order
    values = [v.item() if hasattr(v, "item") else v for v in values]  # tensors from callback_metrics
    numbers = [float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None for v in values]
    return dict(zip(HPARAM_METRICS, numbers, strict=True))


def run_hparams(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    """The HPARAMS tab's columns: the model's and data's hyperparameters, how the run was spread, its length."""
    params = run_description(trainer, pl_module)  # arch, image and batch size among them, unprefixed
    for name, value in [*pl_module.hparams.items(), *data_settings(trainer).items()]:
        if not name.startswith("_"):  # LightningCLI's bookkeeping (_instantiator), not a setting
            params.setdefault(name, value)
    params["max_epochs"] = trainer.max_epochs
    return params

"""What a run leaves behind, said at its end: :class:`RunSummary` prints, after each command, the run folder, the
checkpoints (best and last), ``timing.json`` and ``predictions.csv``, the final metrics and where each logger put them
(``metrics.csv``, the MLflow run, TensorBoard) and how to open them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any
from urllib.parse import quote

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger

from project.toolkit.callbacks.views import FIRST_CARDS
from project.toolkit.helpers import shown_path

# The epoch metrics the model logs (project/model.py), in the order they are shown.
SHOWN_METRICS = [f"{stage}/{name}" for stage in ("train", "val", "test") for name in ("loss", "acc", "acc_top5")]


class RunSummary(Callback):
    """Prints where a run's outputs went and its final metrics; rank 0 prints, every rank asks for the folder."""

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print(trainer, "fit")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "validate":  # the validate command, not fit's validation epochs
            self._print(trainer, "validate")

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print(trainer, "test")

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print(trainer, "predict")

    def _print(self, trainer: Trainer, stage: str) -> None:
        log_dir = trainer.log_dir  # every rank must ask: Lightning broadcasts it from rank 0
        if trainer.is_global_zero:
            print("\n".join(summary_lines(trainer, stage, log_dir)), flush=True)


def summary_lines(trainer: Trainer, stage: str, log_dir: str | None) -> list[str]:
    if trainer.fast_dev_run:
        return [f"{stage} done (fast_dev_run: a smoke run, nothing written)"]
    folder = Path(log_dir) if log_dir else None
    if folder is None or not folder.is_dir():
        return [f"{stage} done; no run folder was written"]
    lines = [f"{stage} done; run folder: {shown_path(folder)}"]
    if stage == "fit":
        lines += checkpoint_lines(trainer.checkpoint_callback, trainer.callback_metrics)
    elif trainer.ckpt_path:
        lines.append(f"  checkpoint used:  {shown_path(trainer.ckpt_path)}")
    for name in ("timing.json", "predictions.csv"):
        if (folder / name).is_file() and (name != "predictions.csv" or stage == "predict"):
            lines.append(f"  {name + ':':<17} {shown_path(folder / name)}")
    values = trainer.callback_metrics  # ``train/loss 0.4120  val/acc 0.8125``
    if metrics := "  ".join(f"{key} {float(values[key]):.4f}" for key in SHOWN_METRICS if key in values):
        lines.append(f"  final metrics (epoch means): {metrics}")
    for logger in trainer.loggers:  # the loggers besides TensorBoard (configs/logger/)
        if isinstance(logger, CSVLogger):
            lines.append(f"  {'metrics.csv:':<17} {shown_path(Path(logger.log_dir) / 'metrics.csv')}")
        elif isinstance(logger, MLFlowLogger) and logger.run_id:
            uri, name = logger.experiment.tracking_uri, logger.experiment.get_experiment(logger.experiment_id).name
            if uri.startswith("sqlite:///"):  # the local store: its path as the others are shown
                uri = "sqlite:///" + shown_path(uri.removeprefix("sqlite:///"))
            # The mlflow extra is mlflow-skinny, without the UI's server (flask): say how to get it where it is missing.
            ui = "mlflow ui" if importlib.util.find_spec("flask") else "pip install mlflow, then mlflow ui"
            lines.append(f"  {'MLflow run:':<17} {logger.run_id} in {name}: {ui} --backend-store-uri {uri}")
    if any(isinstance(logger, TensorBoardLogger) for logger in trainer.loggers):
        lines.append(
            f"  open in TensorBoard: tensorboard --logdir {shown_path(folder.parent)}, then accuracy and loss: "
            f"http://localhost:6006/?tagFilter={quote(FIRST_CARDS, safe='')}#timeseries, side by side: #custom_scalars"
        )
    return lines


def checkpoint_lines(checkpoint: Any, metrics: dict[str, Any]) -> list[str]:
    """The best and last checkpoints of a fit with their metric, if it kept any."""
    if not isinstance(checkpoint, ModelCheckpoint) or not checkpoint.dirpath:
        return ["  checkpoints:      none (checkpointing is off)"]
    lines = []
    monitor = checkpoint.monitor
    if checkpoint.best_model_path and checkpoint.best_model_score is not None:
        score = float(checkpoint.best_model_score)
        lines.append(f"  best checkpoint:  {shown_path(checkpoint.best_model_path)} ({monitor} {score:.4f})")
    last = Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
    if last.exists():
        note = f" ({monitor} {float(metrics[monitor]):.4f})" if monitor in metrics else ""
        if not lines:
            note += ", also --ckpt_path=best (no validation ranked the checkpoints)"
        lines.append(f"  last checkpoint:  {shown_path(last)}{note}")
    return lines

"""``python -m project predict`` writes what it predicted: ``<log_dir>/predictions.csv``."""

from __future__ import annotations

import csv
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from project.toolkit.data.samplers import SliceBatches
from project.toolkit.errors import ProjectError
from project.toolkit.interfaces import image_data
from project.toolkit.log import get_logger

log = get_logger(__name__)


class PredictionWriter(BasePredictionWriter):
    """One row per image -- its index in the predicted data set (its file too, where the data set names its
    images: ``predict_names``), the predicted class index and name -- from
    every rank, sorted by index, in ``<trainer.log_dir>/<filename>`` (rank 0 writes). Each batch's predictions
    stay on the device until the epoch's end, so predicting never waits for it."""

    def __init__(self, filename: str = "predictions.csv") -> None:
        super().__init__(write_interval="batch")
        self.filename = filename
        self.batches: list[tuple[Sequence[int], torch.Tensor]] = []

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.batches = []
        if isinstance(trainer.predict_dataloaders, SliceBatches):  # the on-device path: its indices are known here
            warnings.filterwarnings("ignore", message="Couldn't infer the batch indices.*SliceBatches")

    def write_on_batch_end(
        self, trainer: Trainer, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any, batch_idx: int, *_: Any
    ) -> None:
        loader = trainer.predict_dataloaders
        if isinstance(loader, SliceBatches):
            batch_indices = loader.batch_indices()[batch_idx]
        if not batch_indices:
            raise ProjectError(
                f"predictions.csv needs the image indices of every batch, which a {type(loader).__name__} does not "
                "give; predict from a DataLoader with a batch_size, or switch the writer off: "
                "--callbacks.predictions=false"
            )
        self.batches.append((list(batch_indices), torch.as_tensor(prediction)))

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pairs = [
            (int(index), int(pred))
            for indices, preds in self.batches
            for index, pred in zip(indices, preds.tolist(), strict=True)
        ]
        self.batches = []
        if dist.is_available() and dist.is_initialized():
            shards: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(shards, pairs)
            pairs = [pair for shard in shards for pair in shard]
        if trainer.global_rank != 0 or trainer.log_dir is None:
            return
        data = image_data(trainer)
        names, files = (data.label_names, data.predict_names) if data is not None else (None, None)
        path = Path(trainer.log_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["index", *(["file"] if files else []), "predicted", "predicted_name"])
            for index, pred in sorted(pairs):
                writer.writerow([index, *([files[index]] if files else []), pred, names[pred] if names else pred])
        log.info("Wrote %d predictions to %s", len(pairs), path)

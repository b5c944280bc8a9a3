"""``python -m project predict`` writes what it predicted: ``<log_dir>/predictions.csv``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer

from project.toolkit.compat import seen_batch_indices
from project.toolkit.data.samplers import SliceBatches
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger

log = get_logger(__name__)


class PredictionWriter(Callback):
    """At the end of ``predict``, write one row per image -- its index in the predicted data set,
    the predicted class index and name -- gathered from every rank and sorted by index, to
    ``<trainer.log_dir>/<filename>`` (rank 0 writes).

    The image indices of each batch come from the predict loader (:func:`batch_indices`): not Lightning's
    BasePredictionWriter, which has them from Lightning for a DataLoader only, and the on-device path
    predicts from slices of the images, with no DataLoader."""

    def __init__(self, filename: str = "predictions.csv") -> None:
        self.filename = filename
        self.predictions: list[torch.Tensor] = []

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        batch_indices(trainer.predict_dataloaders)  # a loader whose indices are unknown: said before predicting

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.predictions = []

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.predictions.append(torch.as_tensor(outputs))

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        indices = batch_indices(trainer.predict_dataloaders)[: len(self.predictions)]  # limit_predict_batches
        pairs = [
            (int(index), int(pred))
            for preds, batch in zip(self.predictions, indices, strict=True)
            for index, pred in zip(batch, preds.tolist(), strict=True)
        ]
        self.predictions = []
        if dist.is_available() and dist.is_initialized():
            shards: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(shards, pairs)
            pairs = [pair for shard in shards for pair in shard]
        if trainer.global_rank != 0 or trainer.log_dir is None:
            return
        names = getattr(trainer.datamodule, "label_names", None)
        path = Path(trainer.log_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["index", "predicted", "predicted_name"])
            for index, pred in sorted(pairs):
                writer.writerow([index, pred, names[pred] if names else pred])
        log.info("Wrote %d predictions to %s", len(pairs), path)


def batch_indices(loader: Any) -> list[list[int]]:
    """The data-set indices of every batch ``loader`` gives (:class:`SliceBatches`), or has given (a DataLoader
    that batches by itself: Lightning records them), in order.

    >>> batch_indices(SliceBatches(5, batch_size=2, num_replicas=1, rank=0))
    [[0, 1], [2, 3], [4]]
    """
    if isinstance(loader, SliceBatches):
        return loader.batch_indices()
    seen = seen_batch_indices(loader)
    if seen is None:
        raise ProjectError(
            f"predictions.csv needs the image indices of every batch, which a {type(loader).__name__} does not give; "
            "predict from a DataLoader with a batch_size, or switch the writer off (--callbacks.predictions=false)"
        )
    return seen

"""``python -m project predict`` writes what it predicted: ``<log_dir>/predictions.csv``."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from project.toolkit.log import get_logger

log = get_logger(__name__)


class PredictionWriter(BasePredictionWriter):
    """At the end of ``predict``, write one row per image -- its index in the predicted data set,
    the predicted class index and name -- gathered from every rank and sorted by index, to
    ``<trainer.log_dir>/<filename>`` (rank 0 writes)."""

    def __init__(self, filename: str = "predictions.csv") -> None:
        super().__init__(write_interval="epoch")
        self.filename = filename

    def write_on_epoch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Any],
    ) -> None:
        # One predict loader: predictions is a list of per-batch tensors and batch_indices holds,
        # per batch, the data-set indices the sampler gave this rank.
        pairs = [
            (int(index), int(pred))
            for preds, indices in zip(predictions, batch_indices[0], strict=True)
            for index, pred in zip(indices, torch.as_tensor(preds).tolist(), strict=True)
        ]
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

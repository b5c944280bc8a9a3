"""``python -m project predict`` writes what it predicted: ``<log_dir>/predictions.csv``."""

from __future__ import annotations

import csv
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from project.toolkit.data.samplers import SliceBatches
from project.toolkit.errors import ProjectError
from project.toolkit.interfaces import image_data
from project.toolkit.log import get_logger

log = get_logger(__name__)


class PredictionWriter(BasePredictionWriter):
    """One row per image -- its index (and file, where the data set names them: ``predict_names``), the predicted class,
    its name and probability, the top k (min(5, classes)) names and probabilities -- sorted by index, from every rank,
    in ``<trainer.log_dir>/<filename>`` (rank 0 writes). The top k of ``predict_step``'s class probabilities stay on
    the device until the epoch's end, so predicting never waits for it."""

    def __init__(self, filename: str = "predictions.csv") -> None:
        super().__init__(write_interval="batch")
        self.filename = filename
        self.batches: list[tuple[Sequence[int], Any]] = []

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
        self.batches.append((list(batch_indices), prediction.topk(min(5, prediction.shape[1]), dim=1)))

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Each image's top k probabilities and classes, by its index (ix: a batch's indices).
        seen = {int(i): top for ix, (p, c) in self.batches for i, *top in zip(ix, p.tolist(), c.tolist(), strict=True)}
        self.batches = []
        if dist.is_available() and dist.is_initialized():
            shards: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(shards, seen)
            seen = {index: top for shard in shards for index, top in shard.items()}  # a pipeline's stages: the same
        log_dir = trainer.log_dir  # every rank asks: Lightning broadcasts it from rank 0 (a collective)
        if trainer.global_rank != 0 or log_dir is None:
            return
        data = image_data(trainer)
        names, files = (data.label_names, data.predict_names) if data is not None else (None, None)
        path = Path(log_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        k = len(next(iter(seen.values()))[0]) if seen else 0
        top = [f"top{i}_{column}" for i in range(1, k + 1) for column in ("name", "probability")]
        with open(path, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["index", *(["file"] if files else []), "predicted", "predicted_name", "probability", *top])
            for index, (values, classes) in sorted(seen.items()):
                tops = [x for p, c in zip(values, classes, strict=True) for x in (names[c] if names else c, f"{p:.4f}")]
                writer.writerow([index, *([files[index]] if files else []), classes[0], *tops[:2], *tops])
        log.info("Wrote %d predictions to %s", len(seen), path)

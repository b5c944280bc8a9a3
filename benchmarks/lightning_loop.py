"""The third side of the inference comparison: Lightning's evaluation loop and nothing of the template's.

A LightningModule whose steps are the plain loop's (:func:`benchmarks.plain.plain_infer`: the forward
pass, then the loss summed and the hits counted on the device, or the predicted classes kept), run by a
``Trainer`` with no logger, callbacks, progress bar or model summary. Its batches are made as the
template's on-device path makes them: slices of the in-memory test images
(:class:`~project.toolkit.data.samplers.SliceBatches`, which Lightning iterates as a loader), resized and
normalised after the transfer. It is stamped by the template's own observer,
:class:`~project.toolkit.measure.stamps.StepStamps`.

So what separates it from the plain loop is Lightning's loop alone -- hook dispatch, progress tracking,
the step's context managers, the batch transfer -- which no option of the template removes; what separates
the template from it is the template's own work per batch: its callbacks, metrics, logging, data module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.nn import functional as F

from benchmarks._common import Setup
from benchmarks.plain import InMemory, as_input, build_net, splits
from project.toolkit.data.augmentation import rows_of, to_model_input
from project.toolkit.data.samplers import SliceBatches
from project.toolkit.measure.stamps import StepStamps


class PlainSteps(LightningModule):
    """The plain loop's evaluation steps on ``split``, whose batches arrive as slices of its images."""

    def __init__(self, setup: Setup, split: InMemory, device: torch.device) -> None:
        super().__init__()
        self.setup_, self.split = setup, split
        self.net = build_net(setup, device)
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), dtype=torch.long, device=device)

    def on_after_batch_transfer(self, batch: slice, dataloader_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        split = self.split
        images = to_model_input(rows_of(split.images, batch), self.setup_.image_size, split.mean, split.std)
        return as_input(images, self.setup_), split.labels[batch]

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self.net(images)
        self.loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        self.correct += (logits.argmax(1) == labels).sum()

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).argmax(1)


def lightning_infer(setup: Setup, batch_size: int, predict: bool, folder: Path) -> dict[str, Any]:
    """``test`` (or ``predict``) of :class:`PlainSteps` on ``setup``'s test images in batches of
    ``batch_size``, on the device the plain loop takes; returns the stamps, in the layout of the plain
    loop's, under ``"clock"``."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seed_everything(setup.seed, verbose=False)
    split = splits(setup, device, "test", batch_size)["test"]
    batches = SliceBatches(len(split), batch_size, num_replicas=1, rank=0)
    stamps = folder / "clock.json"
    limit = setup.test_batches if setup.test_batches is not None else 1.0
    trainer = Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision=setup.precision,
        logger=False,
        callbacks=[StepStamps(str(stamps))],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_test_batches=limit,
        limit_predict_batches=limit,
        default_root_dir=folder,
    )
    module = PlainSteps(setup, split, device)
    if predict:
        trainer.predict(module, batches)
    else:
        trainer.test(module, batches, verbose=False)
    return {"clock": json.loads(stamps.read_text())}

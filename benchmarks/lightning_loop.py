"""The third side of the comparisons: Lightning's loops and nothing of the template's.

LightningModules whose steps are the plain loop's, run by a ``Trainer`` with no logger, callbacks,
progress bar or model summary, and stamped by the template's own observer,
:class:`~benchmarks.stamps.StepStamps`:

- :func:`lightning_fit`: :func:`benchmarks.plain.plain_fit`'s training step -- each batch indexed out of
  the in-memory images and augmented after the transfer, with the same kind of draws, then forward,
  cross-entropy, the loss and hits summed on the device -- and its optimizer and schedule, under
  Lightning's automatic optimisation. No validation and no checkpoint: those fall between epochs, which
  no step cycle spans;
- :func:`lightning_infer`: :func:`benchmarks.plain.plain_infer`'s evaluation step (the forward pass, then
  the loss summed and the hits counted, or the predicted classes kept), its batches made as the
  template's on-device path makes them: slices of the test images
  (:class:`~project.toolkit.data.samplers.SliceBatches`, which Lightning iterates as a loader), resized
  and normalised after the transfer.

So what separates this side from the plain loop is Lightning's loop alone -- hook dispatch, progress
tracking, the optimizer closure, the step's context managers, the batch transfer -- which no option of the
template removes; what separates the template from it is the template's own work per step: its callbacks,
metrics, logging, data module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.nn import functional as F

from benchmarks._common import Setup
from benchmarks.plain import InMemory, build_net, device_of_plain_loops, epoch_draws, sgd, splits, training_steps
from benchmarks.stamps import StepStamps
from project.toolkit.data.samplers import SliceBatches
from project.toolkit.training import WarmupCosine


def bare_trainer(setup: Setup, folder: Path, observers: tuple[Callback, ...] = (), **options: Any) -> Trainer:
    """A Trainer with nothing but Lightning's loop: no logger, callbacks but the stamps (to
    ``folder/clock.json``) and ``observers`` after them, progress bar or model summary; on the plain loop's
    device."""
    return Trainer(
        accelerator="gpu" if device_of_plain_loops().type == "cuda" else "cpu",
        devices=1,
        precision=setup.precision,
        logger=False,
        callbacks=[StepStamps(str(folder / "clock.json")), *observers],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
        **options,
    )


class PlainTraining(LightningModule):
    """The plain loop's training on ``split``: a batch is the number of a step in the epoch's order."""

    def __init__(self, setup: Setup, split: InMemory, steps: int, device: torch.device) -> None:
        super().__init__()
        self.setup_, self.split, self.steps = setup, split, steps
        self.net = build_net(setup, device)
        self.draws = torch.Generator(device).manual_seed(setup.seed)  # order, crops and flips, as the plain loop's
        self.order = self.crops = torch.zeros(0, dtype=torch.long)
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), dtype=torch.long, device=device)

    def on_train_epoch_start(self) -> None:
        self.order, self.crops = epoch_draws(len(self.split), self.draws, self.split.images.device)

    def on_after_batch_transfer(self, step: int, dataloader_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.setup_.batch_size
        return self.split.training_batch(self.order[step * size : (step + 1) * size], self.crops, self.setup_)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        logits = self.net(images)
        loss = F.cross_entropy(logits, labels)
        self.loss_sum += loss.detach() * len(labels)
        self.correct += (logits.argmax(1) == labels).sum()
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        setup = self.setup_
        optimizer = sgd(self.parameters(), setup, self.split.images.device)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(self.steps, self.steps * setup.epochs))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def lightning_fit(setup: Setup, folder: Path) -> dict[str, Any]:
    """Train :class:`PlainTraining` on ``setup`` for its epochs, on the plain loop's device; returns, as
    :func:`benchmarks.plain.plain_fit` does, the stamps under ``"clock"`` and the epochs' seconds and images."""
    device = device_of_plain_loops()
    seed_everything(setup.seed, verbose=False)
    train = splits(setup, device, "fit")["train"]
    steps = training_steps(setup, len(train))
    module = PlainTraining(setup, train, steps, device)
    trainer = bare_trainer(setup, folder, max_epochs=setup.epochs, num_sanity_val_steps=0)
    trainer.fit(module, list(range(steps)))  # Lightning iterates any sized iterable as a loader
    clock = json.loads((folder / "clock.json").read_text())
    # as the plain loop reports them: an epoch from its start to its last step
    spans = zip(clock["epoch_starts"], clock["train_batch_ends"], strict=True)
    epochs = [{"seconds": ends[-1] - start, "samples": len(ends) * setup.batch_size} for start, ends in spans]
    return {"epochs": epochs, "clock": clock}


class PlainEvaluation(LightningModule):
    """The plain loop's evaluation steps on ``split``, whose batches arrive as slices of its images."""

    def __init__(self, setup: Setup, split: InMemory, device: torch.device) -> None:
        super().__init__()
        self.setup_, self.split = setup, split
        self.net = build_net(setup, device)
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), dtype=torch.long, device=device)

    def on_after_batch_transfer(self, batch: slice, dataloader_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split.evaluation_batch(batch, self.setup_)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self.net(images)
        self.loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        self.correct += (logits.argmax(1) == labels).sum()

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).argmax(1)


def lightning_infer(
    setup: Setup, batch_size: int, predict: bool, folder: Path, observers: tuple[Callback, ...] = ()
) -> dict[str, Any]:
    """``test`` (or ``predict``) of :class:`PlainEvaluation` on ``setup``'s test images in batches of
    ``batch_size``, on the device the plain loop takes, with the callbacks ``observers`` after the stamps;
    returns the stamps, in the layout of the plain loop's, under ``"clock"``."""
    device = device_of_plain_loops()
    seed_everything(setup.seed, verbose=False)
    split = splits(setup, device, "test", batch_size)["test"]
    batches = SliceBatches(len(split), batch_size, num_replicas=1, rank=0)
    limit = setup.test_batches if setup.test_batches is not None else 1.0
    trainer = bare_trainer(setup, folder, observers, limit_test_batches=limit, limit_predict_batches=limit)
    module = PlainEvaluation(setup, split, device)
    if predict:
        trainer.predict(module, batches)
    else:
        trainer.test(module, batches, verbose=False)
    return {"clock": json.loads((folder / "clock.json").read_text())}

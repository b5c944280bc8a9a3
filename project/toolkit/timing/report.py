"""What the timing callback reports besides its records: the run's description, the network's counts, scalars,
``timing.json``, the estimate a long CPU fit starts with."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities.data import extract_batch_size
from torch import nn

from project.toolkit.interfaces import data_settings, image_channels, image_data

# A network's counts (FLOPs, sizes) by counter, structure and input: a process counts each network once.
COUNTED: dict[tuple, Any] = {}


def counted(trainer: Trainer, pl_module: LightningModule, count: Callable[..., dict[str, Any]], **extra: Any) -> Any:
    """``count(net, image_size=..., channels_last=..., in_channels=..., **extra)`` of ``pl_module.net`` as the data
    feeds it, on rank 0 (which reports it); None without a ``net`` or an ``image_size``."""
    net = getattr(pl_module, "net", None)
    image_size = data_settings(trainer).get("image_size")
    if not trainer.is_global_zero or not isinstance(net, nn.Module) or not image_size:
        return None
    channels_last = bool(pl_module.hparams.get("channels_last"))
    feed = {"image_size": image_size, "channels_last": channels_last, "in_channels": image_channels(trainer)}
    shapes = tuple((name, tuple(p.shape)) for name, p in net.named_parameters())
    key = (count.__name__, type(net).__qualname__, shapes, *feed.values())
    if key not in COUNTED:
        COUNTED[key] = count(net, **feed, **extra)
    return COUNTED[key]


def all_gather(strategy: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """Every rank's tensor, stacked: torch.distributed's collective where a process group runs (Lightning's
    all_gather goes through a deprecated autograd one that warns on every run), else the strategy's."""

    def gather(tensor: torch.Tensor) -> torch.Tensor:
        if not (dist.is_available() and dist.is_initialized()) or strategy.root_device.type == "xla":
            return strategy.all_gather(tensor)
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    return gather


def log_scalars(trainer: Trainer, metrics: dict[str, float | None], step: int) -> None:
    """Straight to the loggers: ``self.log`` is not allowed in the end hooks, and would average over ranks."""
    present = {k: v for k, v in metrics.items() if v is not None and not math.isnan(v)}
    for logger in trainer.loggers:
        logger.log_metrics(present, step=step)


def epoch_end_step(trainer: Trainer) -> int:
    """The step Lightning logs an epoch's ``train/acc`` and ``val/acc`` at: time and memory share their axis."""
    return max(trainer.global_step - 1, 0)


def run_description(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    """What was run: the settings a reader needs to compare two ``timing.json`` files."""
    datamodule_hparams = data_settings(trainer)
    data = image_data(trainer)
    path = data.input_path if data is not None else None  # the input path the data module took, its workers, why
    inputs = dict(input_path=path.name, num_workers=path.num_workers, input_path_reason=path.reason) if path else {}
    used = {"strategy": trainer.strategy, "accelerator": trainer.accelerator}
    return {  # DDPStrategy -> ddp, CUDAAccelerator -> cuda; a registered name where the class has one
        **{
            k: getattr(type(o), "strategy_name", None) or type(o).__name__.removesuffix(k.title()).lower()
            for k, o in used.items()
        },
        "devices": trainer.num_devices,
        "num_nodes": trainer.num_nodes,
        "world_size": trainer.world_size,
        "arch": pl_module.hparams.get("arch"),
        "compile_mode": pl_module.hparams.get("compile_mode", "default") if pl_module.hparams.get("compile") else None,
        "image_size": datamodule_hparams.get("image_size"),
        "batch_size": datamodule_hparams.get("batch_size"),  # global: the data module splits it across ranks
        "precision": str(trainer.precision),
        **inputs,
    }


def update_timing_json(path: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Merge ``report`` into the JSON file at ``path`` (fit and test each add their keys), atomically."""
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged.update(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(merged, indent=2) + "\n")
    os.replace(temporary, path)
    return merged


def batch_size_of(batch: Any) -> int:
    """Samples in ``batch``: its first tensor's length (a data set's ``(images, labels)``), else Lightning's rule.

    >>> batch_size_of((torch.zeros(5, 3), torch.zeros(5))), batch_size_of({"x": torch.zeros(2, 4)})
    (5, 2)
    """
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else None
    return first.shape[0] if isinstance(first, torch.Tensor) and first.ndim else extract_batch_size(batch)


SMALL_IMAGE_SIZE = 32  # CIFAR-10's own size: the cheapest --data.image_size that loses no detail
# Evaluating a batch is a forward pass only, about a third of a training step's forward + backward.
EVALUATION_SHARE_OF_A_STEP = 1 / 3


def format_duration(seconds: float) -> str:
    """``5400`` -> ``'1 h 30 min'``, ``150`` -> ``'3 min'``, ``20`` -> ``'20 s'``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds / 60 + 0.5)  # half up: round() rounds 2.5 to 2
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def estimate_line(trainer: Trainer, seconds_per_step: float, min_minutes: float) -> str | None:
    """The line a CPU fit starts with when it will take ``min_minutes`` or more (:class:`TimingCallback`); else None."""
    total_steps = trainer.estimated_stepping_batches
    if not math.isfinite(total_steps) or total_steps <= 0:
        return None
    steps_per_epoch = max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))
    epochs = math.ceil(total_steps / steps_per_epoch)
    validation_batches = sum(trainer.num_val_batches) if trainer.enable_validation else 0
    seconds = seconds_per_step * (total_steps + epochs * validation_batches * EVALUATION_SHARE_OF_A_STEP)
    if seconds < 60 * min_minutes:
        return None
    faster = []
    image_size = data_settings(trainer).get("image_size")
    if image_size and image_size > SMALL_IMAGE_SIZE:
        fewer = (image_size / SMALL_IMAGE_SIZE) ** 2
        faster.append(f"--data.image_size={SMALL_IMAGE_SIZE} ({fewer:.0f}x fewer pixels per image)")
    faster.append("a GPU (--trainer.accelerator=gpu)")
    return (
        f"This fit will take about {format_duration(seconds)} on this CPU ({seconds_per_step:.2f} s per step, "
        f"{total_steps} steps in {epochs} epoch(s), with validation); faster: {' or '.join(faster)}"
    )

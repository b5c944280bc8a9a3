"""What the timing callback reports besides its records: run description, network counts, scalars, ``timing.json``."""

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

from project.toolkit.data.datamodule import data_settings, image_channels
from project.toolkit.measure.devices import tensor_bytes

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


def optimizer_state_bytes(trainer: Trainer) -> int:
    """Bytes of this rank's optimizer state (momentum, Adam's moments, ...), at the fit's end."""
    return sum(tensor_bytes(optimizer.state) for optimizer in trainer.optimizers)


def sample_copies(trainer: Trainer) -> int:
    """How many ranks see each sample: 1, or every stage of a pipeline (which then counts it once)."""
    return getattr(trainer.strategy, "sample_copies", 1)


def gather_bubble(trainer: Trainer, scope: str) -> list[float] | None:
    """Every rank's pipeline bubble over the epoch or the fit; None for a strategy without one. A collective."""
    measure = getattr(trainer.strategy, "bubble_fraction", None)
    if measure is None:
        return None
    value = measure(scope)
    local = torch.tensor([math.nan if value is None else value], device=trainer.strategy.root_device)
    return [float(v) for v in all_gather(trainer.strategy)(local).reshape(-1).cpu()]


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


def _short_name(obj: object, suffix: str) -> str:
    """``DDPStrategy`` -> ``ddp``, ``CUDAAccelerator`` -> ``cuda``; a registered name if the class has one."""
    registered = getattr(type(obj), "strategy_name", None)
    return registered or type(obj).__name__.removesuffix(suffix).lower()


def run_description(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    """What was run: the settings a reader needs to compare two ``timing.json`` files."""
    datamodule_hparams = data_settings(trainer)
    path = getattr(trainer.datamodule, "input_path", None)  # the input path the data module took, its workers, why
    inputs = dict(input_path=path.name, num_workers=path.num_workers, input_path_reason=path.reason) if path else {}
    return {
        "strategy": _short_name(trainer.strategy, "Strategy"),
        "accelerator": _short_name(trainer.accelerator, "Accelerator"),
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

"""How long each declared block takes, forward and backward, at the run's batch and a pipeline's micro-batch size:
:class:`BlockTimes` times them once after a single-device fit, on random images, the network's buffers, gradients and
generators put back, and writes ``block_times.json`` into the run folder, where ``python -m project plan`` reads it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn

from project.toolkit.blocks import checked_blocks_or_none
from project.toolkit.log import get_logger
from project.toolkit.timing.clocks import SyncingClock, synchronizer
from project.tools.plan.inputs import BLOCK_TIMES

MICRO_BATCHES = 4  # the pipeline strategy's default micro-batches: the second size measured is batch / 4
Like = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]  # a batch's images: shape, strides, dtype
Prepare = Callable[[torch.Tensor], torch.Tensor]  # what puts images in the network's form

log = get_logger(__name__)


class BlockTimes(Callback):
    """``--trainer.callbacks+=project.tools.plan.block_times.BlockTimes`` on a single-device fit (CPU or CUDA): after
    it, rank 0 writes :func:`block_seconds` of the network's declared blocks to ``block_times.json`` in the run folder.
    Elsewhere, or for a network that declares no blocks, it says so and writes nothing."""

    def __init__(self) -> None:
        self.like: Like | None = None  # the first training batch's images
        self.times: dict[str, Any] | None = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.like is None:
            self.like = images_like(batch)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_dir = trainer.log_dir  # every rank must ask: Lightning broadcasts it from rank 0
        if not trainer.is_global_zero or log_dir is None:
            return
        self.times = probe_after_fit(trainer, pl_module, self.like)
        if self.times is None:
            log.warning(
                "BlockTimes: no %s written (a single-device CPU or CUDA fit of declared blocks only)", BLOCK_TIMES
            )
            return
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        (Path(log_dir) / BLOCK_TIMES).write_text(json.dumps(self.times, indent=2) + "\n")


def images_like(batch: Any) -> Like | None:
    """The shape, strides and dtype of a training batch's images (``batch[0]``), so that no batch is kept alive."""
    images = batch[0] if isinstance(batch, list | tuple) and batch else None
    return (tuple(images.shape), images.stride(), images.dtype) if isinstance(images, torch.Tensor) else None


def probe_after_fit(trainer: Trainer, pl_module: LightningModule, like: Like | None) -> dict[str, Any] | None:
    """:func:`block_seconds` of the declared blocks after a single-device fit on a CPU or CUDA GPU; None elsewhere, or
    without blocks or a batch."""
    device = trainer.strategy.root_device
    if not (isinstance(trainer.strategy, SingleDeviceStrategy) and device.type in ("cpu", "cuda") and like):
        return None
    blocks = checked_blocks_or_none(pl_module)
    if not blocks:
        return None
    shape, stride, dtype = like
    prepare = getattr(pl_module, "prepare_images", lambda x: x)
    # on_fit_end runs after the strategy's teardown has moved the module back to the CPU: take it to the device
    home = next(pl_module.parameters(), torch.empty(0)).device
    pl_module.to(device)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.enable_grad():
            images = torch.empty_strided(shape, stride, dtype=dtype, device=device).normal_()
            modules = [block.module for block in blocks]
            return block_seconds(modules, images, prepare, SyncingClock(synchronizer(device)).mark)
    finally:
        pl_module.to(home)


def block_seconds(
    blocks: Sequence[nn.Module], images: torch.Tensor, prepare: Prepare, clock: Callable[[], float]
) -> dict[str, Any]:
    """``batch_sizes`` ``[B, B // MICRO_BATCHES]`` (the second if 2 or more) and per size the ``forward`` and
    ``backward`` seconds of every block, the fastest of 2; ``clock()`` waits for the device."""
    sizes = [len(images)] + ([len(images) // MICRO_BATCHES] if len(images) // MICRO_BATCHES >= 2 else [])
    parameters = [p for block in blocks for p in block.parameters()]
    buffers = [b for block in blocks for b in block.buffers()]
    kept_buffers = [b.detach().clone() for b in buffers]
    kept_grads = [p.grad for p in parameters]
    result: dict[str, Any] = {"batch_sizes": sizes, "forward": [], "backward": []}
    try:
        with torch.random.fork_rng(devices=[images.device] if images.device.type == "cuda" else []):
            for size in sizes:
                runs = [_one_pass(blocks, images[:size], prepare, clock) for _ in range(2)]
                result["forward"].append([min(run[0][i] for run in runs) for i in range(len(blocks))])
                result["backward"].append([min(run[1][i] for run in runs) for i in range(len(blocks))])
    finally:
        with torch.no_grad():
            for buffer, kept in zip(buffers, kept_buffers, strict=True):
                buffer.copy_(kept)
        for parameter, grad in zip(parameters, kept_grads, strict=True):
            parameter.grad = grad
    return result


def _one_pass(
    blocks: Sequence[nn.Module], images: torch.Tensor, prepare: Prepare, clock: Callable
) -> tuple[list[float], list[float]]:
    for parameter in (p for block in blocks for p in block.parameters()):  # from none, not the run's
        parameter.grad = None
    x = prepare(images.detach()).requires_grad_(True)  # so the first block's backward has an end to stamp
    reached: list[float] = [0.0] * len(blocks)  # when the gradient reached block i's input
    forward = []
    start = clock()
    for i, block in enumerate(blocks):
        x.register_hook(lambda grad, i=i: reached.__setitem__(i, clock()))
        x = block(x)
        forward.append((end := clock()) - start)
        start = end
    begin = clock()
    x.float().sum().backward()
    clock()  # the last hook has run; the device has finished
    ends = [begin, *reversed(reached)]  # the backward runs the blocks last to first
    backward = [b - a for a, b in zip(ends, ends[1:], strict=False)][::-1]
    return forward, backward

"""How long each declared block of a network takes, forward and backward, at the run's batch size and at a
pipeline's micro-batch size: what ``python -m project plan`` needs to predict a pipeline, whose stages are
balanced by FLOPs but take the time their blocks take (on a CPU the late, small-image blocks of a ResNet run
far below the FLOP rate of the early ones, and a micro-batch runs slower per image than the whole batch).

Measured once, after a single-device fit (the timing callback's ``on_fit_end``; ``--timing.block_times``),
so no training step is touched: each size runs forward and backward ``repeats`` times on random images of
the batch's shape, block after block, with a wait for the device and a clock reading at every block boundary
(forward: around each block; backward: when the gradient reaches each block's input, by a hook on it). The
fastest repeat counts. The network's state is left as it was: its buffers (BatchNorm's running statistics),
its gradients and the random generators are put back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn

from project.toolkit.measure.devices import SyncingClock, synchronizer

MICRO_BATCHES = 4  # the pipeline strategy's default micro-batches: the second size measured is batch / 4


def images_like(batch: Any) -> tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None:
    """The shape, strides and dtype of a training batch's images (``batch[0]``): what the probe's random
    images copy, so that no batch is kept alive for it."""
    images = batch[0] if isinstance(batch, list | tuple) and batch else None
    return (tuple(images.shape), images.stride(), images.dtype) if isinstance(images, torch.Tensor) else None


def probe_after_fit(
    trainer: Trainer,
    pl_module: LightningModule,
    blocks: Sequence[nn.Module],
    like: tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None,
) -> dict[str, Any] | None:
    """:func:`block_seconds` of the ``blocks`` of a finished single-device fit on a CPU or a CUDA GPU, with
    random images ``like`` its batches (:func:`images_like`); None where that does not apply: several
    processes or devices, another accelerator, or no batch seen."""
    device = trainer.strategy.root_device
    if not (isinstance(trainer.strategy, SingleDeviceStrategy) and device.type in ("cpu", "cuda") and like):
        return None
    shape, stride, dtype = like
    prepare = getattr(pl_module, "prepare_images", lambda x: x)
    # on_fit_end runs after the strategy's teardown, which has moved the module back to the CPU (a GPU
    # fit's blocks then met CUDA images with CPU weights): the probe takes it to the fit's device and back.
    home = next(pl_module.parameters(), torch.empty(0)).device
    pl_module.to(device)
    # The random images are drawn from generators put back after: the run's draws stay as they were.
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.enable_grad():
            images = torch.empty_strided(shape, stride, dtype=dtype, device=device).normal_()
            clock = SyncingClock(synchronizer(device)).mark
            return block_seconds(blocks, images, prepare, clock)
    finally:
        pl_module.to(home)


def block_seconds(
    blocks: Sequence[nn.Module],
    images: torch.Tensor,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    clock: Callable[[], float],
    micro_batches: int = MICRO_BATCHES,
    repeats: int = 2,
) -> dict[str, Any]:
    """``batch_sizes`` ``[B, B // micro_batches]`` (``images`` holds B; the second only where it is 2 or more,
    which BatchNorm needs) and, per size, ``forward`` and ``backward`` seconds of every block (in order), the
    fastest of ``repeats``; ``clock()`` returns seconds after waiting for the device.

    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> times = block_seconds(list(net), torch.randn(8, 4), lambda x: x, clock=__import__("time").perf_counter)
    >>> times["batch_sizes"], [len(t) for t in times["forward"]], all(t > 0 for t in times["backward"][0])
    ([8, 2], [3, 3], True)
    """
    sizes = [len(images)] + ([len(images) // micro_batches] if len(images) // micro_batches >= 2 else [])
    parameters = [p for block in blocks for p in block.parameters()]
    buffers = [b for block in blocks for b in block.buffers()]
    kept_buffers = [b.detach().clone() for b in buffers]
    kept_grads = [p.grad for p in parameters]
    for parameter in parameters:  # or the probe's backward would add to the run's gradients, in place
        parameter.grad = None
    devices = [images.device] if images.device.type == "cuda" else []
    result: dict[str, Any] = {"batch_sizes": sizes, "forward": [], "backward": []}
    try:
        with torch.random.fork_rng(devices=devices):
            for size in sizes:
                runs = [_one_pass(blocks, images[:size], prepare, clock) for _ in range(repeats)]
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
    blocks: Sequence[nn.Module], images: torch.Tensor, prepare: Callable[[torch.Tensor], torch.Tensor], clock: Callable
) -> tuple[list[float], list[float]]:
    """One forward and backward, block by block: (forward seconds, backward seconds) per block."""
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
    for block in blocks:  # this pass's gradients go: the next starts from none, as the first did
        for parameter in block.parameters():
            parameter.grad = None
    return forward, backward

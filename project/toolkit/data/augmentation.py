"""The CIFAR-style augmentation as pure functions of (seed, epoch, image index), batched, on any device.

The standard CIFAR augmentation is a random 32 px crop of the image padded by 4 px of zeros, then
a horizontal flip half of the time. Here the randomness is drawn up front: one table per
``(seed, epoch)`` gives every training image its crop offset and flip
(:func:`draw_crops_and_flips`), and :func:`crop_and_flip` applies given parameters. So an image's
augmentation depends on nothing else -- not on which DataLoader worker loads it, nor in what order,
nor on whether a resumed run skipped the batches before it -- and a batch of images can be
augmented at once on the accelerator (``--data.on_device=true``) with the same result as one
image at a time in a worker. Normalisation uses the data set's own per-channel statistics
(:mod:`.statistics`), for 1 or 3 channels.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

PADDING = 4  # px of zeros around the image before cropping: offsets 0..8 on each axis


@functools.lru_cache(maxsize=2)
def draw_crops_and_flips(seed: int, epoch: int, count: int, padding: int = PADDING) -> np.ndarray:
    """The augmentation of every one of ``count`` training images in one epoch: row ``i`` is
    ``(dy, dx, flip)`` for image ``i``, with the crop offsets ``dy, dx`` uniform in
    ``0..2 * padding`` and ``flip`` 0 or 1, all independent (the distribution of torchvision's
    ``RandomCrop(padding=4)`` followed by ``RandomHorizontalFlip()``).

    Cached (45,000 images make a 1 MB table): every image of an epoch reads the same table.

    >>> table = draw_crops_and_flips(seed=0, epoch=3, count=5)
    >>> table.shape, table.dtype.name, bool((table == draw_crops_and_flips(0, 3, 5)).all())
    ((5, 3), 'int64', True)
    """
    rng = np.random.default_rng([seed, epoch])
    table = rng.integers(0, [2 * padding + 1, 2 * padding + 1, 2], size=(count, 3), dtype=np.int64)
    table.flags.writeable = False  # shared by every caller through the cache
    return table


def rows_of(images: torch.Tensor, index: torch.Tensor | slice) -> torch.Tensor:
    """The images at ``index`` (a tensor of indices, or a slice) of uint8 ``(N, H, W, C)`` ``images`` (as
    a data set's arrays come), as an ``(n, C, H, W)`` batch in channels_last memory order -- the order
    the networks run in, and in which torchvision resizes uint8 images about four times faster. A slice
    is a view, no copy; for indices, ``index_select`` copies whole rows: on a CPU it is some twenty times
    faster than indexing with a tensor (``images[index]``).

    >>> batch = rows_of(torch.zeros(5, 4, 4, 3, dtype=torch.uint8), torch.tensor([4, 0]))
    >>> tuple(batch.shape), batch.is_contiguous(memory_format=torch.channels_last)
    ((2, 3, 4, 4), True)
    """
    rows = images[index] if isinstance(index, slice) else images.index_select(0, index)
    return rows.permute(0, 3, 1, 2)


def crop_and_flip(images: torch.Tensor, params: torch.Tensor, padding: int = PADDING) -> torch.Tensor:
    """Crop each of ``images`` (uint8 ``(N, C, H, W)``), padded by ``padding`` px of zeros, to
    ``H x W`` at offset ``params[n, :2]`` (``dy, dx``), and flip it horizontally where
    ``params[n, 2]`` is 1. One gather for the whole batch, on the images' device, over their pixels
    in ``(H, W, C)`` memory order: the result is channels_last, like :func:`rows_of`'s batches (a gather
    of whole pixels costs a third of one indexing every value by batch, channel, row and column).

    >>> image = torch.arange(1, 10, dtype=torch.uint8).reshape(1, 1, 3, 3)
    >>> crop_and_flip(image, torch.tensor([[0, 0, 0]]), padding=1)[0, 0].tolist()  # shifted down-right
    [[0, 0, 0], [0, 1, 2], [0, 4, 5]]
    >>> crop_and_flip(image, torch.tensor([[1, 1, 1]]), padding=1)[0, 0].tolist()  # centred, flipped
    [[3, 2, 1], [6, 5, 4], [9, 8, 7]]
    """
    count, channels, height, width = images.shape
    device = images.device
    params = params.to(device)
    pixels = images.permute(0, 2, 3, 1)  # (N, H, W, C): a view of channels_last images
    padded = torch.nn.functional.pad(pixels, (0, 0, padding, padding, padding, padding))
    padded_width = width + 2 * padding
    rows = params[:, 0:1] + torch.arange(height, device=device)  # (N, H)
    cols = params[:, 1:2] + torch.arange(width, device=device)  # (N, W)
    cols = torch.where(params[:, 2:3].bool(), cols.flip(1), cols)
    where = (rows[:, :, None] * padded_width + cols[:, None, :]).reshape(count, height * width, 1)
    picked = padded.reshape(count, -1, channels).gather(1, where.expand(-1, -1, channels))
    return picked.reshape(count, height, width, channels).permute(0, 3, 1, 2)


def to_model_input(images: torch.Tensor, image_size: int, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 images ``(..., C, H, W)`` as the network takes them: resized (antialiased) to
    ``image_size`` square, scaled to 0..1 and normalised with the data set's per-channel ``mean`` and
    ``std`` (0-1 scale, C values each). The same steps as ``v2.Compose([v2.Resize(image_size),
    v2.ToDtype(float32, scale=True), v2.Normalize(mean, std)])`` (equal within float rounding,
    about 5e-7), for one image or a batch; the result is in channels_last memory order.

    It works on the pixels in ``(H, W, C)`` memory order, as the arrays come (:func:`rows_of`):
    torchvision resizes uint8 images about four times faster so, and the scaling and normalisation are
    one multiply and one add by tables of the image's own shape -- on a CPU a tenth of the time of
    normalising by a per-channel mean and std, which no vector unit runs well when channels are innermost.

    >>> to_model_input(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), 112, (0.5,) * 3, (0.25,) * 3).shape
    torch.Size([2, 3, 112, 112])
    >>> to_model_input(torch.full((1, 1, 8, 8), 255, dtype=torch.uint8), 4, [0.5], [0.25]).unique().tolist()
    [2.0]
    """
    if images.shape[-2:] != (image_size, image_size):
        images = F.resize(images, [image_size, image_size], antialias=True)
    pixels = images.movedim(-3, -1).to(torch.float32, memory_format=torch.contiguous_format)  # (..., H, W, C)
    scale, shift = _normalisation(tuple(pixels.shape[-3:]), tuple(mean), tuple(std), pixels.device)
    return pixels.mul_(scale).add_(shift).movedim(-1, -3)


@functools.lru_cache(maxsize=8)
def _normalisation(
    shape: tuple[int, int, int], mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x / 255 - mean) / std`` as ``x * scale + shift``, with ``scale`` and ``shift`` spelled out
    for every value of an ``(H, W, C)`` image on ``device``: elementwise operations on equal shapes
    vectorise, a broadcast over 1-3 innermost channels does not."""
    scale = torch.tensor([1 / (255 * s) for s in std], dtype=torch.float32)
    shift = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)], dtype=torch.float32)
    return tuple(t.expand(shape).contiguous().to(device) for t in (scale, shift))  # type: ignore[return-value]


def augment(
    images: torch.Tensor, params: torch.Tensor, image_size: int, mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """Training images ready for the network: :func:`crop_and_flip` at the native size (the same
    distribution as augmenting after the upscale, at a fraction of the cost), then
    :func:`to_model_input`."""
    return to_model_input(crop_and_flip(images, params), image_size, mean, std)

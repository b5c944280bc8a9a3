"""The training augmentation as pure functions of ``(seed, epoch, image index)``: the same whatever the worker, order
or resume, batched on the device or per image in workers. ``crop_flip`` (the default) is CIFAR's random crop of the
zero-padded image and horizontal flip; ``random_resized_crop`` torchvision's RandomResizedCrop (the fine-tuning
recipe's) and a flip; ``none`` leaves the images as they are; a user's transform and ``random_resized_crop`` run on
each image with torch's generator seeded by the image's key."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

import numpy as np
import torch
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2 import functional as F

from project.toolkit.errors import DataError

PADDING = 4  # px of zeros around the image before cropping: offsets 0..8 on each axis
CROP_FLIP, NO_AUGMENTATION, RANDOM_RESIZED_CROP = "crop_flip", "none", "random_resized_crop"
Augmentation = Union[Literal["crop_flip", "none", "random_resized_crop"], Callable]  # noqa: UP007  (jsonargparse)
Interpolation = Literal["bilinear", "bicubic"]  # of every resize: torchvision's weights ask for one of these


@functools.lru_cache(maxsize=2)
def draw_crops_and_flips(seed: int, epoch: int, count: int, padding: int = PADDING) -> np.ndarray:
    """Row ``i``: ``(dy, dx, flip)`` of training image ``i`` this epoch, distributed as ``RandomCrop(padding=4)``
    then ``RandomHorizontalFlip()``. Cached: every image of an epoch reads the same table."""
    rng = np.random.default_rng([seed, epoch])
    table = rng.integers(0, [2 * padding + 1, 2 * padding + 1, 2], size=(count, 3), dtype=np.int64)
    table.flags.writeable = False  # shared by every caller through the cache
    return table


def rows_of(images: torch.Tensor, index: torch.Tensor | slice) -> torch.Tensor:
    """The ``(N, H, W, C)`` ``images`` at ``index`` as a channels_last ``(n, C, H, W)`` batch (the networks'
    layout). ``index_select`` rather than ``images[index]``: it copies whole rows, much faster on a CPU."""
    rows = images[index] if isinstance(index, slice) else images.index_select(0, index)
    return rows.permute(0, 3, 1, 2)


def crop_and_flip(images: torch.Tensor, params: torch.Tensor, padding: int = PADDING) -> torch.Tensor:
    """Crop each uint8 ``(N, C, H, W)`` image, zero-padded by ``padding``, at offset ``params[n, :2]`` and flip
    it where ``params[n, 2]`` is 1: one gather of whole pixels for the batch; the result is channels_last."""
    count, channels, height, width = images.shape
    device = images.device
    params = params.to(device)
    pixels = images.permute(0, 2, 3, 1)  # (N, H, W, C): a view of channels_last images
    padded = torch.nn.functional.pad(pixels, (0, 0, padding, padding, padding, padding))
    rows = params[:, 0:1] + torch.arange(height, device=device)  # (N, H)
    cols = params[:, 1:2] + torch.arange(width, device=device)  # (N, W)
    cols = torch.where(params[:, 2:3].bool(), cols.flip(1), cols)
    where = (rows[:, :, None] * (width + 2 * padding) + cols[:, None, :]).reshape(count, height * width, 1)
    picked = padded.reshape(count, -1, channels).gather(1, where.expand(-1, -1, channels))
    return picked.reshape(count, height, width, channels).permute(0, 3, 1, 2)


def to_model_input(
    images: torch.Tensor,
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    resize_size: int | None = None,
    interpolation: Interpolation = "bilinear",
) -> torch.Tensor:
    """uint8 ``(..., C, H, W)`` images with their shorter side resized to ``resize_size`` (None: ``image_size``), the
    centre ``image_size`` square cropped, scaled to 0..1 and normalised (as ``v2.Resize``, ``CenterCrop``,
    ``ToDtype``, ``Normalize``), channels_last. On ``(H, W, C)`` pixels: uint8 resizing and multiply-add vectorise."""
    height, width = images.shape[-2:]
    short, side = min(height, width), resize_size or image_size
    if short != side:  # integer sizes, as export's graph computes them
        sides = [side * height // short, side * width // short]
        images = F.resize(images, sides, interpolation=InterpolationMode(interpolation), antialias=True)
    if images.shape[-2:] != (image_size, image_size):
        images = F.center_crop(images, [image_size, image_size])
    pixels = images.movedim(-3, -1).to(torch.float32, memory_format=torch.contiguous_format)  # (..., H, W, C)
    scale, shift = _normalisation(tuple(pixels.shape[-3:]), tuple(mean), tuple(std), pixels.device)
    return pixels.mul_(scale).add_(shift).movedim(-1, -3)


@functools.lru_cache(maxsize=8)
def _normalisation(
    shape: tuple[int, int, int], mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x / 255 - mean) / std`` as ``x * scale + shift``, the tables spelled out for a whole ``(H, W, C)`` image."""
    scale = torch.tensor([1 / (255 * s) for s in std], dtype=torch.float32)
    shift = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)], dtype=torch.float32)
    return tuple(t.expand(shape).contiguous().to(device) for t in (scale, shift))  # type: ignore[return-value]


def image_seeds(seed: int, epoch: int, indices: Sequence[int]) -> list[int]:
    """The seed of each training image of ``indices`` in ``epoch`` of a run seeded ``seed`` (a user's transform)."""
    return [hash((seed, epoch, int(index))) for index in indices]


def transform_each(transform: Callable, images: torch.Tensor, seeds: Sequence[int], image_size: int) -> torch.Tensor:
    """Each uint8 ``(C, H, W)`` image of ``images`` through ``transform``, torch's CPU generator seeded by its seed
    (the caller's generator left as it was); results of different sizes are resized to ``image_size``."""
    with torch.random.fork_rng(devices=[]):
        results = []
        for image, seed in zip(images, seeds, strict=True):
            torch.random.default_generator.manual_seed(seed)
            results.append(transform(image))
    if len({result.shape for result in results}) > 1:
        results = [F.resize(result, [image_size, image_size], antialias=True) for result in results]
    return torch.stack(results)


def check_augmentation(augmentation: Augmentation) -> None:
    """Refuse, in one line, an augmentation that is neither one of the named ones nor a callable."""
    named = (CROP_FLIP, NO_AUGMENTATION, RANDOM_RESIZED_CROP)
    if not (callable(augmentation) or isinstance(augmentation, str) and augmentation in named):
        raise DataError(
            f"data.augmentation={augmentation!r} is not allowed: use crop_flip, random_resized_crop, none, or a "
            "transform (a callable's import path)"
        )


def batch_mixing(kind: str, num_classes: int, mixup_alpha: float, cutmix_alpha: float) -> Any:
    """``--data.batch_augmentation``'s mixer of the training batches (:mod:`.batch_mixing`, loaded only for one);
    None for ``none``."""
    if kind == "none":
        return None
    from project.toolkit.data.batch_mixing import BatchMixing

    return BatchMixing(kind, num_classes, mixup_alpha, cutmix_alpha)


def check_transform(transform: Callable, image: torch.Tensor) -> None:
    """Refuse, in one line, a transform that does not turn the uint8 ``(C, H, W)`` ``image`` into a uint8 image of as
    many channels."""
    said = f"data.augmentation={getattr(transform, '__qualname__', transform)!r}"
    try:
        result = transform(image)
    except Exception as err:  # the user's code: say which option failed, on what
        raise DataError(f"{said} failed on a uint8 {tuple(image.shape)} image: {type(err).__name__}: {err}") from None
    if not (isinstance(result, torch.Tensor) and result.dtype == torch.uint8 and result.shape[:-2] == image.shape[:-2]):
        found = f"{getattr(result, 'dtype', type(result).__name__)} {tuple(getattr(result, 'shape', ()))}"
        raise DataError(f"{said} must return a uint8 (C, H, W) image as it is given one; it returned {found}")


def augment(
    images: torch.Tensor,
    params: torch.Tensor,
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    augmentation: Augmentation = CROP_FLIP,
    seeds: Sequence[int] = (),
    resize_size: int | None = None,
    interpolation: Interpolation = "bilinear",
) -> torch.Tensor:
    """``images`` augmented at their native size (cheaper than after the upscale), then :func:`to_model_input`:
    :func:`crop_and_flip` by ``params``, none, or a transform seeded per image by ``seeds`` (a user's, or
    ``random_resized_crop``'s), whose images of ``image_size`` are neither resized nor cropped again."""
    if augmentation == RANDOM_RESIZED_CROP:  # ImageNet's recipe: torchvision's scale (0.08, 1), ratio (3/4, 4/3)
        mode = InterpolationMode(interpolation)
        augmentation = v2.Compose([v2.RandomResizedCrop(image_size, interpolation=mode), v2.RandomHorizontalFlip()])
    if not isinstance(augmentation, str):
        images = transform_each(augmentation, images, seeds, image_size)
        resize_size = None if images.shape[-2:] == (image_size, image_size) else resize_size  # the input already
    elif augmentation == CROP_FLIP:
        images = crop_and_flip(images, params)
    return to_model_input(images, image_size, mean, std, resize_size, interpolation)

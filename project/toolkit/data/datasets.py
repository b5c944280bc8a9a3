"""The Datasets of the generic pipeline, all over images held in memory as uint8 ``(N, H, W, C)``.

:class:`ImageArrayDataset` gives evaluation images; :class:`AugmentedImages` gives training images
augmented as a function of ``(seed, epoch, image index)`` (an :class:`~project.toolkit.data.samplers.EpochIndex`
key); :class:`IndexBatches` reads a whole batch at a time. (Under ``--data.on_device=true`` the images wait
on the accelerator and the loaders carry only indices: :mod:`project.toolkit.data.samplers`.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from project.toolkit.data.augmentation import augment, draw_crops_and_flips
from project.toolkit.data.samplers import EpochIndex


class ImageArrayDataset(Dataset):
    """Images held in memory as uint8 ``(N, H, W, C)`` with integer labels; each item is a
    ``(C, H, W)`` tensor passed through ``transform``.

    >>> ds = ImageArrayDataset(np.zeros((2, 32, 32, 3), np.uint8), np.array([3, 7]))
    >>> image, label = ds[1]
    >>> tuple(image.shape), label
    ((3, 32, 32), 7)
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable | None = None) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.from_numpy(self.images[index]).permute(2, 0, 1)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


def crop_and_flip_of(key: EpochIndex, count: int) -> np.ndarray:
    """``(dy, dx, flip)`` of training image ``key`` of ``count`` in the key's epoch and run."""
    if not isinstance(key, EpochIndex):
        raise TypeError(f"training images are drawn by EpochIndex (from a TrainingSampler), not {key!r}")
    return draw_crops_and_flips(key.seed, key.epoch, count)[key]


class AugmentedImages(ImageArrayDataset):
    """The training images, each item ``key`` (an :class:`EpochIndex`) augmented with the crop and
    flip that :func:`~project.toolkit.data.augmentation.draw_crops_and_flips` gives image ``key`` in epoch
    ``key.epoch`` of a run seeded ``key.seed``: the same tensor whichever worker loads it, in
    whatever order, and the same as ``--data.on_device=true`` makes of it. ``mean`` and ``std``: the
    data set's per-channel statistics, which normalise it.

    >>> ds = AugmentedImages(np.zeros((3, 32, 32, 1), np.uint8), np.array([3, 7, 1]), 48, mean=[0.5], std=[0.2])
    >>> image, label = ds[EpochIndex(1, seed=0, epoch=0)]
    >>> tuple(image.shape), label
    ((1, 48, 48), 7)
    """

    def __init__(
        self, images: np.ndarray, labels: np.ndarray, image_size: int, mean: Sequence[float], std: Sequence[float]
    ) -> None:
        super().__init__(images, labels)
        self.image_size, self.mean, self.std = image_size, mean, std

    def __getitem__(self, key: EpochIndex) -> tuple[torch.Tensor, int]:
        params = torch.tensor(crop_and_flip_of(key, len(self)))[None]
        image = torch.from_numpy(self.images[key : key + 1]).permute(0, 3, 1, 2)
        return augment(image, params, self.image_size, self.mean, self.std)[0], int(self.labels[key])


class IndexBatches(Dataset):
    """``dataset`` read a whole batch at a time: item ``[i, j, ...]`` is the collated batch of those
    images, for a DataLoader whose sampler yields lists of indices (``batch_size=None``).

    >>> images, labels = IndexBatches(ImageArrayDataset(np.zeros((3, 32, 32, 3), np.uint8), np.arange(3)))[[0, 2]]
    >>> tuple(images.shape), labels.tolist()
    ((2, 3, 32, 32), [0, 2])
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: list[int]) -> Any:
        return default_collate([self.dataset[i] for i in indices])

"""The Datasets of the DataLoader path, over images held in memory as uint8 ``(N, H, W, C)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from project.toolkit.data.augmentation import CROP_FLIP, Augmentation, augment, draw_crops_and_flips, image_seeds
from project.toolkit.data.samplers import EpochIndex


class ImageArrayDataset(Dataset):
    """uint8 ``(N, H, W, C)`` images with integer labels; an item is a ``(C, H, W)`` tensor through ``transform``."""

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
    """The training images, item ``key`` (an :class:`EpochIndex`) augmented as its epoch and seed say (for
    ``crop_flip``: ``draw_crops_and_flips``): the same tensor in any worker or order, and as ``on_device`` makes it."""

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        image_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        augmentation: Augmentation = CROP_FLIP,
        resize_size: int | None = None,
        interpolation: str = "bilinear",
    ) -> None:
        super().__init__(images, labels)
        self.image_size, self.mean, self.std, self.augmentation = image_size, mean, std, augmentation
        self.resize_size, self.interpolation = resize_size, interpolation

    def __getitem__(self, key: EpochIndex) -> tuple[torch.Tensor, int]:
        params = torch.tensor(crop_and_flip_of(key, len(self)))[None]
        image = torch.from_numpy(self.images[int(key)][None]).permute(0, 3, 1, 2)  # a file's: the whole photo
        seeds = image_seeds(key.seed, key.epoch, [key])
        sizes = self.image_size, self.mean, self.std, self.augmentation, seeds, self.resize_size, self.interpolation
        image = augment(image, params, *sizes)
        return image[0], int(self.labels[key])


class IndexBatches(Dataset):
    """``dataset`` read a batch at a time (item ``[i, j, ...]``), for a DataLoader whose sampler yields lists."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: list[int]) -> Any:
        return default_collate([self.dataset[i] for i in indices])

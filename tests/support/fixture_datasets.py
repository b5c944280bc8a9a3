"""Data sets of the tests' own, outside ``project/``: chosen with ``--data=tests.support.fixture_datasets.<Class>``
as a user chooses theirs. Their arrays are generated (no files, no network), the same on every call
and every process; neither declares normalisation statistics, so both are measured."""

from __future__ import annotations

import numpy as np

from project.data import ImageArrayDataModule

TRAIN_IMAGES, TEST_IMAGES = 60, 24


class GreyBars(ImageArrayDataModule):
    """Three classes of 12 x 12 grey images: a bright bar across the top, middle or bottom third, under
    noise. ``load_split`` gives them as ``(N, H, W)``: a grey set may leave its one channel out."""

    num_classes = 3
    image_shape = (12, 12, 1)

    def load_split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        count = TRAIN_IMAGES if train else TEST_IMAGES
        rng = np.random.default_rng([7, int(train)])
        labels = np.arange(count) % 3
        images = rng.integers(0, 96, (count, 12, 12))
        for label in range(3):
            images[labels == label, 4 * label : 4 * label + 4, :] += 150
        return images.astype(np.uint8), labels


class ColourTiles(ImageArrayDataModule):
    """Ten classes of 8 x 8 colour images, each class a colour of its own under noise."""

    num_classes = 10
    image_shape = (8, 8, 3)

    def load_split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        count = TRAIN_IMAGES if train else TEST_IMAGES
        rng = np.random.default_rng([8, int(train)])
        palette = np.random.default_rng(8).integers(0, 256, (10, 3))
        labels = np.arange(count) % 10
        noise = rng.integers(0, 256, (count, 8, 8, 3))
        return (0.7 * palette[labels][:, None, None, :] + 0.3 * noise).astype(np.uint8), labels

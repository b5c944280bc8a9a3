"""Real images that need no download: scikit-learn's bundled handwritten digits, as a data set of the
template (``--data=benchmarks.digits.DigitsDataModule``), for the learning-parity benchmark
(:mod:`benchmarks.parity`).

1,797 images of 8 x 8 pixels in 17 grey levels (the UCI optical digits), 10 classes. Each is scaled to
0..255, upscaled 4x by repeating pixels to 32 x 32 (the size the CIFAR augmentation's 4 px padding is
made for) and its grey copied into 3 channels. A seeded fifth (360 images) is the test split; the rest
is the training split, from which the template holds out ``val_size`` for validation as for any data set.

Needs scikit-learn (``pip install -e '.[parity]'``); the test suite does not.
"""

from __future__ import annotations

import numpy as np

from project.data import ImageArrayDataModule
from project.toolkit.errors import DataError

UPSCALE = 4  # 8 px -> 32 px
TEST_IMAGES = 360
TEST_SPLIT_SEED = 0  # the test split stays put whatever the run's seeds


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 images as uint8 ``(N, 32, 32, 3)`` and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError(
            "the digits data set needs scikit-learn: pip install -e '.[parity]' (or scikit-learn alone)"
        ) from None
    digits = load_digits()
    grey = np.rint(digits.images * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255
    grey = grey.repeat(UPSCALE, axis=1).repeat(UPSCALE, axis=2)
    return np.ascontiguousarray(np.repeat(grey[..., None], 3, axis=3)), digits.target.astype(np.int64)


class DigitsDataModule(ImageArrayDataModule):
    """scikit-learn's handwritten digits (8 x 8, upscaled to 32 x 32, grey in 3 channels): 1,437 training
    images (``val_size`` of them held out for validation) and 360 test images."""

    num_classes = 10
    image_shape = (8 * UPSCALE, 8 * UPSCALE, 3)

    def load_split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        images, labels = digits_arrays()
        order = np.random.default_rng(TEST_SPLIT_SEED).permutation(len(images))
        chosen = order[TEST_IMAGES:] if train else order[:TEST_IMAGES]
        return images[chosen], labels[chosen]

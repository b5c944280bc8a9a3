"""A generated data set with a known answer, learnable in a few CPU epochs: each image is a pattern of stripes in
random colours under noise, and its class is the stripes' direction (across or down) and period (one of five). A
horizontal flip or a shifted crop keeps both, so the default augmentation keeps every label right. Made in memory
from a seed: no files, no network. With it, :func:`small_convnet`, a network of its size.
``python -m project bench --config cpu-learn`` compares strategies on the two."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from torch import nn

from project.toolkit.data import ImageArrayDataModule

SIDE = 32
PERIODS = (3.0, 4.5, 6.5, 9.0, 13.0)  # pixels per stripe cycle, at 32 px
TRAIN_IMAGES, TEST_IMAGES = 1500, 500


def stripe_images(labels: np.ndarray, rng: np.random.Generator, noise: float = 0.35) -> np.ndarray:
    """uint8 images (N, 32, 32, 3): label ``k`` has stripes along the rows for ``k < 5`` (else along the columns) of
    period ``PERIODS[k % 5]``, a random phase, two random colours and ``noise`` (a share of the range) of noise."""
    n = len(labels)
    position = np.arange(SIDE, dtype=np.float64)
    periods = np.asarray(PERIODS)[labels % len(PERIODS)]
    phases = rng.uniform(0, 2 * np.pi, n)
    wave = 0.5 + 0.5 * np.sin(2 * np.pi * position[None, :] / periods[:, None] + phases[:, None])  # (N, side)
    across = labels < len(PERIODS)
    pattern = np.where(across[:, None, None], wave[:, :, None], wave[:, None, :])  # (N, side, side)
    low, high = rng.uniform(0, 1, (n, 1, 1, 3)), rng.uniform(0, 1, (n, 1, 1, 3))
    images = low + (high - low) * pattern[..., None]
    images = (1 - noise) * images + noise * rng.uniform(0, 1, images.shape)
    return (255 * images).round().astype(np.uint8)


class StripesDataModule(ImageArrayDataModule):
    """1,500 training and 500 test images of 32 x 32 x 3 in 10 balanced classes (direction x period); the images
    depend only on ``split_seed``."""

    num_classes = 2 * len(PERIODS)
    image_shape = (SIDE, SIDE, 3)
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)

    def load_split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        self.label_names = [f"{d}-{p:g}px" for d in ("rows", "columns") for p in PERIODS]
        rng = np.random.default_rng([self.hparams.split_seed, int(train)])
        labels = rng.permutation(np.arange(TRAIN_IMAGES if train else TEST_IMAGES) % self.num_classes)
        return stripe_images(labels, rng), labels


def small_convnet(num_classes: int, in_channels: int = 3) -> nn.Sequential:
    """A small network for 32 px images that trains in seconds on a CPU
    (``--model.arch=project.data.stripes.small_convnet``): three convolution blocks with BatchNorm and a linear
    head, an ``nn.Sequential`` that fsdp and pipeline split at its four children."""

    def block(inputs: int, outputs: int, stride: int) -> nn.Sequential:
        conv = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        return nn.Sequential(conv, nn.BatchNorm2d(outputs), nn.ReLU(inplace=True))

    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(64, num_classes))
    return nn.Sequential(
        OrderedDict(stem=block(in_channels, 16, 1), block1=block(16, 32, 2), block2=block(32, 64, 2), head=head)
    )

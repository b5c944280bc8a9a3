"""Per-channel normalisation statistics of a data set: declared by the data set (``mean``/``std`` class
attributes on the 0-1 scale, checked in :mod:`.declarations`), or measured from its training images.

The measurement counts how often each of the 256 grey levels occurs in each channel, a chunk of
images at a time, and takes the mean and standard deviation from those counts: exact, in float64,
without a float copy of the data set (CIFAR-10's 45,000 training images would make one of 1.1 GB),
and the same numbers on every process that reads the same images.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from project.toolkit.errors import DataError

_LEVELS = 256  # uint8 grey levels


class ChannelStats(NamedTuple):
    """The per-channel mean and standard deviation of a data set's images, on the 0-1 scale, as
    ``Normalize(mean, std)`` takes them."""

    mean: tuple[float, ...]
    std: tuple[float, ...]


def measure_channel_stats(images: np.ndarray, indices: np.ndarray | None = None, chunk: int = 1024) -> ChannelStats:
    """The mean and (population) standard deviation of each channel of uint8 ``images``
    ``(N, H, W, C)`` -- of the images at ``indices`` only, if given -- scaled to 0-1. A channel that
    never changes gets the standard deviation 1, so normalising only centres it.

    >>> images = np.zeros((2, 1, 2, 1), np.uint8)
    >>> images[1] = 255  # half black, half white: mean 0.5, standard deviation 0.5
    >>> measure_channel_stats(images)
    ChannelStats(mean=(0.5,), std=(0.5,))
    """
    channels = images.shape[-1]
    indices = np.arange(len(images)) if indices is None else np.asarray(indices)
    if not len(indices):
        raise DataError("cannot measure the normalisation statistics of no images")
    counts = np.zeros((channels, _LEVELS), np.int64)
    for start in range(0, len(indices), chunk):
        images_chunk = images[indices[start : start + chunk]]
        for channel in range(channels):  # one uint8 plane at a time: bincount is fastest on those
            counts[channel] += np.bincount(images_chunk[..., channel].ravel(), minlength=_LEVELS)
    counts = counts.astype(np.float64)
    levels = np.arange(_LEVELS) / (_LEVELS - 1)
    total = counts.sum(axis=1)
    mean = counts @ levels / total
    std = np.sqrt((counts * (levels - mean[:, None]) ** 2).sum(axis=1) / total)
    std[(counts > 0).sum(axis=1) == 1] = 1.0  # one level only (rounding may leave a tiny std, not 0)
    return ChannelStats(tuple(float(v) for v in mean), tuple(float(v) for v in std))

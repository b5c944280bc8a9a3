"""Per-channel normalisation statistics of a data set, measured exactly (float64) from counts of the 256 grey
levels per channel, a chunk of images at a time: no float copy of the data set, the same numbers on every rank."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from project.toolkit.errors import DataError

_LEVELS = 256  # uint8 grey levels


class ChannelStats(NamedTuple):
    """Per-channel mean and standard deviation on the 0-1 scale, as ``Normalize(mean, std)`` takes them."""

    mean: tuple[float, ...]
    std: tuple[float, ...]


def measure_channel_stats(images: np.ndarray, indices: np.ndarray | None = None, chunk: int = 1024) -> ChannelStats:
    """Per-channel mean and population standard deviation of uint8 ``(N, H, W, C)`` ``images`` (those at
    ``indices`` if given), 0-1 scale. A constant channel gets std 1, so normalising only centres it."""
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

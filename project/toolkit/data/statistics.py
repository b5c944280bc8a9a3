"""Per-channel normalisation statistics of a data set: declared by the data set (``mean``/``std`` class
attributes on the 0-1 scale), checked here, or measured from its training images.

The measurement counts how often each of the 256 grey levels occurs in each channel, a chunk of
images at a time, and takes the mean and standard deviation from those counts: exact, in float64,
without a float copy of the data set (CIFAR-10's 45,000 training images would make one of 1.1 GB),
and the same numbers on every process that reads the same images.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from project.toolkit.errors import DataError

CHANNELS = (1, 3)  # grey or colour: what the networks' first convolution and the pipelines are built for
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
    offsets = np.arange(channels, dtype=np.intp) * _LEVELS  # channel c counts in bins c*256 .. c*256+255
    counts = np.zeros(channels * _LEVELS, np.int64)
    for start in range(0, len(indices), chunk):
        values = images[indices[start : start + chunk]].reshape(-1, channels).astype(np.intp) + offsets
        counts += np.bincount(values.ravel(), minlength=channels * _LEVELS)
    counts = counts.reshape(channels, _LEVELS).astype(np.float64)
    levels = np.arange(_LEVELS) / (_LEVELS - 1)
    total = counts.sum(axis=1)
    mean = counts @ levels / total
    std = np.sqrt((counts * (levels - mean[:, None]) ** 2).sum(axis=1) / total)
    std[std == 0] = 1.0
    return ChannelStats(tuple(float(v) for v in mean), tuple(float(v) for v in std))


def declared_channel_stats(
    owner: str, mean: Sequence[float] | None, std: Sequence[float] | None, channels: int
) -> ChannelStats | None:
    """The statistics a data set class ``owner`` declares (None if it declares neither), refused in one
    line unless they are ``channels`` numbers each, a mean in 0..1 and a standard deviation in (0, 1].

    >>> declared_channel_stats("Grey", [0.5], [0.25], channels=1)
    ChannelStats(mean=(0.5,), std=(0.25,))
    >>> declared_channel_stats("Grey", None, None, channels=1) is None
    True
    """
    if mean is None and std is None:
        return None
    if mean is None or std is None:
        raise DataError(f"{owner} declares only one of mean and std: declare both, or neither to measure them")
    allowed = {"mean": ("[0, 1]", lambda v: 0 <= v <= 1), "std": ("(0, 1]", lambda v: 0 < v <= 1)}
    stats = []
    for name, values in (("mean", mean), ("std", std)):
        interval, fits = allowed[name]
        try:
            numbers = tuple(float(v) for v in values)
        except (TypeError, ValueError):
            numbers = ()
        if len(numbers) != channels or not all(fits(v) for v in numbers):
            raise DataError(
                f"{owner}.{name}={values!r} is not allowed: it must be {channels} number(s) in {interval}, "
                "one per channel, on the 0-1 scale"
            )
        stats.append(numbers)
    return ChannelStats(*stats)


def check_image_shape(owner: str, image_shape: object) -> tuple[int, int, int]:
    """``image_shape`` of data set class ``owner`` if it is ``(height, width, channels)`` with 1 or 3
    channels; else one line saying what is allowed.

    >>> check_image_shape("Grey", (28, 28, 1))
    (28, 28, 1)
    """
    shape = tuple(image_shape) if isinstance(image_shape, (tuple, list)) else ()
    if len(shape) != 3 or not all(isinstance(v, int) and v >= 1 for v in shape) or shape[2] not in CHANNELS:
        raise DataError(
            f"{owner}.image_shape={image_shape!r} is not allowed: it must be (height, width, channels) "
            f"with channels {' or '.join(map(str, CHANNELS))}"
        )
    return shape  # type: ignore[return-value]

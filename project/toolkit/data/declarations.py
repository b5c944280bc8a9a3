"""The checks of what a data set class declares (``num_classes``, ``image_shape``, optionally ``mean`` and
``std``), once when it is built, and of the arrays it gives: a mistake is one line naming the class and what."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from project.toolkit.data.statistics import ChannelStats
from project.toolkit.errors import DataError

CHANNELS = (1, 3)  # grey or colour: what the networks' first convolution and the pipelines are built for


def check_declarations(cls: type | object) -> ChannelStats | None:
    """Refuse a data set (class or instance) declaring what the pipelines cannot take; its declared stats or None."""
    owner = cls.__name__ if isinstance(cls, type) else type(cls).__name__
    num_classes = getattr(cls, "num_classes", None)
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
        raise DataError(f"{owner}.num_classes={num_classes!r} is not allowed: it must be an integer >= 2")
    image_shape = getattr(cls, "image_shape", None)
    shape = tuple(image_shape) if isinstance(image_shape, (tuple, list)) else ()
    if len(shape) != 3 or not all(isinstance(v, int) and v >= 1 for v in shape) or shape[2] not in CHANNELS:
        raise DataError(
            f"{owner}.image_shape={image_shape!r} is not allowed: it must be (height, width, channels) "
            f"with channels {' or '.join(map(str, CHANNELS))}"
        )
    return declared_channel_stats(owner, getattr(cls, "mean", None), getattr(cls, "std", None), shape[2])


def declared_channel_stats(
    owner: str, mean: Sequence[float] | None, std: Sequence[float] | None, channels: int
) -> ChannelStats | None:
    """The statistics class ``owner`` declares (None if neither), refused unless ``channels`` numbers each,
    means in [0, 1] and standard deviations in (0, 1]."""
    if mean is None and std is None:
        return None
    if mean is None or std is None:
        raise DataError(f"{owner} declares only one of mean and std: declare both, or neither to measure them")
    checks = (("mean", mean, "[0, 1]", lambda v: 0 <= v <= 1), ("std", std, "(0, 1]", lambda v: 0 < v <= 1))
    stats = []
    for name, values, interval, fits in checks:
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


def checked_split(data: Any, images: Any, labels: Any, where: str) -> tuple[Any, np.ndarray]:
    """The arrays ``data`` (a data set) gave, refused (naming ``where``) unless uint8 ``(N, *image_shape)`` (grey
    ones may come ``(N, H, W)``) with integer labels in range: the metrics do not check labels every batch."""
    image_shape, num_classes = tuple(data.image_shape), data.num_classes
    if isinstance(images, np.ndarray) and images.ndim == 3 and image_shape[2] == 1:
        images = images[..., None]  # a view: grey images with their one channel made explicit
    if not (getattr(images, "dtype", None) == np.uint8 and tuple(images.shape[1:]) == image_shape):
        shape = ", ".join(map(str, image_shape))
        found = f"{getattr(images, 'dtype', type(images).__name__)} of shape {getattr(images, 'shape', None)}"
        raise DataError(f"{where}: images must be uint8 of shape (N, {shape}); found {found}")
    labels = np.asarray(labels)
    if labels.shape != (len(images),) or labels.dtype.kind not in "iu":
        found = f"{labels.dtype} {labels.shape}"
        raise DataError(f"{where}: {len(images)} images need as many integer labels; found {found}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{where}: labels must lie in 0..{num_classes - 1}; found {labels.min()}..{labels.max()}")
    return images, labels.astype(np.int64, copy=False)


def images_at(images: Any, indices: np.ndarray) -> Any:
    """``images[indices]``: rows of an array, or a subset of files (not decoded)."""
    return images[indices] if isinstance(images, np.ndarray) else images.subset(indices)

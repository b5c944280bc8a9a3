"""What a data set class declares -- ``num_classes``, ``image_shape`` and, optionally, ``mean`` and
``std`` -- checked once when it is built, so a mistake is one line naming the class and the
attribute, not a failure deep inside a loader or a convolution."""

from __future__ import annotations

from collections.abc import Sequence

from project.toolkit.data.statistics import ChannelStats
from project.toolkit.errors import DataError

CHANNELS = (1, 3)  # grey or colour: what the networks' first convolution and the pipelines are built for


def check_declarations(cls: type) -> ChannelStats | None:
    """Refuse, in one line, a data set class whose ``num_classes``, ``image_shape``, ``mean`` or ``std``
    the pipelines cannot take; return its declared statistics (None: to be measured).

    >>> class Grey:
    ...     num_classes, image_shape, mean, std = 10, (28, 28, 1), (0.13,), (0.31,)
    >>> check_declarations(Grey)
    ChannelStats(mean=(0.13,), std=(0.31,))
    """
    owner = cls.__name__
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
    """The statistics a data set class ``owner`` declares (None if it declares neither), refused in one
    line unless they are ``channels`` numbers each, a mean in [0, 1] and a standard deviation in (0, 1].

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

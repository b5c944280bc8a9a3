"""Summary statistics of measured times."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

STATS = ("mean", "std", "p50", "p90", "p99")


def describe(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, sample standard deviation and the 50th/90th/99th percentiles of ``values``."""
    if not values:
        return dict.fromkeys(STATS)
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    std = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "std": std, "p50": p50, "p90": p90, "p99": p99}


def after_warmup(values: list[float], warmup: int) -> list[float]:
    """``values`` without the first ``warmup``; all of them when nothing would be left."""
    return values[warmup:] if len(values) > warmup else values


def nanmax(values: Sequence[float]) -> float:
    """The largest number, ignoring NaN (a rank with nothing to report); NaN if all are."""
    present = [v for v in values if not math.isnan(v)]
    return max(present) if present else math.nan


def clean(value: float | None, digits: int = 6) -> float | None:
    """A JSON-safe number: NaN (how a missing value travels between ranks) becomes None."""
    return None if value is None or math.isnan(value) else round(value, digits)

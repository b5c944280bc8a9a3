"""Tables of figures, for the terminal and for markdown files, and how a number is written in them."""

from __future__ import annotations

import math
from typing import Any


def number(value: Any, digits: int = 3, unit: str = "", missing: str = "n/a", scale: float = 1.0) -> str:
    """``value * scale`` with ``digits`` decimals and ``unit``; ``missing`` for None, NaN or anything not a number."""
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return missing
    return f"{value * scale:.{digits}f}{unit}"


def mean_std(mean: float | None, std: float | None, digits: int = 3, unit: str = "", missing: str = "n/a") -> str:
    """``mean ± std`` (just the mean when there is no spread)."""
    text = number(mean, digits, unit, missing)
    return text if std is None or math.isnan(std) else f"{text} ± {std:.{digits}f}{unit}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded with spaces, for the terminal."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)

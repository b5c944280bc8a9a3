"""Tables of figures, for the terminal and for markdown files, and how a number is written in them."""

from __future__ import annotations

import math
from typing import Any


def number(value: Any, digits: int = 3, unit: str = "", missing: str = "n/a", scale: float = 1.0) -> str:
    """``value * scale`` with ``digits`` decimals and ``unit``; ``missing`` for None, NaN or anything
    that is not a number (a key an older ``timing.json`` lacks).

    >>> number(1.23456, 2, " s"), number(None), number(float("nan"), missing="–"), number(0.257, 1, scale=100)
    ('1.23 s', 'n/a', '–', '25.7')
    """
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return missing
    return f"{value * scale:.{digits}f}{unit}"


def mean_std(mean: float | None, std: float | None, digits: int = 3, unit: str = "", missing: str = "n/a") -> str:
    """``mean ± std`` (just the mean when there is no spread).

    >>> mean_std(2.0, 0.25, 2, " s"), mean_std(2.0, None, 1)
    ('2.00 s ± 0.25 s', '2.0')
    """
    text = number(mean, digits, unit, missing)
    return text if std is None or math.isnan(std) else f"{text} ± {std:.{digits}f}{unit}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table.

    >>> print(markdown_table(["a", "b"], [["1", "2"]]))
    | a | b |
    |---|---|
    | 1 | 2 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded with spaces, for the terminal.

    >>> print(text_table(["name", "s"], [["ddp", "1.5"]]))
    name  s
    ----  ---
    ddp   1.5
    """
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def human_bytes(count: float) -> str:
    """``2.4 TB``, ``512 MB``: a byte count in decimal units, as disks and ``free -h`` show them.

    >>> human_bytes(2_400_000_000_000), human_bytes(31_457_280), human_bytes(900)
    ('2.4 TB', '31.5 MB', '900 B')
    """
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"

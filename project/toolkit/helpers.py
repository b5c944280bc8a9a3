"""Small helpers every part of the toolkit uses: bytes for people, the cores a process may use, a tensor tree's size,
a path as a user reads it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def human_bytes(count: float) -> str:
    """``2.4 TB``, ``31.5 MB``: a byte count in decimal units, as disks and ``free -h`` show them.

    >>> human_bytes(31_500_000), human_bytes(12)
    ('31.5 MB', '12 B')
    """
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"


def usable_cores() -> int:
    """The CPU cores this process may run on (a container's or ``taskset``'s limit, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor in a (nested) dict, list or tuple: an output, an optimizer's state, a checkpoint."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        obj = list(obj.values())
    return sum(tensor_bytes(v) for v in obj) if isinstance(obj, list | tuple) else 0


def shown_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies inside it (shorter to read and paste), else absolute."""
    absolute = Path(path).absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)

"""Small helpers every part of the toolkit uses: bytes for people, the cores a process may use, a tensor tree's size,
a path as a user reads it, or as an fsspec URL."""

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


def is_remote(path: Any) -> bool:  # an fsspec URL of another file system than this machine's (s3://, memory://)
    return "://" in str(path) and not str(path).startswith("file://")


def joined(*parts: Any) -> Any:
    """``part/part/...``: a local Path (a ``file://`` URL is its path), or a URL from the last part that is one."""
    parts = [str(part) for part in parts if part]
    start = max((i for i, part in enumerate(parts) if is_remote(part)), default=-1)
    if start < 0:
        return Path(*(part.removeprefix("file://") for part in parts))
    return "/".join([parts[start].rstrip("/"), *parts[start + 1 :]])


def found(root: Any, pattern: str) -> list[str]:  # what under a folder or a URL matches the glob pattern
    if is_remote(root):
        from project.toolkit.remote import glob_url  # only for a remote root

        return glob_url(root, pattern)
    return [str(path) for path in Path(joined(root)).glob(pattern)]

"""CPU runs: glibc's allocator told (``mallopt``) to reuse freed memory instead of unmapping it and faulting its pages
in afresh every step (``benchmarks/results/perf/host_memory.md``); the process keeps its peak memory. glibc only.
The default callback that sets it: :class:`project.toolkit.callbacks.memory_reuse.HostMemoryReuse`."""

from __future__ import annotations

import ctypes
import platform

MIB = 2**20

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt() parameter numbers (malloc.h)
DEFAULT_TRIM_THRESHOLD_MB = 1024  # free heap kept before some goes back to the kernel: the callback's default

_applied: str | None = None  # what keep_freed_host_memory set in this process


def keep_freed_host_memory(trim_threshold_mb: int) -> str | None:
    """Make glibc reuse freed memory, keeping up to that much of it; what was set, or None (not glibc, refused)."""
    global _applied
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 for a value it refuses
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, trim_threshold_mb * MIB) != 1:
        return None
    _applied = f"glibc, freed memory reused (no mmap, trim over {trim_threshold_mb} MiB)"
    return _applied


def host_allocator() -> str:
    """How this process allocates host memory, for a run's record."""
    return _applied or ("defaults of glibc" if platform.libc_ver()[0] == "glibc" else "defaults of the C library")

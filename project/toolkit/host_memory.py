"""Host memory reuse for CPU runs: glibc's allocator told to keep freed memory for the next tensor.

On a CPU the network's activations and gradients are host memory, allocated and freed every step.
glibc's ``malloc`` maps every block over its threshold (128 KiB, raised adaptively up to 32 MiB) from
the kernel with ``mmap`` and unmaps it when freed, and it gives the top of its heap back whenever over
128 KiB of it is free. Each step then touches its activations' pages anew, and every first touch of a
page is a page fault that zeroes it. MobileNetV2 at 112 px, batch 128, on a 2-core CPU
(``benchmarks/results/perf/host_memory.md``): a test batch took 631 ms that way and 208 ms with the
memory kept, a training iteration 1309 ms and 864 ms; the peak resident memory grew by 5-6 %. This is
what PyTorch's CPU performance guide gets from switching to jemalloc or tcmalloc; glibc's own switches
(``mallopt``) do it without installing anything:

- ``M_MMAP_MAX = 0``: no block is mapped on its own; all come from the heap, where freed ones are reused;
- ``M_TRIM_THRESHOLD``: the heap keeps up to that much free memory instead of giving it back.

The process then holds on to its peak memory until it ends, as PyTorch's CUDA allocator does on a
GPU. Only glibc (Linux) has these switches; elsewhere (macOS, Windows, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import platform

MIB = 2**20

# glibc's mallopt() parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
DEFAULT_TRIM_THRESHOLD_MB = 1024  # free heap kept before some goes back to the kernel: the callback's default

_applied: str | None = None  # what keep_freed_host_memory set in this process


def keep_freed_host_memory(trim_threshold_mb: int) -> str | None:
    """Tell glibc's allocator to reuse freed memory (see the module's notes), keeping up to
    ``trim_threshold_mb`` MiB of it free; returns what was set, or None where the C library is not glibc
    or refused. Affects every allocation after it, in this process and in processes it forks."""
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
    """How this process allocates host memory, for a run's record: what :func:`keep_freed_host_memory`
    set, or the C library's defaults.

    >>> host_allocator() in ("defaults of glibc", "defaults of the C library") or host_allocator().startswith("glibc,")
    True
    """
    if _applied is not None:
        return _applied
    return "defaults of glibc" if platform.libc_ver()[0] == "glibc" else "defaults of the C library"

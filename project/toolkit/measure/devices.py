"""Reading time and memory on a device without changing what is measured.

A GPU runs its work asynchronously: a host clock read after launching a step measures the launch,
not the step, and waiting for the device before every reading (``torch.cuda.synchronize``) stalls
the host until the GPU is idle, so the next step's copies and launches can no longer overlap the
current one -- the measurement slows the run it measures. A :class:`DeviceClock` therefore splits
reading time in two:

- :meth:`DeviceClock.mark` notes a point in the device's stream of work and never waits (on CUDA it
  records an event on the current stream; on a synchronous CPU it reads the host clock);
- :meth:`DeviceClock.wait` waits for the device once and returns the host time; after it,
  :meth:`DeviceClock.seconds` turns pairs of marks into seconds.

The timing callback marks every batch and waits only at epoch and stage boundaries.
:func:`device_clock` picks the clock for a device; ``sync_every_step=True`` gives the old, fully
synchronised per-step wall times (:class:`SyncingClock`).
"""

from __future__ import annotations

import functools
import math
import resource
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

MIB = 2**20


class DeviceClock(Protocol):
    """What the timing callback needs of a device to time it (tests inject a fake one)."""

    def mark(self) -> Any:
        """A point in the device's work, taken without waiting for the device."""

    def wait(self) -> float:
        """Wait for every queued device operation; then the host clock (``perf_counter``), in seconds."""

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds between two marks; only valid after a :meth:`wait` that followed both."""


class HostClock:
    """Marks are host times (``perf_counter``) and :meth:`wait` calls ``synchronize``.

    Right for a CPU, whose operations have finished when they return (``synchronize`` does nothing).
    On XLA, ``synchronize`` is ``xm.wait_device_ops``: per-step marks then time the host's tracing
    and dispatch, and the device's work is waited for only at the boundaries, since a per-step wait
    would serialise the lazy-tensor pipeline as surely as a CUDA sync does.

    >>> clock = HostClock()
    >>> start = clock.mark(); end = clock.mark(); _ = clock.wait()
    >>> clock.seconds(start, end) >= 0
    True
    """

    def __init__(self, synchronize: Callable[[], None] | None = None) -> None:
        self._synchronize = synchronize

    def mark(self) -> float:
        return time.perf_counter()

    def wait(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class SyncingClock(HostClock):
    """Waits for the device at every mark: per-step wall times that include all of the step's device
    work, at the price of the overlap described above (``--timing.sync_every_step=true``)."""

    def mark(self) -> float:
        return self.wait()


class CudaEventClock:
    """Marks are CUDA events recorded on the current stream (the host does not wait when recording);
    their times are read once, after :meth:`wait`'s single ``synchronize``.

    The seconds between two marks are the device's: from the moment the GPU reached the first mark
    (after the work queued before it) to the moment it reached the second.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def wait(self) -> float:
        torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000.0  # milliseconds


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """A function that returns once ``device`` has finished the work queued on it; None for a CPU,
    whose operations have finished when they return."""
    if device.type == "cuda":
        return functools.partial(torch.cuda.synchronize, device)
    if device.type == "mps":
        return torch.mps.synchronize
    if device.type == "xla":
        import torch_xla.core.xla_model as xm  # only installed (and importable) where XLA runs

        return xm.wait_device_ops
    return None


def device_clock(device: torch.device, sync_every_step: bool = False) -> DeviceClock:
    """The clock that times ``device`` without per-step synchronisation (CUDA events; host times on
    a CPU and on XLA), or, with ``sync_every_step`` (and on MPS, which has no event timing here),
    one that waits for the device at every mark.

    >>> type(device_clock(torch.device("cpu"))).__name__, type(device_clock(torch.device("cpu"), True)).__name__
    ('HostClock', 'SyncingClock')
    """
    synchronize = synchronizer(device)
    if sync_every_step or device.type == "mps":
        return SyncingClock(synchronize)
    if device.type == "cuda":
        return CudaEventClock(device)
    return HostClock(synchronize)


# --------------------------------------------------------------------------- memory


def process_peak_rss_mb() -> float:
    """This process's peak resident memory since it started, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MIB if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def peak_memory_mb(device: torch.device) -> list[tuple[int, float]]:
    """``(device index, peak MiB)`` for each device this process used; index -1 is the host.

    CUDA: every GPU with allocations (DataParallel drives several from one process). XLA: the
    runtime's peak if it reports one, else NaN. Anything else: the process's peak resident memory.
    """
    if device.type == "cuda":
        peaks = [(i, torch.cuda.max_memory_allocated(i) / MIB) for i in range(torch.cuda.device_count())]
        return [(i, mb) for i, mb in peaks if mb > 0] or [(device.index or 0, 0.0)]
    if device.type == "xla":
        return [(device.index or 0, _xla_peak_mb(device))]
    return [(-1, process_peak_rss_mb())]


def _xla_peak_mb(device: torch.device) -> float:
    """The XLA runtime's peak memory of ``device`` in MiB, or NaN where it reports none."""
    import torch_xla.core.xla_model as xm

    try:
        peak = xm.get_memory_info(device).get("peak_bytes_used")  # absent before torch_xla 2.5
    except Exception:  # runtimes without memory statistics (the XLA CPU client) raise here
        return math.nan
    return peak / MIB if peak is not None else math.nan


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor in a (nested) dict, list or tuple: a unit's output, an optimizer's state,
    a checkpoint (about the size of its file).

    >>> tensor_bytes({"a": torch.zeros(4), "b": [torch.zeros(2, dtype=torch.float64), 3]})
    32
    """
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v) for v in obj)
    return 0

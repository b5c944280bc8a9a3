"""Reading time on a device without changing what is measured: a :class:`DeviceClock` marks points in the
device's work without waiting, and waits only at epoch and stage ends (a wait per step would stall the host)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch


class DeviceClock(Protocol):
    """What the timing callback needs of a device (tests inject a fake one): ``mark`` a point without waiting, ``wait``
    for the queued work and read ``perf_counter``, the ``seconds`` between two marks (after a wait following both)."""

    def mark(self) -> Any: ...

    def wait(self) -> float: ...

    def seconds(self, start: Any, end: Any) -> float: ...


class HostClock:
    """Host-time marks; :meth:`wait` synchronizes (a CPU; XLA, whose lazy tensors a per-step wait would serialise)."""

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
    """Waits for the device at every mark (``--timing.sync_every_step=true``), at the price of the overlap."""

    def mark(self) -> float:
        return self.wait()


class CudaEventClock:
    """CUDA events on the current stream, read after :meth:`wait`'s one ``synchronize``: the device's own time."""

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
    """A function that returns once ``device`` has finished its queued work; None for a CPU."""
    if device.type == "cuda":
        return functools.partial(torch.cuda.synchronize, device)
    if device.type == "mps":
        return torch.mps.synchronize
    if device.type == "xla":
        import torch_xla.core.xla_model as xm  # only installed (and importable) where XLA runs

        return xm.wait_device_ops
    return None


def device_clock(device: torch.device, sync_every_step: bool = False) -> DeviceClock:
    """The clock that times ``device`` without per-step waits; with ``sync_every_step`` and on MPS, at every mark."""
    synchronize = synchronizer(device)
    if sync_every_step or device.type == "mps":
        return SyncingClock(synchronize)
    return CudaEventClock(device) if device.type == "cuda" else HostClock(synchronize)

"""The pipeline bubble: each stage's share of its step time spent waiting on the other stages."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from project.toolkit.timing.clocks import CudaEventClock, HostClock


class BubbleMeter:
    """One process's share of its schedule steps' time in which its stage did not compute, the first step (which
    also exchanges the activations' shapes) left out; CUDA events are read only when a fraction is asked for."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._clock = CudaEventClock(device) if self._cuda else HostClock()
        self._pending: list[tuple[Any, list[Any]]] = []  # (step interval, compute intervals) not read yet
        self._compute: list[Any] = []
        self._steps = 0
        self.totals = {"epoch": [0.0, 0.0], "fit": [0.0, 0.0]}  # [step seconds, compute seconds]
        self.observer: Any = None  # the step anatomy's AnatomyWindow while it is open

    def _observed(self, kind: str) -> Any:
        return self.observer.interval(kind) if self.observer is not None else contextlib.nullcontext()

    def _mark(self) -> Any:
        return self._clock.mark()

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        with self._observed("stage_compute"):
            start = self._mark()
            yield
            self._compute.append((start, self._mark()))

    def timed_loss(self, loss: Callable[..., Any]) -> Callable[..., Any]:
        """``loss`` with its calls counted as compute (the last stage computes it per micro-batch)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.compute():
                return loss(*args, **kwargs)

        return timed

    def communication(self) -> Any:
        """Time the body as a communication wait of the step anatomy's window, while it is open."""
        return self.observer.waiting() if self.observer is not None else contextlib.nullcontext()

    def step(self, run: Callable[[], Any]) -> Any:
        self._compute = []
        with self._observed("schedule"):
            start = self._mark()
            result = run()
            interval = (start, self._mark())
        self._steps += 1
        if self._steps > 1:
            self._pending.append((interval, self._compute))
        return result

    def _seconds(self, interval: tuple[Any, Any]) -> float:
        if self._cuda:
            interval[1].synchronize()
        return self._clock.seconds(*interval)

    def fraction(self, scope: str) -> float | None:
        """The bubble over this epoch's steps (``epoch``, which restarts the count) or the fit's (``fit``)."""
        for interval, compute in self._pending:
            step, busy = self._seconds(interval), sum(self._seconds(c) for c in compute)
            for totals in self.totals.values():
                totals[0] += step
                totals[1] += busy
        self._pending = []
        step, busy = self.totals[scope]
        if scope == "epoch":
            self.totals["epoch"] = [0.0, 0.0]
        return max(0.0, 1.0 - busy / step) if step > 0 else None

"""The step anatomy: where each rank's step time goes, marked on the run's DeviceClock over a window of steady steps
and read after one wait; the parts add up to the step, checked against its wall time (docs/timing.md)."""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from project.toolkit.timing.clocks import DeviceClock
from project.toolkit.timing.tables import number

Interval = tuple[float, float]
Intervals = Sequence[Interval]
PARTS = ("data_wait", "compute", "communication", "optimizer", "bubble", "rest")
DETAIL = ("forward", "backward")  # the two halves of compute, where known
FIELDS = ("step_seconds", "parts_sum_seconds", *PARTS, *DETAIL)  # one rank's figures, seconds per step
LABELS = {"data_wait": "data", "communication": "comm", "optimizer": "optim"}


def covered(intervals: list[Interval], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` covered by at least one of ``intervals`` (overlaps counted once)."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start))
    total, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


@dataclass
class StepTimes:
    """One step's marks in seconds; None where the point was not passed (a pipeline's backward, no optimizer step)."""

    previous_end: float
    start: float
    end: float
    backward_start: float | None = None
    backward_end: float | None = None
    optimizer_start: float | None = None
    optimizer_end: float | None = None


def split_step(
    step: StepTimes, communication: Intervals = (), schedule: Intervals = (), stage_compute: Intervals = ()
) -> dict[str, float | None]:
    """One step in parts (seconds): communication waits taken out wherever they fall, the pipeline's bubble
    (``schedule`` time neither ``stage_compute`` nor communication) out of compute; negative parts clipped at zero."""
    compute_end = next(t for t in (step.optimizer_start, step.backward_end, step.end) if t is not None)
    has_optimizer = step.optimizer_start is not None and step.optimizer_end is not None
    optimizer_end = step.optimizer_end if has_optimizer else compute_end

    def net(a: float, b: float) -> float:  # the interval less the communication waits inside it
        return max(0.0, b - a - covered(list(communication), a, b))

    halves = step.backward_start is not None and not schedule  # a pipeline's schedule runs both
    bubble = None  # not a pipeline
    if schedule:
        inside = [(max(a, step.start), min(b, compute_end)) for a, b in schedule]
        busy = [*stage_compute, *communication]
        bubble = sum(max(0.0, (b - a) - covered(busy, a, b)) for a, b in inside if b > a)
    parts: dict[str, float | None] = {
        "data_wait": net(step.previous_end, step.start),
        "communication": covered(list(communication), step.previous_end, step.end),
        "optimizer": net(compute_end, optimizer_end),
        "bubble": bubble,
        "rest": net(optimizer_end, step.end),
        "forward": net(step.start, step.backward_start) if halves else None,
        "backward": net(step.backward_start, compute_end) if halves else None,
    }
    parts["compute"] = max(0.0, net(step.start, compute_end) - (bubble or 0.0))
    return parts


def summarise_window(steps: list[dict[str, float | None]], measured_seconds: float) -> dict[str, float | None]:
    """One rank's figures: each part's mean seconds per step, their sum, and the step time measured apart."""
    out: dict[str, float | None] = {"step_seconds": measured_seconds}
    for name in (*PARTS, *DETAIL):
        values = [s.get(name) for s in steps]
        out[name] = statistics.fmean(values) if values and all(v is not None for v in values) else None
    out["parts_sum_seconds"] = sum(out[p] or 0.0 for p in PARTS)
    return out


def unaccounted(rank: dict[str, Any]) -> float | None:
    """The share of the measured step time the parts do not account for (negative: they sum to more)."""
    step, total = rank.get("step_seconds"), rank.get("parts_sum_seconds")
    if not step or total is None or math.isnan(step) or math.isnan(total):
        return None
    return round((step - total) / step, 6)


def format_line(anatomy: dict[str, Any]) -> str:
    """The console table's line: per rank, the step time and each part's share of it."""
    texts = []
    for index, rank in enumerate(anatomy["ranks"]):
        step = rank.get("step_seconds")
        present = [p for p in PARTS if rank.get(p) is not None]
        shares = [f"{LABELS.get(p, p)} {number(rank[p] / step if step else None, 0, ' %', scale=100)}" for p in present]
        texts.append(f"rank{index} {number(step, 3, ' s')} = " + " + ".join(shares))
    return " | ".join(texts) + f" ({anatomy['steps']} steps)"


@dataclass
class _Step:
    previous_end: Any  # clock marks: floats or CUDA events, read after the window's wait
    start: Any = None
    end: Any = None
    points: dict[str, Any] = field(default_factory=dict)


class AnatomyWindow:
    """One rank's window of ``steps`` steady steps, past the first ``warmup`` batches and an epoch's first (its wait
    starts the loader); probes add their waits and intervals through :meth:`waiting` and :meth:`mark_interval`."""

    def __init__(self, clock: DeviceClock, steps: int, warmup: int) -> None:
        self.clock, self.steps, self.warmup = clock, steps, warmup
        self.batches_done = 0
        self.first_batch: int | None = None  # in this epoch, once placed
        self.last_batch: int | None = None
        self.epoch: int | None = None
        self.open = False
        self.result: dict[str, Any] | None = None  # this rank's figures, once the window closed
        self._marks: list[_Step] = []
        self._intervals: dict[str, list[tuple[Any, Any]]] = {}
        self._host_start = 0.0
        self._depth = threading.local()
        self.on_open: list[Callable[[], None]] = []  # the probes' installers and removers
        self.on_close: list[Callable[[], None]] = []

    def place(self, epoch: int, batches_in_epoch: float) -> None:
        """At an epoch's start: place the window in this epoch if it is not done and fits."""
        if self.steps <= 0 or self.result is not None or self.first_batch is not None:
            return
        if not math.isfinite(batches_in_epoch):
            batches_in_epoch = self.warmup + self.steps + 1
        length = min(self.steps, int(batches_in_epoch) - 1)
        first = max(1, self.warmup - self.batches_done)
        if length >= 1 and first + length <= batches_in_epoch:
            self.epoch, self.first_batch, self.last_batch = epoch, first, first + length - 1

    def epoch_ended(self) -> None:
        """A window cut short by the epoch's end is dropped, to be placed again."""
        if self.open:
            self._close()
        if self.result is None:
            self.first_batch = self.last_batch = self.epoch = None
            self._marks = []

    def batch_start(self) -> None:
        if self.open and self._marks and self._marks[-1].start is None:
            self._marks[-1].start = self.clock.mark()

    def point(self, name: str) -> Any:
        """Mark a named point (``backward_start``, ...; the last of a name counts); None outside the window."""
        if self.open and self._marks and self._marks[-1].start is not None and self._marks[-1].end is None:
            mark = self._marks[-1].points[name] = self.clock.mark()
            return mark
        return None

    def batch_end(self, batch_idx: int) -> None:
        """Opens the window before its first batch, closes it after its last."""
        self.batches_done += 1
        if self.first_batch is None or self.result is not None:
            return
        if self.open and self._marks and self._marks[-1].start is not None:
            self._marks[-1].end = self.clock.mark()
            if batch_idx >= self.last_batch:
                self._finish()
                return
            self._marks.append(_Step(self._marks[-1].end))
        elif not self.open and batch_idx == self.first_batch - 1:
            self._host_start = self.clock.wait()
            self.open = True
            self._marks = [_Step(self.clock.mark())]
            self._intervals = {}
            for install in self.on_open:
                install()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Time the body as a communication wait; a wait nested in another is not counted again."""
        if not self.open or getattr(self._depth, "value", 0):
            yield
            return
        self._depth.value = 1
        try:
            with self.interval("communication"):
                yield
        finally:
            self._depth.value = 0

    def mark(self) -> Any:
        return self.clock.mark()

    def mark_interval(self, kind: str, start: Any, end: Any) -> None:
        """An interval of ``kind`` (``communication``, ``schedule``, ``stage_compute``) between two marks."""
        if self.open:
            self._intervals.setdefault(kind, []).append((start, end))

    @contextmanager
    def interval(self, kind: str) -> Iterator[None]:
        """Time the body as an interval of ``kind`` (no nesting rule)."""
        start = self.clock.mark() if self.open else None
        try:
            yield
        finally:
            if start is not None:
                self.mark_interval(kind, start, self.clock.mark())

    def _close(self) -> None:
        self.open = False
        for remove in self.on_close:
            remove()

    def _finish(self) -> None:
        self._close()
        host_end = self.clock.wait()  # the one wait: every mark is readable now
        reference = self._marks[0].previous_end

        def at(mark: Any) -> float | None:
            return None if mark is None else self.clock.seconds(reference, mark)

        kinds = ("communication", "schedule", "stage_compute")
        intervals = [[(at(a), at(b)) for a, b in self._intervals.get(kind, [])] for kind in kinds]
        steps = []
        for s in self._marks:
            times = StepTimes(at(s.previous_end), at(s.start), at(s.end), **{k: at(v) for k, v in s.points.items()})
            steps.append(split_step(times, *intervals))  # type: ignore[arg-type]
        self.result = summarise_window(steps, (host_end - self._host_start) / len(steps))
        self.result["steps"] = len(steps)
        self._marks, self._intervals = [], {}

    def vector(self) -> list[float]:
        """This rank's figures in :data:`FIELDS` order (NaN for none), to gather across ranks."""
        values = self.result or {}
        return [math.nan if values.get(k) is None else float(values[k]) for k in FIELDS]


def report(rows: list[list[float]], window: AnatomyWindow, clock: str) -> dict[str, Any] | None:
    """``timing.json``'s ``step_anatomy`` from every rank's :meth:`AnatomyWindow.vector`; None without a window."""
    if window.result is None or all(math.isnan(r[0]) for r in rows):
        return None
    ranks = [{k: None if math.isnan(v) else round(v, 6) for k, v in zip(FIELDS, row, strict=True)} for row in rows]
    for entry in ranks:
        entry["unaccounted_fraction"] = unaccounted(entry)
    where = {"steps": window.result["steps"], "epoch": window.epoch, "first_batch": window.first_batch}
    return where | {"clock": clock, "ranks": ranks}

"""Where a training step's time goes, per rank: the step anatomy.

Over a short window of steady training steps (``--timing.anatomy_steps``, 5 by default) every rank marks
the points of each step that Lightning and the strategy pass through -- the batch's start, the backward's
start and end, the optimizer's start and end, the batch's end -- and the intervals in which it waited for
communication (:mod:`project.toolkit.measure.probes`) or, in a pipeline, for the other stages. At the
window's end it waits for the device once and splits each step into:

- ``data_wait``: from the previous step's end to this one's start (the loader, the copy, the loop);
- ``compute``: forward and backward (``forward`` and ``backward`` apart where Lightning runs the backward
  itself), without the communication and the bubble inside them;
- ``communication``: the time this rank waited for collectives (exposed communication: a collective that
  runs while the rank computes is not counted);
- ``optimizer``: the optimizer's step;
- ``bubble``: a pipeline stage's schedule time in which it neither computed nor communicated, i.e. waited
  for the other stages;
- ``rest``: the remainder of the step (Lightning's bookkeeping after the optimizer, the callbacks).

The marks come from the run's :class:`~project.toolkit.measure.devices.DeviceClock`: host times on a CPU,
CUDA events on the current stream on a GPU (device time, read after the one wait at the window's end). The
parts of a step are consecutive intervals of one timeline, so they add up to the step; the window's own
host wall time, taken with the device waited for at both ends, is recorded beside them as the check.
Outside the window nothing is marked and nothing waits.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from project.toolkit.measure.devices import DeviceClock
from project.toolkit.measure.tables import number

Interval = tuple[float, float]
PARTS = ("data_wait", "compute", "communication", "optimizer", "bubble", "rest")
DETAIL = ("forward", "backward")  # the two halves of compute, where known
FIELDS = ("step_seconds", "parts_sum_seconds", *PARTS, *DETAIL)  # one rank's figures, seconds per step
LABELS = {"data_wait": "data", "communication": "comm", "optimizer": "optim"}


# --------------------------------------------------------------------------- bookkeeping (numbers only)


def covered(intervals: list[Interval], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` covered by at least one of ``intervals`` (overlaps counted once).

    >>> covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)], 1.5, 5.5)
    2.0
    """
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start))
    total, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


@dataclass
class StepTimes:
    """One step's marks, in seconds on one timeline. ``None``: the point was not passed (a pipeline runs
    its own backward, a step of gradient accumulation has no optimizer step)."""

    previous_end: float
    start: float
    end: float
    backward_start: float | None = None
    backward_end: float | None = None
    optimizer_start: float | None = None
    optimizer_end: float | None = None


def split_step(
    step: StepTimes,
    communication: list[Interval] = (),  # type: ignore[assignment]
    schedule: list[Interval] = (),  # type: ignore[assignment]
    stage_compute: list[Interval] = (),  # type: ignore[assignment]
) -> dict[str, float | None]:
    """One step in parts (seconds): consecutive intervals of the step, from which the communication waits
    (``communication``) are taken out wherever they fall, and the pipeline's bubble (the ``schedule``
    steps' time not covered by ``stage_compute`` nor communication) out of the compute. The parts add up to
    ``end - previous_end`` (a part driven below zero by a wrong mark is clipped at zero, and the sum shows it).
    ``bubble`` is None for a step without a pipeline schedule.

    >>> parts = split_step(StepTimes(0.0, 1.0, 10.0, 3.0, 7.0, 7.0, 9.0), communication=[(6.0, 7.0)])
    >>> [parts[k] for k in ("data_wait", "forward", "backward", "compute", "communication", "optimizer", "rest")]
    [1.0, 2.0, 3.0, 5.0, 1.0, 2.0, 1.0]
    """
    compute_end = next(t for t in (step.optimizer_start, step.backward_end, step.end) if t is not None)
    has_optimizer = step.optimizer_start is not None and step.optimizer_end is not None
    optimizer_end = step.optimizer_end if has_optimizer else compute_end

    def waiting(a: float, b: float) -> float:
        return covered(list(communication), a, b)

    bubble = None  # not a pipeline
    if schedule:  # the schedule's time that is neither its compute nor a communication wait
        inside = [(max(a, step.start), min(b, compute_end)) for a, b in schedule]
        busy = [*stage_compute, *communication]
        bubble = sum(max(0.0, (b - a) - covered(busy, a, b)) for a, b in inside if b > a)
    parts: dict[str, float | None] = {
        "data_wait": max(0.0, step.start - step.previous_end - waiting(step.previous_end, step.start)),
        "communication": waiting(step.previous_end, step.end),
        "optimizer": max(0.0, optimizer_end - compute_end - waiting(compute_end, optimizer_end)),
        "bubble": bubble,
        "rest": max(0.0, step.end - optimizer_end - waiting(optimizer_end, step.end)),
        "forward": None,
        "backward": None,
    }
    if step.backward_start is not None and not schedule:
        parts["forward"] = max(0.0, step.backward_start - step.start - waiting(step.start, step.backward_start))
        parts["backward"] = max(0.0, compute_end - step.backward_start - waiting(step.backward_start, compute_end))
    parts["compute"] = max(0.0, compute_end - step.start - waiting(step.start, compute_end) - (bubble or 0.0))
    return parts


def summarise_window(steps: list[dict[str, float | None]], measured_seconds: float) -> dict[str, float | None]:
    """One rank's figures over the window: each part's mean seconds per step, the parts' sum and the step
    time measured independently (the window's host wall time over its steps).

    >>> window = summarise_window([{"compute": 2.0, "rest": 1.0}, {"compute": 4.0, "rest": 1.0}], 4.0)
    >>> window["compute"], window["parts_sum_seconds"], window["step_seconds"], window["bubble"]
    (3.0, 4.0, 4.0, None)
    """
    out: dict[str, float | None] = {"step_seconds": measured_seconds}
    for name in (*PARTS, *DETAIL):
        values = [s.get(name) for s in steps]
        out[name] = statistics.fmean(values) if values and all(v is not None for v in values) else None
    out["parts_sum_seconds"] = sum(out[p] or 0.0 for p in PARTS)
    return out


def unaccounted(rank: dict[str, Any]) -> float | None:
    """The share of the measured step time the parts do not account for (negative: they sum to more).

    >>> unaccounted({"step_seconds": 2.0, "parts_sum_seconds": 1.9})
    0.05
    """
    step, total = rank.get("step_seconds"), rank.get("parts_sum_seconds")
    if not step or total is None or math.isnan(step) or math.isnan(total):
        return None
    return round((step - total) / step, 6)


def format_line(anatomy: dict[str, Any]) -> str:
    """The console table's line: per rank, the step time and each part's share of it.

    >>> format_line({"steps": 5, "ranks": [{"step_seconds": 0.5, "data_wait": 0.05, "compute": 0.4,
    ...     "communication": 0.0, "optimizer": 0.04, "bubble": None, "rest": 0.01}]})
    'rank0 0.500 s = data 10 % + compute 80 % + comm 0 % + optim 8 % + rest 2 % (5 steps)'
    """
    texts = []
    for index, rank in enumerate(anatomy["ranks"]):
        step = rank.get("step_seconds")
        shares = [
            f"{LABELS.get(p, p)} {number(rank[p] / step if step else None, 0, ' %', scale=100)}"
            for p in PARTS
            if rank.get(p) is not None
        ]
        texts.append(f"rank{index} {number(step, 3, ' s')} = " + " + ".join(shares))
    return " | ".join(texts) + f" ({anatomy['steps']} steps)"


# --------------------------------------------------------------------------- the window (marks)


@dataclass
class _Step:
    """One step's raw marks (clock marks: floats or CUDA events), read after the window's wait."""

    previous_end: Any
    start: Any = None
    end: Any = None
    points: dict[str, Any] = field(default_factory=dict)


class AnatomyWindow:
    """One rank's window of ``steps`` steady training steps: where it lies, its marks, and its figures.

    The window starts at the first batch of an epoch that is (a) past the process's first ``warmup``
    batches and (b) not the epoch's first (whose wait includes starting the loader), in the first epoch
    long enough to hold it; with epochs shorter than ``steps + 1`` batches, the window is every batch of
    an epoch but the first. ``clock`` marks and waits; the probes
    (:mod:`project.toolkit.measure.probes`) add communication waits through :meth:`waiting` and a
    pipeline's schedule through :meth:`mark_interval`.
    """

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

    # -- where ------------------------------------------------------------------------------------

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
        """An epoch ended: a window cut short (fewer batches than planned) is dropped and placed again."""
        if self.open:
            self._close_probes()
            self.open = False
        if self.result is None:
            self.first_batch = self.last_batch = self.epoch = None
            self._marks = []

    # -- marks --------------------------------------------------------------------------------------

    def batch_start(self) -> None:
        """The start of a training batch: the current step's start, inside the window."""
        if self.open and self._marks and self._marks[-1].start is None:
            self._marks[-1].start = self.clock.mark()

    def point(self, name: str) -> Any:
        """Mark a named point of the current step (``backward_start``, ``backward_end``, ``optimizer_start``,
        ``optimizer_end``; the last one of a name counts) and return the mark; None outside the window."""
        if self.open and self._marks and self._marks[-1].start is not None and self._marks[-1].end is None:
            mark = self._marks[-1].points[name] = self.clock.mark()
            return mark
        return None

    def batch_end(self, batch_idx: int) -> None:
        """The end of a training batch: opens the window before its first batch, closes it after its last."""
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
        """Time the body as a communication wait; a wait inside another is not counted again. Nothing is
        marked outside the window."""
        depth = getattr(self._depth, "value", 0)
        if not self.open or depth:
            yield
            return
        self._depth.value = 1
        start = self.clock.mark()
        try:
            yield
        finally:
            self._depth.value = 0
            self.mark_interval("communication", start, self.clock.mark())

    def mark(self) -> Any:
        """A mark of the window's clock, for a probe that times an interval itself."""
        return self.clock.mark()

    def mark_interval(self, kind: str, start: Any, end: Any) -> None:
        """An interval of ``kind`` (``communication``, ``schedule``, ``stage_compute``) between two marks."""
        if self.open:
            self._intervals.setdefault(kind, []).append((start, end))

    @contextmanager
    def interval(self, kind: str) -> Iterator[None]:
        """Time the body as an interval of ``kind`` (no nesting rule: a pipeline's schedule and compute)."""
        if not self.open:
            yield
            return
        start = self.clock.mark()
        try:
            yield
        finally:
            self.mark_interval(kind, start, self.clock.mark())

    # -- figures ------------------------------------------------------------------------------------

    def _close_probes(self) -> None:
        for remove in self.on_close:
            remove()

    def _finish(self) -> None:
        self._close_probes()
        self.open = False
        host_end = self.clock.wait()  # the one wait: every mark is readable now
        reference = self._marks[0].previous_end

        def at(mark: Any) -> float | None:
            return None if mark is None else self.clock.seconds(reference, mark)

        intervals = {kind: [(at(a), at(b)) for a, b in pairs] for kind, pairs in self._intervals.items()}  # type: ignore[misc]
        steps = []
        for raw in self._marks:
            times = StepTimes(
                at(raw.previous_end), at(raw.start), at(raw.end), **{k: at(v) for k, v in raw.points.items()}
            )
            steps.append(
                split_step(
                    times,
                    intervals.get("communication", []),
                    intervals.get("schedule", []),
                    intervals.get("stage_compute", []),
                )
            )
        self.result = summarise_window(steps, (host_end - self._host_start) / len(steps))
        self.result["steps"] = len(steps)
        self._marks, self._intervals = [], {}

    def vector(self) -> list[float]:
        """This rank's figures in :data:`FIELDS` order (NaN for none), to gather across ranks."""
        values = self.result or {}
        return [math.nan if values.get(k) is None else float(values[k]) for k in FIELDS]


def report(rows: list[list[float]], window: AnatomyWindow, clock: str) -> dict[str, Any] | None:
    """``timing.json``'s ``step_anatomy`` from every rank's gathered :meth:`AnatomyWindow.vector`; None when
    no rank measured a window."""
    if window.result is None or all(math.isnan(r[0]) for r in rows):
        return None
    ranks = []
    for row in rows:
        entry = {k: None if math.isnan(v) else round(v, 6) for k, v in zip(FIELDS, row, strict=True)}
        entry["unaccounted_fraction"] = unaccounted(entry)
        ranks.append(entry)
    return {
        "steps": window.result["steps"],
        "epoch": window.epoch,
        "first_batch": window.first_batch,
        "clock": clock,
        "ranks": ranks,
    }

"""One rank's timing marks, taken without device waits, turned into :mod:`.summary` records at epoch and stage ends."""

from __future__ import annotations

import statistics
from typing import Any

from project.toolkit.measure.devices import DeviceClock
from project.toolkit.measure.stats import after_warmup, describe
from project.toolkit.measure.summary import EpochRecord, FitRecord, InferenceRecord, nan_for_none


class TrainRecorder:
    def __init__(self, clock: DeviceClock, fit_start: float) -> None:
        self.clock, self.fit_start = clock, fit_start
        self.iterations: list[float] = []  # seconds, read at each epoch's end
        # this epoch's (wait start, start, end) per batch, on the device's clock: the data wait is the device's
        # time between steps (the host's would also hold its own waits for the device)
        self.pending: list[tuple[Any, Any, Any]] = []
        self.val_runs: list[float] = []
        self.in_epoch = False
        self.epoch_start = self.val_start = 0.0
        self.samples, self.val_in_epoch = 0, 0.0
        self.batch_marks: tuple[Any, Any] = (None, None)  # the batch under way's (wait start, start)
        self.last_end_mark: Any = None

    def start_epoch(self, now: float) -> None:
        self.in_epoch, self.epoch_start = True, now
        self.samples, self.val_in_epoch = 0, 0.0
        self.last_end_mark = self.clock.mark()

    def start_batch(self) -> None:
        self.batch_marks = (self.last_end_mark, self.clock.mark())

    def end_batch(self, samples: int) -> None:
        self.last_end_mark = self.clock.mark()
        self.pending.append((*self.batch_marks, self.last_end_mark))
        self.samples += samples

    def start_validation(self, now: float) -> None:
        self.val_start = now

    def end_validation(self, now: float) -> None:
        seconds = now - self.val_start
        self.val_runs.append(seconds)
        if self.in_epoch:  # validation inside a training epoch is neither training nor data wait
            self.val_in_epoch += seconds
            self.last_end_mark = self.clock.mark()

    def end_epoch(self, now: float) -> EpochRecord:
        """The epoch just ended; ``now`` was read after waiting for the device, so its marks are done."""
        self.in_epoch = False
        self.iterations += [self.clock.seconds(start, end) for _, start, end in self.pending]
        data_wait = sum(self.clock.seconds(wait, start) for wait, start, _ in self.pending)
        self.pending.clear()
        return EpochRecord(now - self.epoch_start - self.val_in_epoch, self.samples, data_wait, self.val_in_epoch)

    def fit_record(self, now: float, warmup: int) -> FitRecord:
        measured = after_warmup(self.iterations, warmup)
        stats = [nan_for_none(describe(measured)[k]) for k in ("mean", "std", "p50", "p90")]
        val_mean = nan_for_none(statistics.fmean(self.val_runs) if self.val_runs else None)
        return FitRecord(now - self.fit_start, *stats, len(measured), len(self.iterations) - len(measured), val_mean)


class InferenceRecorder:
    def __init__(self, clock: DeviceClock) -> None:
        self.clock = clock
        self.marks: list[tuple[Any, Any]] = []
        self.samples: list[int] = []
        self.batch_mark: Any = None

    def start_batch(self) -> None:
        self.batch_mark = self.clock.mark()

    def end_batch(self, samples: int) -> None:
        self.marks.append((self.batch_mark, self.clock.mark()))
        self.samples.append(samples)

    def record(self, warmup: int) -> InferenceRecord:
        """Read after the wait, without the first ``warmup`` batches and the first of each later size (which on a GPU
        runs cuDNN's autotuning for its new shape)."""
        seconds = [self.clock.seconds(start, end) for start, end in self.marks]
        everything = list(range(len(seconds)))  # with nothing left: after_warmup's rule
        kept = [i for i in measured_batches(self.samples) if i >= warmup] or after_warmup(everything, warmup)
        latencies = [seconds[i] for i in kept]
        stats = [nan_for_none(v) for v in describe(latencies).values()]
        return InferenceRecord(*stats, len(latencies), sum(self.samples[i] for i in kept), sum(latencies))


def measured_batches(sizes: list[int]) -> list[int]:
    """The indices of the batches to measure: all but the first batch of each size that appears after the first."""
    first = {size: i for i, size in reversed(list(enumerate(sizes)))}
    return [i for i, size in enumerate(sizes) if i == 0 or first[size] < i]

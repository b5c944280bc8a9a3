"""One rank's raw timing records: device marks and host times, taken in the hot loop without waiting
for the device or reading a tensor, and turned into :mod:`project.toolkit.measure.summary` records at the
epoch or stage boundary, after the one wait for the device there."""

from __future__ import annotations

import statistics
from typing import Any

from project.toolkit.measure.devices import DeviceClock
from project.toolkit.measure.stats import after_warmup, describe
from project.toolkit.measure.summary import EpochRecord, FitRecord, InferenceRecord, nan_for_none


class TrainRecorder:
    """One rank's raw training marks and host times (no device waits, no tensors read)."""

    def __init__(self, clock: DeviceClock, fit_start: float) -> None:
        self.clock, self.fit_start = clock, fit_start
        self.iterations: list[float] = []  # seconds, read at each epoch's end
        # This epoch's (wait start, start, end) marks of each batch: its data wait runs from the previous batch's
        # end (or the epoch's start, or an in-epoch validation's end) to its start. On the device's clock, so on a
        # GPU a wait is the time the GPU spent between steps (idle, or on the batch's copy and augmentation); the
        # host's own time there would also hold its waits for the GPU whenever it runs ahead (on an H100 it read
        # 13 % of an epoch where the step anatomy, on the GPU's clock, put 3 % of a step between steps).
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
        stats = describe(measured)
        val_mean = statistics.fmean(self.val_runs) if self.val_runs else None
        return FitRecord(
            now - self.fit_start,
            *(nan_for_none(stats[k]) for k in ("mean", "std", "p50", "p90")),
            len(measured),
            len(self.iterations) - len(measured),
            nan_for_none(val_mean),
        )


class InferenceRecorder:
    """One rank's per-batch test or predict marks."""

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
        """Read after waiting for the device, so every mark is done. Left out: the first ``warmup`` batches,
        and the first batch of every size that appears later (a test set's last, smaller batch).
        On a GPU such a batch runs cuDNN's autotuning for its new shape (and torch.compile's recompiling):
        in an H100's test of MobileNetV2 one batch, most likely that one, took about 2.8 s against a median
        of 8 ms, and the test's images/s read 3,000 for about 30,000."""
        seconds = [self.clock.seconds(start, end) for start, end in self.marks]
        # with nothing left, after_warmup's rule: the batches after the warm-up, or all of them
        everything = list(range(len(seconds)))
        kept = [i for i in measured_batches(self.samples) if i >= warmup] or after_warmup(everything, warmup)
        latencies = [seconds[i] for i in kept]
        stats = [nan_for_none(v) for v in describe(latencies).values()]
        return InferenceRecord(*stats, len(latencies), sum(self.samples[i] for i in kept), sum(latencies))


def measured_batches(sizes: list[int]) -> list[int]:
    """The indices of the batches to measure: all but the first batch of each size that appears after the
    first batch (the start is the warm-up's to leave out).

    >>> measured_batches([256, 256, 256, 16]), measured_batches([1, 1]), measured_batches([256, 16, 16])
    ([0, 1, 2], [0, 1], [0, 2])
    """
    seen: set[int] = set()
    kept = []
    for index, size in enumerate(sizes):
        if index == 0 or size in seen:
            kept.append(index)
        seen.add(size)
    return kept

"""Each rank's timing marks, taken without device waits and turned into records at epoch and stage ends
(:class:`TrainRecorder`, :class:`InferenceRecorder`); the records exchanged in one collective per epoch or stage;
the run's figures: a time is the SLOWEST rank's, a throughput counts ALL ranks' samples, memory is listed per rank and
device."""

from __future__ import annotations

import dataclasses
import math
import resource
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from project.toolkit.timing.clocks import DeviceClock

NAN = math.nan
MIB = 2**20
STATS = ("mean", "std", "p50", "p90", "p99")
Memory = list[tuple[int, float]]  # (device index, peak MiB) per device a rank used; index -1: the host


def describe(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, sample standard deviation and the 50th/90th/99th percentiles of ``values``."""
    if not values:
        return dict.fromkeys(STATS)
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    std = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "std": std, "p50": p50, "p90": p90, "p99": p99}


def after_warmup(values: list[float], warmup: int) -> list[float]:
    """``values`` without the first ``warmup``; all of them when nothing would be left."""
    return values[warmup:] if len(values) > warmup else values


def nanmax(values: Sequence[float]) -> float:
    """The largest number, ignoring NaN (a rank with nothing to report); NaN if all are."""
    present = [v for v in values if not math.isnan(v)]
    return max(present) if present else math.nan


def clean(value: float | None, digits: int = 6) -> float | None:
    """A JSON-safe number: NaN (how a missing value travels between ranks) becomes None."""
    return None if value is None or math.isnan(value) else round(value, digits)


@dataclass
class EpochRecord:
    """One rank's training epoch; ``seconds`` leaves out the validation inside it (``val_seconds``)."""

    seconds: float
    samples: float
    data_wait_seconds: float
    val_seconds: float


@dataclass
class FitRecord:
    """One rank's whole fit: wall seconds, per-iteration statistics after the warm-up, the mean validation run."""

    fit_seconds: float
    iteration_mean: float
    iteration_std: float
    iteration_p50: float
    iteration_p90: float
    iterations_measured: float
    warmup_skipped: float
    val_mean: float


@dataclass
class InferenceRecord:
    """One rank's test or predict: batch latency statistics after the warm-up, and what they cover."""

    latency_mean: float
    latency_std: float
    latency_p50: float
    latency_p90: float
    latency_p99: float
    batches: float
    samples: float
    seconds: float


Record = TypeVar("Record", EpochRecord, FitRecord, InferenceRecord)


def nan_for_none(value: float | None) -> float:
    """How a missing value travels in a float tensor between ranks."""
    return NAN if value is None else value


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


def gather_records(
    record: Record, memory: Memory, world_size: int, all_gather: Any, device: torch.device, width: int
) -> list[tuple[Record, Memory]]:
    """Every rank's ``(record, memory)`` in rank order, through ``all_gather`` (a collective; memory padded)."""
    if world_size == 1:
        return [(record, memory)]
    values = [nan_for_none(v) for v in dataclasses.astuple(record)]
    padded = (memory + [(NAN, NAN)] * width)[:width]
    row = values + [x for pair in padded for x in pair]
    rows = all_gather(torch.tensor(row, dtype=torch.float64, device=device)).reshape(world_size, len(row)).tolist()
    n = len(values)
    mems = [[(int(i), mb) for i, mb in zip(r[n::2], r[n + 1 :: 2], strict=True) if not math.isnan(i)] for r in rows]
    return [(type(record)(*r[:n]), mem) for r, mem in zip(rows, mems, strict=True)]


def peak_memory_mb(device: torch.device) -> list[tuple[int, float]]:
    """``(device index, peak MiB)`` per device this process used: CUDA GPUs, XLA's peak, else the host's (-1)."""
    if device.type == "cuda":
        peaks = [(i, torch.cuda.max_memory_allocated(i) / MIB) for i in range(torch.cuda.device_count())]
        return [(i, mb) for i, mb in peaks if mb > 0] or [(device.index or 0, 0.0)]
    if device.type == "xla":
        import torch_xla.core.xla_model as xm

        try:
            peak = xm.get_memory_info(device).get("peak_bytes_used")  # absent before torch_xla 2.5
        except Exception:  # runtimes without memory statistics (the XLA CPU client) raise here
            peak = None
        return [(device.index or 0, peak / MIB if peak is not None else math.nan)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the process's, since it started
    return [(-1, peak / MIB if sys.platform == "darwin" else peak / 1024)]  # bytes on macOS, KiB on Linux


def memory_entries(memories: list[Memory], device_type: str) -> tuple[list[str], list[float | None]]:
    """Labels (``rank0``, or ``rank0_cuda1`` on an accelerator) and peak MiB, one per device used."""
    labels, values = [], []
    for rank, pairs in enumerate(memories):
        for index, mb in pairs:
            labels.append(f"rank{rank}" if index < 0 else f"rank{rank}_{device_type}{int(index)}")
            values.append(clean(mb, 1))
    return labels, values


def summarise_epoch(epoch: int, records: list[EpochRecord], sample_copies: int = 1) -> dict[str, Any]:
    """One epoch across ranks: the slowest rank's times, the samples of all (``sample_copies``: a pipeline's stages)."""
    seconds = max(r.seconds for r in records)
    samples = int(sum(r.samples for r in records) / sample_copies)
    rate = samples / seconds if seconds > 0 else None
    out = {"epoch": epoch, "seconds": seconds, "samples": samples, "samples_per_second": rate}
    return out | {k: max(getattr(r, k) for r in records) for k in ("data_wait_seconds", "val_seconds")}


def _slowest(records: list[Record], field: str) -> Record:
    return max(records, key=lambda r: -math.inf if math.isnan(getattr(r, field)) else getattr(r, field))


def summarise_fit(epochs: list[dict[str, Any]], records: list[FitRecord]) -> dict[str, Any]:
    """The fit report's numbers; steady state is every epoch after the first (or that one, where it is alone)."""
    steady = epochs[1:] or epochs
    steady_seconds = [e["seconds"] for e in epochs[1:]]
    total_seconds = sum(e["seconds"] for e in steady)
    slowest = _slowest(records, "iteration_mean")
    return {
        "epochs": [{k: clean(v) if isinstance(v, float) else v for k, v in e.items()} for e in epochs],
        "first_epoch_seconds": epochs[0]["seconds"] if epochs else None,
        "epoch_seconds_mean": statistics.fmean(steady_seconds) if steady_seconds else None,
        "epoch_seconds_std": statistics.stdev(steady_seconds) if len(steady_seconds) > 1 else None,
        "steady_epochs": len(steady_seconds),
        **{f"iteration_seconds_{k}": getattr(slowest, f"iteration_{k}") for k in ("mean", "std", "p50", "p90")},
        "iterations_measured": int(slowest.iterations_measured),
        "warmup_iterations_skipped": int(slowest.warmup_skipped),
        "data_wait_fraction": sum(e["data_wait_seconds"] for e in steady) / total_seconds if total_seconds else None,
        "train_samples_per_second": sum(e["samples"] for e in steady) / total_seconds if total_seconds else None,
        "fit_seconds": nanmax([r.fit_seconds for r in records]),
        "val_epoch_seconds_mean": nanmax([r.val_mean for r in records]),
    }


def summarise_accuracy(runs: list[tuple[int, float, float]], targets: list[float]) -> dict[str, Any]:
    """The fit's ``val/acc`` from its ``(epoch, accuracy, seconds since the fit's start)`` per validation: the best
    (the first such run) and its epoch, the last, and per target the seconds to the first run at or above it."""
    best = max(runs, key=lambda run: run[1], default=None)
    reached = {f"{t:g}": next((clean(s, 3) for _, acc, s in runs if acc >= t), None) for t in targets}
    return {
        "best_val_acc": clean(best[1]) if best else None,
        "best_val_acc_epoch": best[0] if best else None,
        "last_val_acc": clean(runs[-1][1]) if runs else None,
        "target_acc": targets,
        "seconds_to_target_acc": reached,
    }


def summarise_inference(stage: str, records: list[InferenceRecord], sample_copies: int = 1) -> dict[str, Any]:
    """Test or predict numbers: the slowest rank's latencies, all ranks' samples over the slowest rank's time."""
    slowest = _slowest(records, "latency_mean")
    seconds = max(r.seconds for r in records)
    samples = sum(r.samples for r in records) / sample_copies
    return {
        f"{stage}_batch_latency_ms": {k: clean(getattr(slowest, f"latency_{k}") * 1000, 3) for k in STATS},
        f"{stage}_sample_latency_ms": clean(slowest.seconds / slowest.samples * 1000, 4) if slowest.samples else None,
        f"{stage}_samples_per_second": clean(samples / seconds, 2) if seconds > 0 else None,
        f"{stage}_batches_measured": int(slowest.batches),
        f"{stage}_samples_measured": int(samples),
    }

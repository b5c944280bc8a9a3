"""Each rank's timing records, exchanged once per epoch or stage, and the run's figures made of them.

A record is a dataclass of named float fields; :func:`gather_records` sends every rank's record (and
its peak memory per device) to every rank in one collective, so adding a figure means adding a field
where it is recorded and reading it where it is summarised. Across ranks a time is the SLOWEST
rank's (everyone waits for it), a throughput counts the samples of ALL ranks, and memory is listed
per rank and device.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from project.toolkit.measure.anatomy import format_line as anatomy_line
from project.toolkit.measure.stats import STATS, clean, nanmax
from project.toolkit.measure.tables import mean_std, number

NAN = math.nan
Memory = list[tuple[int, float]]  # (device index, peak MiB) per device a rank used; index -1: the host


@dataclass
class EpochRecord:
    """One rank's training epoch: its seconds without the validation inside it, the samples it
    trained on, the time it waited for batches, and the validation time inside it."""

    seconds: float
    samples: float
    data_wait_seconds: float
    val_seconds: float


@dataclass
class FitRecord:
    """One rank's whole fit: wall seconds, per-iteration statistics after the warm-up, and the mean
    validation run (NaN where there is none)."""

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
    """One rank's test or predict: batch latency statistics after the warm-up, and the batches,
    samples and seconds they cover."""

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


def gather_records(
    record: Record, memory: Memory, world_size: int, all_gather: Any, device: torch.device, width: int
) -> list[tuple[Record, Memory]]:
    """Every rank's ``(record, memory)``, in rank order, through ``all_gather`` (the strategy's).

    A collective: every rank must call it at the same point, or the run hangs. Memory is padded to
    ``width`` devices, since every rank must send a tensor of the same size.

    >>> mine = EpochRecord(1.0, 8, 0.1, 0.0)
    >>> gather_records(mine, [(-1, 900.0)], 1, None, torch.device("cpu"), 1)
    [(EpochRecord(seconds=1.0, samples=8, data_wait_seconds=0.1, val_seconds=0.0), [(-1, 900.0)])]
    """
    if world_size == 1:
        return [(record, memory)]
    values = [nan_for_none(v) for v in dataclasses.astuple(record)]
    padded = (memory + [(NAN, NAN)] * width)[:width]
    row = values + [x for pair in padded for x in pair]
    rows = all_gather(torch.tensor(row, dtype=torch.float64, device=device)).reshape(world_size, len(row)).tolist()
    count = len(values)
    out = []
    for r in rows:
        pairs = r[count:]
        mem = [(int(i), mb) for i, mb in zip(pairs[::2], pairs[1::2], strict=True) if not math.isnan(i)]
        out.append((type(record)(*r[:count]), mem))
    return out


def memory_entries(memories: list[Memory], device_type: str) -> tuple[list[str], list[float | None]]:
    """Labels (``rank0``, or ``rank0_cuda1`` on an accelerator) and peak MiB, one per device used.

    >>> memory_entries([[(0, 900.0), (1, 300.0)], [(1, 850.0)]], "cuda")
    (['rank0_cuda0', 'rank0_cuda1', 'rank1_cuda1'], [900.0, 300.0, 850.0])
    """
    labels, values = [], []
    for rank, pairs in enumerate(memories):
        for index, mb in pairs:
            labels.append(f"rank{rank}" if index < 0 else f"rank{rank}_{device_type}{int(index)}")
            values.append(clean(mb, 1))
    return labels, values


def summarise_epoch(epoch: int, records: list[EpochRecord], sample_copies: int = 1) -> dict[str, Any]:
    """One epoch across ranks: the slowest rank's times, every rank's samples, each counted once
    where ``sample_copies`` ranks see every sample (the stages of a pipeline).

    >>> summarise_epoch(3, [EpochRecord(2.0, 100, 0.2, 0.5), EpochRecord(2.5, 100, 0.1, 0.4)])["samples_per_second"]
    80.0
    >>> summarise_epoch(3, [EpochRecord(2.0, 100, 0.2, 0.5), EpochRecord(2.5, 100, 0.1, 0.4)], 2)["samples_per_second"]
    40.0
    """
    seconds = max(r.seconds for r in records)
    samples = int(sum(r.samples for r in records) / sample_copies)
    return {
        "epoch": epoch,
        "seconds": seconds,
        "samples": samples,
        "samples_per_second": samples / seconds if seconds > 0 else None,
        "data_wait_seconds": max(r.data_wait_seconds for r in records),
        "val_seconds": max(r.val_seconds for r in records),
    }


def _slowest(records: list[Record], field: str) -> Record:
    """The record of the rank with the largest ``field`` (NaN counts as the smallest)."""
    return max(records, key=lambda r: -math.inf if math.isnan(getattr(r, field)) else getattr(r, field))


def summarise_fit(epochs: list[dict[str, Any]], records: list[FitRecord]) -> dict[str, Any]:
    """The fit report's numbers from the per-epoch summaries and the ranks' end-of-fit records.

    Steady state is every epoch after the process's first; with a single epoch there is none,
    and the rates fall back to that epoch.
    """
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
        "iteration_seconds_mean": slowest.iteration_mean,
        "iteration_seconds_std": slowest.iteration_std,
        "iteration_seconds_p50": slowest.iteration_p50,
        "iteration_seconds_p90": slowest.iteration_p90,
        "iterations_measured": int(slowest.iterations_measured),
        "warmup_iterations_skipped": int(slowest.warmup_skipped),
        "data_wait_fraction": sum(e["data_wait_seconds"] for e in steady) / total_seconds if total_seconds else None,
        "train_samples_per_second": sum(e["samples"] for e in steady) / total_seconds if total_seconds else None,
        "fit_seconds": nanmax([r.fit_seconds for r in records]),
        "val_epoch_seconds_mean": nanmax([r.val_mean for r in records]),
    }


def summarise_inference(stage: str, records: list[InferenceRecord], sample_copies: int = 1) -> dict[str, Any]:
    """Test or predict numbers: the slowest rank's latencies, the samples of all ranks (each counted
    once where ``sample_copies`` ranks see every sample) over the slowest rank's compute time."""
    slowest = _slowest(records, "latency_mean")
    latencies = (slowest.latency_mean, slowest.latency_std, slowest.latency_p50, slowest.latency_p90)
    seconds = max(r.seconds for r in records)
    samples = sum(r.samples for r in records) / sample_copies
    return {
        f"{stage}_batch_latency_ms": {
            k: clean(v * 1000, 3) for k, v in zip(STATS, (*latencies, slowest.latency_p99), strict=True)
        },
        f"{stage}_sample_latency_ms": clean(slowest.seconds / slowest.samples * 1000, 4) if slowest.samples else None,
        f"{stage}_samples_per_second": clean(samples / seconds, 2) if seconds > 0 else None,
        f"{stage}_batches_measured": int(slowest.batches),
        f"{stage}_samples_measured": int(samples),
    }


def _work(tflops: float | None, mfu: float | None) -> str:
    """``12.3 TFLOP/s (MFU 41.0 %)``; the MFU only where the device's peak is known. Below one TFLOP/s (a
    CPU) in GFLOP/s or MFLOP/s, so the figure shows rather than ``0.00``.

    >>> _work(12.345, 0.41), _work(0.00512, None), _work(None, None)
    ('12.3 TFLOP/s (MFU 41.0 %)', '5.12 GFLOP/s', 'n/a')
    """
    if not isinstance(tflops, int | float) or isinstance(tflops, bool) or math.isnan(tflops):
        return "n/a"
    scale, unit = next(
        ((s, u) for s, u in ((1.0, "TFLOP/s"), (1e-3, "GFLOP/s")) if abs(tflops) >= s), (1e-6, "MFLOP/s")
    )
    return f"{tflops / scale:.3g} {unit}" + ("" if mfu is None else f" (MFU {100 * mfu:.1f} %)")


def _input(report: dict[str, Any]) -> str:
    """``on_device, 0 workers``: the input path the run took (:mod:`project.toolkit.data.input_path`)."""
    if report.get("input_path") is None:
        return "n/a"
    return f"{report['input_path']}, {report['num_workers']} workers"


def format_table(report: dict[str, Any], stage: str) -> str:
    """A few lines for the terminal: the stage's headline numbers."""
    where = f"{report['strategy']}, {report['world_size']} process(es), {report['devices']} x {report['accelerator']}"
    lines = [f"Timing of {stage} ({where}, {report['precision']}, global batch {report['batch_size']})"]
    if stage == "fit":
        detail = (
            f"  (p50 {number(report['iteration_seconds_p50'], 3, ' s')},"
            f" p90 {number(report['iteration_seconds_p90'], 3, ' s')};"
            f" {report['warmup_iterations_skipped']} warm-up skipped)"
        )
        wait = report["data_wait_fraction"]
        rows = [
            ("fit total", number(report["fit_seconds"], 2, " s")),
            ("first epoch", number(report["first_epoch_seconds"], 2, " s")),
            (
                f"epoch (steady, n={report['steady_epochs']})",
                mean_std(report["epoch_seconds_mean"], report["epoch_seconds_std"], 2, " s"),
            ),
            (
                "iteration",
                mean_std(report["iteration_seconds_mean"], report["iteration_seconds_std"], 3, " s") + detail,
            ),
            ("data wait", "n/a" if wait is None else f"{100 * wait:.1f} % of epoch time"),
            ("input", _input(report)),
            ("throughput", number(report["train_samples_per_second"], 1, " samples/s (all ranks)")),
            ("work", _work(report.get("train_tflops_per_second"), report.get("mfu"))),
            ("validation run", number(report["val_epoch_seconds_mean"], 2, " s")),
        ]
        if report.get("bubble_fraction"):  # a pipeline: each stage's share of its step time spent waiting
            bubble = ", ".join(
                f"rank{r} {number(v, 1, ' %', scale=100)}" for r, v in enumerate(report["bubble_fraction"])
            )
            rows.append(("pipeline bubble", bubble))
        if report.get("step_anatomy"):  # where each rank's step time went (seconds per step, shares)
            rows.append(("step anatomy", anatomy_line(report["step_anatomy"])))
        memory = zip(report["peak_memory_devices"], report["peak_memory_mb"], strict=True)
    else:
        latency = report[f"{stage}_batch_latency_ms"]
        rows = [
            ("batch latency", mean_std(latency["mean"], latency["std"], 2, " ms")),
            ("  p50 / p90 / p99", " / ".join(number(latency[k], 2, " ms") for k in ("p50", "p90", "p99"))),
            ("sample latency", number(report[f"{stage}_sample_latency_ms"], 3, " ms")),
            ("throughput", number(report[f"{stage}_samples_per_second"], 1, " samples/s (all ranks)")),
            ("work", _work(report.get(f"{stage}_tflops_per_second"), report.get(f"{stage}_mfu"))),
        ]
        memory = zip(report[f"{stage}_peak_memory_devices"], report[f"{stage}_peak_memory_mb"], strict=True)
    rows.append(("peak memory", ", ".join(f"{label} {number(mb, 0, ' MiB')}" for label, mb in memory)))
    width = max(len(name) for name, _ in rows)
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)

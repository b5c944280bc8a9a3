"""Honest wall-clock numbers for training and inference: :class:`TimingCallback`.

Every rank measures itself with ``time.perf_counter()``, waiting for the device at each timing
boundary where it runs asynchronously (CUDA and MPS synchronise, XLA waits for its queued device
operations, the CPU needs nothing), so a number covers the work and not just its queueing.
In the hot loop the callback only appends Python floats; ranks exchange their numbers once per
epoch and once at the end of a stage, with a collective that every rank calls, and rank 0 sums
them up: a time is the SLOWEST rank's (everyone waits for it), a throughput counts the samples of
ALL ranks, memory is listed per rank (and per device when one process drives several).

What is measured (see ``timing.json`` in the run folder for the keys):

- training epoch: from ``on_train_epoch_start`` to ``on_train_epoch_end``, minus the validation
  runs inside it; the process's first epoch (warm-up, compilation, worker start-up) is reported
  on its own and kept out of the steady-state mean and std;
- iteration: ``on_train_batch_start`` to ``on_train_batch_end`` -- forward, backward and optimizer
  step -- with the first ``warmup_iterations`` of the process left out;
- data wait: from the end of one training batch to the start of the next (loading the batch,
  copying it to the device, the loop's bookkeeping), as a fraction of the epoch time;
- validation: each validation run during fit (the sanity check excluded);
- test / predict: per-batch latency (mean, std, p50, p90, p99) after ``warmup_iterations``
  batches, per-sample latency and samples per second of that compute;
- peak memory: CUDA's peak allocated memory of every GPU the process used; on CPU the process's
  peak resident set size (``getrusage``); XLA's peak where the runtime reports it. Peaks are since
  the process started (the CPU's cannot be reset), so run fit and test as separate commands -- as
  ``python -m project bench`` does -- to see each on its own.

Rank 0 writes TensorBoard scalars (``time/...``, ``memory/...``) every epoch and at the end,
merges its stage's keys into ``<log_dir>/timing.json`` at the end of fit, test and predict, and
prints a short table. Without a logger it only prints.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.data import extract_batch_size

from project.errors import ProjectError
from project.measure.devices import DeviceClock, HostClock, SyncingClock, peak_memory_mb, synchronizer
from project.measure.stats import STATS, after_warmup, clean, describe, nanmax

NAN = float("nan")


def _slowest(rows: list[list[float]], column: int) -> list[float]:
    """The row of the rank with the largest value in ``column`` (NaN counts as the smallest)."""
    return max(rows, key=lambda row: -math.inf if math.isnan(row[column]) else row[column])


# --------------------------------------------------------------------------- across ranks


def gather_rows(trainer: Trainer, row: list[float]) -> list[list[float]]:
    """Every rank's ``row`` (all of the same length), in rank order.

    A collective: every rank must call it at the same point, or the run hangs.
    """
    if trainer.world_size == 1:
        return [row]
    local = torch.tensor(row, dtype=torch.float64, device=trainer.strategy.root_device)
    return trainer.strategy.all_gather(local).reshape(trainer.world_size, len(row)).tolist()


def memory_entries(rows: list[list[float]], start: int, device_type: str) -> tuple[list[str], list[float | None]]:
    """Unpack the ``(index, MiB)`` pairs that follow position ``start`` of every rank's row into
    labels (``rank0``, or ``rank0_cuda1`` on an accelerator) and values, one per device used."""
    labels, values = [], []
    for rank, row in enumerate(rows):
        pairs = row[start:]
        for index, mb in zip(pairs[::2], pairs[1::2], strict=True):
            if math.isnan(index):
                continue  # padding: this rank used fewer devices than the widest one
            labels.append(f"rank{rank}" if index < 0 else f"rank{rank}_{device_type}{int(index)}")
            values.append(clean(mb, 1))
    return labels, values


def summarise_epoch(epoch: int, rows: list[list[float]]) -> dict[str, Any]:
    """One epoch across ranks, from rows ``[seconds, samples, data-wait seconds, validation
    seconds, ...]``: the slowest rank's times, every rank's samples.

    >>> summarise_epoch(3, [[2.0, 100, 0.2, 0.5], [2.5, 100, 0.1, 0.4]])["samples_per_second"]
    80.0
    """
    seconds = max(r[0] for r in rows)
    samples = int(sum(r[1] for r in rows))
    return {
        "epoch": epoch,
        "seconds": seconds,
        "samples": samples,
        "samples_per_second": samples / seconds if seconds > 0 else None,
        "data_wait_seconds": max(r[2] for r in rows),
        "val_seconds": max(r[3] for r in rows),
    }


def summarise_fit(epochs: list[dict[str, Any]], rows: list[list[float]]) -> dict[str, Any]:
    """The fit report's numbers from the per-epoch summaries and the ranks' end-of-fit rows
    ``[fit seconds, iteration mean, std, p50, p90, measured, skipped, validation mean, ...]``.

    Steady state is every epoch after the process's first; with a single epoch there is none,
    and the rates fall back to that epoch.
    """
    steady = epochs[1:] or epochs
    steady_seconds = [e["seconds"] for e in epochs[1:]]
    total_seconds = sum(e["seconds"] for e in steady)
    slowest = _slowest(rows, 1)  # by mean iteration time
    return {
        "epochs": [{k: clean(v) if isinstance(v, float) else v for k, v in e.items()} for e in epochs],
        "first_epoch_seconds": epochs[0]["seconds"] if epochs else None,
        "epoch_seconds_mean": statistics.fmean(steady_seconds) if steady_seconds else None,
        "epoch_seconds_std": statistics.stdev(steady_seconds) if len(steady_seconds) > 1 else None,
        "steady_epochs": len(steady_seconds),
        "iteration_seconds_mean": slowest[1],
        "iteration_seconds_std": slowest[2],
        "iteration_seconds_p50": slowest[3],
        "iteration_seconds_p90": slowest[4],
        "iterations_measured": int(slowest[5]),
        "warmup_iterations_skipped": int(slowest[6]),
        "data_wait_fraction": sum(e["data_wait_seconds"] for e in steady) / total_seconds if total_seconds else None,
        "train_samples_per_second": sum(e["samples"] for e in steady) / total_seconds if total_seconds else None,
        "fit_seconds": nanmax([r[0] for r in rows]),
        "val_epoch_seconds_mean": nanmax([r[7] for r in rows]),
    }


def summarise_inference(stage: str, rows: list[list[float]]) -> dict[str, Any]:
    """Test or predict numbers from rows ``[latency mean, std, p50, p90, p99 (seconds), batches,
    samples, seconds, ...]``: the slowest rank's latencies, the samples of all ranks over the
    slowest rank's compute time."""
    slowest = _slowest(rows, 0)  # by mean batch latency
    seconds = max(r[7] for r in rows)
    samples = sum(r[6] for r in rows)
    return {
        f"{stage}_batch_latency_ms": {k: clean(v * 1000, 3) for k, v in zip(STATS, slowest[:5], strict=True)},
        f"{stage}_sample_latency_ms": clean(slowest[7] / slowest[6] * 1000, 4) if slowest[6] else None,
        f"{stage}_samples_per_second": clean(samples / seconds, 2) if seconds > 0 else None,
        f"{stage}_batches_measured": int(slowest[5]),
        f"{stage}_samples_measured": int(samples),
    }


# --------------------------------------------------------------------------- one rank's records


class _TrainRecorder:
    """One rank's raw training times, as plain floats (no tensors, no device work)."""

    def __init__(self, fit_start: float) -> None:
        self.fit_start = fit_start
        self.iterations: list[float] = []
        self.val_runs: list[float] = []
        self.in_epoch = False
        self.epoch_start = self.batch_start = self.last_batch_end = self.val_start = 0.0
        self.samples, self.data_wait, self.val_in_epoch = 0, 0.0, 0.0

    def start_epoch(self, now: float) -> None:
        self.in_epoch, self.epoch_start, self.last_batch_end = True, now, now
        self.samples, self.data_wait, self.val_in_epoch = 0, 0.0, 0.0

    def start_batch(self, now: float) -> None:
        self.data_wait += now - self.last_batch_end
        self.batch_start = now

    def end_batch(self, now: float, samples: int) -> None:
        self.iterations.append(now - self.batch_start)
        self.samples += samples
        self.last_batch_end = now

    def start_validation(self, now: float) -> None:
        self.val_start = now

    def end_validation(self, now: float) -> None:
        seconds = now - self.val_start
        self.val_runs.append(seconds)
        if self.in_epoch:  # validation inside a training epoch is neither training nor data wait
            self.val_in_epoch += seconds
            self.last_batch_end += seconds

    def end_epoch(self, now: float) -> list[float]:
        """``[seconds, samples, data-wait seconds, validation seconds]`` of the epoch just ended."""
        self.in_epoch = False
        return [now - self.epoch_start - self.val_in_epoch, self.samples, self.data_wait, self.val_in_epoch]

    def fit_row(self, now: float, warmup: int) -> list[float]:
        """The row :func:`summarise_fit` reads (without the memory that follows it)."""
        measured = after_warmup(self.iterations, warmup)
        stats = describe(measured)
        val_mean = statistics.fmean(self.val_runs) if self.val_runs else None
        numbers = [stats["mean"], stats["std"], stats["p50"], stats["p90"]]
        skipped = len(self.iterations) - len(measured)
        return [now - self.fit_start, *_nan(numbers), len(measured), skipped, *_nan([val_mean])]


class _InferenceRecorder:
    """One rank's per-batch test or predict latencies."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.samples: list[int] = []
        self.batch_start = 0.0

    def start_batch(self, now: float) -> None:
        self.batch_start = now

    def end_batch(self, now: float, samples: int) -> None:
        self.latencies.append(now - self.batch_start)
        self.samples.append(samples)

    def row(self, warmup: int) -> list[float]:
        """The row :func:`summarise_inference` reads (without the memory that follows it)."""
        latencies = after_warmup(self.latencies, warmup)
        samples = self.samples[len(self.samples) - len(latencies) :]
        stats = _nan(list(describe(latencies).values()))
        return [*stats, len(latencies), sum(samples), sum(latencies)]


def _nan(values: list[float | None]) -> list[float]:
    return [NAN if v is None else v for v in values]


# --------------------------------------------------------------------------- the callback


class TimingCallback(Callback):
    """Times training epochs and iterations, data wait, validation, test/predict latency and peak
    memory on every rank, and reports them from rank 0 (TensorBoard, ``timing.json``, a table).

    Args:
        warmup_iterations: Training iterations (and test/predict batches) at the start of the
            process left out of the per-iteration statistics: the first steps pay for memory
            allocation, cuDNN autotuning and compilation.
    """

    def __init__(self, warmup_iterations: int = 3) -> None:
        if warmup_iterations < 0:
            raise ProjectError(f"timing.warmup_iterations={warmup_iterations} is not allowed: it must be >= 0")
        self.warmup_iterations = warmup_iterations
        self.report: dict[str, Any] = {}  # what rank 0 last wrote; empty on other ranks
        self._clock: DeviceClock = HostClock()
        self._device = torch.device("cpu")
        self._train = _TrainRecorder(0.0)
        self._inference = _InferenceRecorder()
        self._epochs: list[dict[str, Any]] = []

    def _now(self) -> float:
        return self._clock.wait()

    # -- fit ---------------------------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._device = trainer.strategy.root_device
        self._clock = SyncingClock(synchronizer(self._device))
        if stage == "fit":  # the clock of fit_seconds starts here: the data is set up, the model not yet
            self._train = _TrainRecorder(self._now())
            self._epochs = []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._train.start_epoch(self._now())

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._train.start_batch(self._now())

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._train.end_batch(self._now(), extract_batch_size(batch))

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._train.start_validation(self._now())

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._train.end_validation(self._now())

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        row = self._train.end_epoch(self._now())
        rows = gather_rows(trainer, row + self._memory_row(trainer))
        if not trainer.is_global_zero:
            return
        epoch = summarise_epoch(trainer.current_epoch, rows)
        self._epochs.append(epoch)
        metrics = {
            "time/train_epoch_seconds": epoch["seconds"],
            "time/train_samples_per_second": epoch["samples_per_second"],
            "time/data_wait_fraction": epoch["data_wait_seconds"] / epoch["seconds"] if epoch["seconds"] else None,
            "time/val_epoch_seconds": epoch["val_seconds"] or None,  # epochs without validation: no point
        }
        labels, memory = memory_entries(rows, len(row), self._device.type)
        metrics.update({f"memory/peak_mb/{label}": mb for label, mb in zip(labels, memory, strict=True)})
        _log_scalars(trainer, metrics, step=trainer.current_epoch)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        row = self._train.fit_row(self._now(), self.warmup_iterations)
        rows = gather_rows(trainer, row + self._memory_row(trainer))
        log_dir = trainer.log_dir  # every rank must ask: Lightning broadcasts it from rank 0
        if not trainer.is_global_zero:
            return
        labels, memory = memory_entries(rows, len(row), self._device.type)
        numbers = summarise_fit(self._epochs, rows)
        report = {**_run_description(trainer, pl_module)}
        report.update({k: clean(v) if isinstance(v, float) else v for k, v in numbers.items()})
        report.update(peak_memory_mb=memory, peak_memory_devices=labels)
        scalars = {f"time/summary/{k}": v for k, v in report.items() if isinstance(v, float)}
        scalars.update({f"memory/summary/peak_mb/{label}": mb for label, mb in zip(labels, memory, strict=True)})
        self._publish(trainer, log_dir, report, scalars, step=trainer.current_epoch, title="fit")

    # -- test and predict --------------------------------------------------------------------

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._inference = _InferenceRecorder()

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._inference.start_batch(self._now())

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._inference.end_batch(self._now(), extract_batch_size(batch))

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_inference(trainer, pl_module, "test")

    # predict is timed exactly as test is
    on_predict_start = on_test_start
    on_predict_batch_start = on_test_batch_start
    on_predict_batch_end = on_test_batch_end

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_inference(trainer, pl_module, "predict")

    def _finish_inference(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        row = self._inference.row(self.warmup_iterations)
        rows = gather_rows(trainer, row + self._memory_row(trainer))
        log_dir = trainer.log_dir
        if not trainer.is_global_zero:
            return
        labels, memory = memory_entries(rows, len(row), self._device.type)
        report = {**_run_description(trainer, pl_module), **summarise_inference(stage, rows)}
        report.update({f"{stage}_peak_memory_mb": memory, f"{stage}_peak_memory_devices": labels})
        latency = report[f"{stage}_batch_latency_ms"]
        scalars = {f"time/{stage}/batch_latency_ms_{k}": v for k, v in latency.items()}
        for key in ("sample_latency_ms", "samples_per_second"):
            scalars[f"time/{stage}/{key}"] = report[f"{stage}_{key}"]
        scalars.update({f"memory/{stage}/peak_mb/{label}": mb for label, mb in zip(labels, memory, strict=True)})
        self._publish(trainer, log_dir, report, scalars, step=0, title=stage)

    # -- shared ------------------------------------------------------------------------------

    def _memory_row(self, trainer: Trainer) -> list[float]:
        """This rank's ``(index, MiB)`` pairs, flattened; padded with NaN to the same width on
        every rank (a collective needs equal sizes), when there is more than one rank."""
        pairs = peak_memory_mb(self._device)
        if trainer.world_size > 1:
            width = max(1, trainer.num_devices)
            pairs = (pairs + [(NAN, NAN)] * width)[:width]
        return [x for pair in pairs for x in pair]

    def _publish(
        self,
        trainer: Trainer,
        log_dir: str | None,
        report: dict[str, Any],
        scalars: dict[str, float | None],
        step: int,
        title: str,
    ) -> None:
        """Rank 0: TensorBoard scalars, the merged ``timing.json`` and the printed table."""
        _log_scalars(trainer, scalars, step)
        if trainer.loggers and log_dir is not None:
            self.report = update_timing_json(Path(log_dir) / "timing.json", report)
        else:
            self.report = report
        print(format_table(report, title), flush=True)


def _log_scalars(trainer: Trainer, metrics: dict[str, float | None], step: int) -> None:
    """Rank 0 writes straight to the loggers: ``self.log`` is not allowed in the end hooks, and
    would average across ranks where the slowest rank is wanted."""
    present = {k: v for k, v in metrics.items() if v is not None and not math.isnan(v)}
    for logger in trainer.loggers:
        logger.log_metrics(present, step=step)


def _short_name(obj: object, suffix: str) -> str:
    """``DDPStrategy`` -> ``ddp``, ``CUDAAccelerator`` -> ``cuda``; a registered name if the class has one."""
    registered = getattr(type(obj), "strategy_name", None)
    return registered or type(obj).__name__.removesuffix(suffix).lower()


def _run_description(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    """What was run: the settings a reader needs to compare two ``timing.json`` files."""
    datamodule_hparams = getattr(trainer.datamodule, "hparams", {}) if trainer.datamodule is not None else {}
    return {
        "strategy": _short_name(trainer.strategy, "Strategy"),
        "accelerator": _short_name(trainer.accelerator, "Accelerator"),
        "devices": trainer.num_devices,
        "num_nodes": trainer.num_nodes,
        "world_size": trainer.world_size,
        "arch": pl_module.hparams.get("arch"),
        "image_size": datamodule_hparams.get("image_size"),
        "batch_size": datamodule_hparams.get("batch_size"),  # global: the data module splits it across ranks
        "precision": str(trainer.precision),
    }


def update_timing_json(path: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Merge ``report`` into the JSON file at ``path`` (fit and test each add their keys) and
    return the merged content. Written under a temporary name and renamed, so a reader (the
    bench) never sees half a file."""
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged.update(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(merged, indent=2) + "\n")
    os.replace(temporary, path)
    return merged


# --------------------------------------------------------------------------- the printed table


def _fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _mean_std(mean: float | None, std: float | None, unit: str, digits: int = 3) -> str:
    return _fmt(mean, unit, digits) + ("" if std is None else f" ± {std:.{digits}f}{unit}")


def format_table(report: dict[str, Any], stage: str) -> str:
    """A few lines for the terminal: the stage's headline numbers."""
    where = f"{report['strategy']}, {report['world_size']} process(es), {report['devices']} x {report['accelerator']}"
    lines = [f"Timing of {stage} ({where}, {report['precision']}, global batch {report['batch_size']})"]
    if stage == "fit":
        detail = (
            f"  (p50 {_fmt(report['iteration_seconds_p50'], ' s')}, p90 {_fmt(report['iteration_seconds_p90'], ' s')};"
            f" {report['warmup_iterations_skipped']} warm-up skipped)"
        )
        wait = report["data_wait_fraction"]
        rows = [
            ("fit total", _fmt(report["fit_seconds"], " s", 2)),
            ("first epoch", _fmt(report["first_epoch_seconds"], " s", 2)),
            (
                f"epoch (steady, n={report['steady_epochs']})",
                _mean_std(report["epoch_seconds_mean"], report["epoch_seconds_std"], " s", 2),
            ),
            ("iteration", _mean_std(report["iteration_seconds_mean"], report["iteration_seconds_std"], " s") + detail),
            ("data wait", "n/a" if wait is None else f"{100 * wait:.1f} % of epoch time"),
            ("throughput", _fmt(report["train_samples_per_second"], " samples/s (all ranks)", 1)),
            ("validation run", _fmt(report["val_epoch_seconds_mean"], " s", 2)),
        ]
        memory = zip(report["peak_memory_devices"], report["peak_memory_mb"], strict=True)
    else:
        latency = report[f"{stage}_batch_latency_ms"]
        rows = [
            ("batch latency", _mean_std(latency["mean"], latency["std"], " ms", 2)),
            ("  p50 / p90 / p99", " / ".join(_fmt(latency[k], " ms", 2) for k in ("p50", "p90", "p99"))),
            ("sample latency", _fmt(report[f"{stage}_sample_latency_ms"], " ms", 3)),
            ("throughput", _fmt(report[f"{stage}_samples_per_second"], " samples/s (all ranks)", 1)),
        ]
        memory = zip(report[f"{stage}_peak_memory_devices"], report[f"{stage}_peak_memory_mb"], strict=True)
    rows.append(("peak memory", ", ".join(f"{label} {_fmt(mb, ' MiB', 0)}" for label, mb in memory)))
    width = max(len(name) for name, _ in rows)
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)

"""Honest numbers that do not slow down what they measure (:class:`TimingCallback`): within an epoch or stage each rank
only *marks* the device's work (CUDA events, no wait); at its end the device is waited for once, the ranks exchange
their records, and rank 0 writes TensorBoard scalars, ``timing.json`` and a table. The figures: ``docs/timing.md``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.accelerators import CPUAccelerator

from project.toolkit.blocks import checked_blocks_or_none
from project.toolkit.data.input_path import data_wait_advice, machine_of
from project.toolkit.errors import ProjectError
from project.toolkit.helpers import tensor_bytes
from project.toolkit.interfaces import data_settings, image_data, layout_of
from project.toolkit.log import get_logger
from project.toolkit.timing import anatomy, flops, probes, records
from project.toolkit.timing.clocks import CudaEventClock, DeviceClock, HostClock, device_clock
from project.toolkit.timing.environment import run_environment
from project.toolkit.timing.network import network_profile
from project.toolkit.timing.records import InferenceRecorder, TrainRecorder, clean, peak_memory_mb
from project.toolkit.timing.report import (
    all_gather,
    batch_size_of,
    counted,
    epoch_end_step,
    estimate_line,
    log_scalars,
    run_description,
    update_timing_json,
)
from project.toolkit.timing.table import format_table

log = get_logger(__name__)


class TimingCallback(Callback):
    """Times epochs, iterations, data wait, validation, test/predict latency, the work done (FLOPs, MFU), where a
    step's time goes and peak memory on every rank; rank 0 reports them.

    Args:
        warmup_iterations: First training iterations (and test/predict batches) left out of the statistics.
        sync_every_step: Wait for the device at every batch boundary (fully synchronised per-step wall times,
            at the cost of the overlap they measure); off: CUDA events.
        peak_tflops: Dense peak TFLOP/s of ONE device at the run's precision, for MFU; null: looked up by name.
        anatomy_steps: Steady steps over which each rank's step is split into its parts (``step_anatomy``); 0: off.
        cpu_estimate_iterations: On a CPU, the training iterations after the first (which pays for start-up) timed
            to estimate the fit's time.
        cpu_estimate_min_minutes: Say that estimate, with the faster choices, only for a fit expected to take longer.
        target_acc: Validation accuracies (each in (0, 1]) whose time to reach the fit reports; none by default.
    """

    def __init__(
        self,
        warmup_iterations: int = 3,
        sync_every_step: bool = False,
        peak_tflops: float | None = None,
        anatomy_steps: int = 5,
        cpu_estimate_iterations: int = 3,
        cpu_estimate_min_minutes: float = 10.0,
        target_acc: list[float] | None = None,
    ):
        if warmup_iterations < 0:
            raise ProjectError(f"timing.warmup_iterations={warmup_iterations} is not allowed: it must be >= 0")
        if peak_tflops is not None and not peak_tflops > 0:
            raise ProjectError(f"timing.peak_tflops={peak_tflops} is not allowed: it must be a number > 0 or null")
        if anatomy_steps < 0:
            raise ProjectError(f"timing.anatomy_steps={anatomy_steps} is not allowed: it must be >= 0 (0: off)")
        if any(not 0 < t <= 1 for t in target_acc or []):
            raise ProjectError(f"timing.target_acc={target_acc} is not allowed: it must be a list of numbers in (0, 1]")
        self.warmup_iterations, self.anatomy_steps = warmup_iterations, anatomy_steps
        self.target_acc = sorted(set(target_acc or []))
        self.sync_every_step, self.peak_tflops = sync_every_step, peak_tflops
        self.cpu_estimate_iterations, self.cpu_estimate_min_minutes = cpu_estimate_iterations, cpu_estimate_min_minutes
        self._estimating = False  # a CPU fit's first steps: timed for the estimate_line
        self._estimate_from: tuple[float, int] | None = None  # (perf_counter, global step) the estimate counts from
        self.make_clock: Callable[[torch.device, bool], DeviceClock] = device_clock  # tests fake an async device
        self.report: dict[str, Any] = {}  # what rank 0 last wrote; empty on other ranks
        self._clock: DeviceClock = HostClock()
        self._device = torch.device("cpu")
        self._train = TrainRecorder(self._clock, 0.0)
        self._inference = InferenceRecorder(self._clock)
        self._epochs: list[dict[str, Any]] = []
        self._val_acc: list[tuple[int, float, float]] = []  # (epoch, val/acc, seconds since the fit's start) per run
        self._flops: dict[str, float] | None = None
        self._network: dict[str, Any] | None = None
        self._anatomy = anatomy.AnatomyWindow(self._clock, 0, 0)
        self._ddp_probe: probes.DDPProbe | None = None
        self._log_dir: str | None = None  # the run folder, asked by every rank at the end of a stage

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._device = trainer.strategy.root_device
        self._clock = self.make_clock(self._device, self.sync_every_step)
        if self._flops is None:  # before any strategy wraps or shards the network
            self._flops = counted(trainer, pl_module, flops.model_flops_per_sample)
        if stage == "fit" and self._network is None:  # bytes for the bandwidth; per block for python -m project plan
            blocks = checked_blocks_or_none(pl_module)
            units = [(block.name, block.module) for block in blocks] if blocks else None
            self._network = counted(trainer, pl_module, network_profile, blocks=units)
        if stage == "fit":  # the clock of fit_seconds starts here: the data is set up, the model not yet
            self._train = TrainRecorder(self._clock, self._clock.wait())
            self._epochs, self._val_acc = [], []
            self._anatomy = anatomy.AnatomyWindow(self._clock, self.anatomy_steps, self.warmup_iterations)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.anatomy_steps:  # the strategy has wrapped the model; no backward has run yet
            self._ddp_probe = probes.attach(self._anatomy, trainer, pl_module)
        self._estimating = isinstance(trainer.accelerator, CPUAccelerator) and not trainer.fast_dev_run
        self._estimate_from = None

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._train.start_epoch(self._clock.wait())
        self._anatomy.place(trainer.current_epoch, trainer.num_training_batches)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not self._train.in_epoch:  # resumed mid-epoch (no on_train_epoch_start); the anatomy takes the next epoch
            self._train.start_epoch(self._clock.wait())
        self._train.start_batch()
        self._anatomy.batch_start()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._train.end_batch(batch_size_of(batch))
        self._anatomy.batch_end(batch_idx)
        if self._estimating:
            self._estimate(trainer)

    def _estimate(self, trainer: Trainer) -> None:
        """After the first step and ``cpu_estimate_iterations`` more, one line if the fit will be long."""
        now, step = time.perf_counter(), trainer.global_step
        if self._estimate_from is None:
            self._estimate_from = (now, step) if step >= 1 else None
        elif step - self._estimate_from[1] >= max(1, self.cpu_estimate_iterations):
            self._estimating = False
            seconds_per_step = (now - self._estimate_from[0]) / (step - self._estimate_from[1])
            if line := estimate_line(trainer, seconds_per_step, self.cpu_estimate_min_minutes):
                log.warning(line)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        self._anatomy.point("backward_start")

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        end = self._anatomy.point("backward_end")
        if end is not None and self._ddp_probe is not None:
            self._ddp_probe.backward_ended(end)

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._anatomy.point("optimizer_start")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._train.start_validation(self._clock.wait())

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            now = self._clock.wait()
            self._train.end_validation(now)
            if (acc := trainer.callback_metrics.get("val/acc")) is not None:  # equal on every rank; read after the wait
                self._val_acc.append((trainer.current_epoch, float(acc), now - self._train.fit_start))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._anatomy.epoch_ended()
        gathered = self._gather(trainer, self._train.end_epoch(self._clock.wait()), "epoch")
        if gathered is None:
            return
        gathered_records, labels, memory, bubble, _ = gathered
        copies = layout_of(trainer.strategy).sample_copies
        epoch = records.summarise_epoch(trainer.current_epoch, gathered_records, copies)
        self._epochs.append(epoch)
        work = self._work(trainer, "train", epoch["samples_per_second"])
        metrics = {
            "time/train_epoch_seconds": epoch["seconds"],
            "time/train_samples_per_second": epoch["samples_per_second"],
            "time/data_wait_fraction": epoch["data_wait_seconds"] / epoch["seconds"] if epoch["seconds"] else None,
            "time/val_epoch_seconds": epoch["val_seconds"] or None,  # epochs without validation: no point
            "time/train_tflops_per_second": work["train_tflops_per_second"],
            "time/mfu": work["mfu"],
        }
        log_scalars(trainer, metrics | _memory_and_bubble("", labels, memory, bubble), step=epoch_end_step(trainer))

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        gathered = self._gather(trainer, self._train.fit_record(self._clock.wait(), self.warmup_iterations), "fit")
        if gathered is None:
            return
        gathered_records, labels, memory, bubble, step_anatomy = gathered
        report = {**run_description(trainer, pl_module)}
        numbers = records.summarise_fit(self._epochs, gathered_records)
        numbers.update(self._work(trainer, "train", numbers["train_samples_per_second"]))
        report.update({k: clean(v) if isinstance(v, float) else v for k, v in numbers.items()})
        report.update(peak_memory_mb=memory, peak_memory_devices=labels)
        if bubble is not None:  # a pipeline: each stage's share of its step time spent waiting, per rank
            report["bubble_fraction"] = [clean(v, 4) for v in bubble]
        if step_anatomy is not None:
            report["step_anatomy"] = step_anatomy
        if self._network is not None:
            state = sum(tensor_bytes(o.state) for o in trainer.optimizers)  # momentum, Adam's moments, ...
            report["network"] = {**self._network, "optimizer_state_bytes": state}
        scalars = {f"time/summary/{k}": v for k, v in report.items() if isinstance(v, float)}
        for rank, parts in enumerate(step_anatomy["ranks"] if step_anatomy else []):
            scalars.update({f"time/step_anatomy/{k}/rank{rank}": v for k, v in parts.items() if k in anatomy.FIELDS})
        scalars |= _memory_and_bubble("summary/", labels, memory, bubble)
        report.update(records.summarise_accuracy(self._val_acc, self.target_acc))  # val/acc is a scalar already
        self._publish(trainer, report, scalars, step=epoch_end_step(trainer), title="fit")
        path = data.input_path if (data := image_data(trainer)) is not None else None
        if advice := path and data_wait_advice(report["data_wait_fraction"], path, machine_of(trainer)):
            log.warning(advice)  # over a tenth of the epoch: say so, and what would help

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._inference = InferenceRecorder(self._clock)

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._inference.start_batch()

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        self._inference.end_batch(batch_size_of(batch))

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_inference(trainer, pl_module, "test")

    # predict is timed exactly as test is
    on_predict_start = on_test_start
    on_predict_batch_start = on_test_batch_start
    on_predict_batch_end = on_test_batch_end

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_inference(trainer, pl_module, "predict")

    def _finish_inference(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._clock.wait()
        gathered = self._gather(trainer, self._inference.record(self.warmup_iterations))
        if gathered is None:
            return
        gathered_records, labels, memory, _, _ = gathered
        copies = layout_of(trainer.strategy).sample_copies
        report = {**run_description(trainer, pl_module), **records.summarise_inference(stage, gathered_records, copies)}
        work = self._work(trainer, "inference", report[f"{stage}_samples_per_second"])
        report.update({f"{stage}_tflops_per_second": work["inference_tflops_per_second"], f"{stage}_mfu": work["mfu"]})
        report.update({f"{stage}_peak_memory_mb": memory, f"{stage}_peak_memory_devices": labels})
        if stage == "test" and (acc := trainer.callback_metrics.get("test/acc")) is not None:
            report["test_acc"] = clean(float(acc))
        scalars = {f"time/{stage}/batch_latency_ms_{k}": v for k, v in report[f"{stage}_batch_latency_ms"].items()}
        for key in ("sample_latency_ms", "samples_per_second", "tflops_per_second", "mfu"):
            scalars[f"time/{stage}/{key}"] = report[f"{stage}_{key}"]
        scalars |= _memory_and_bubble(f"{stage}/", labels, memory, None)
        self._publish(trainer, report, scalars, step=trainer.global_step, title=stage)

    def _gather(self, trainer: Trainer, record: Any, scope: str | None = None) -> tuple | None:
        """Every rank's record, its peak memory per device, at the end of an epoch or the fit (``scope``) its pipeline
        bubble, and of the fit its step anatomy: the collectives every rank calls. Rank 0, which reports, gets
        ``(records, labels, peak MiB, bubble, step_anatomy)``, the others None."""
        gather, root = all_gather(trainer.strategy), trainer.strategy.root_device
        memory, width = peak_memory_mb(self._device), max(1, trainer.num_devices)
        rows = records.gather_records(record, memory, trainer.world_size, gather, root, width)
        bubble, step_anatomy, meter = None, None, layout_of(trainer.strategy).bubble
        if scope and meter is not None:
            local = torch.tensor([records.nan_for_none(meter.fraction(scope))], device=root)
            bubble = [float(v) for v in gather(local).reshape(-1).cpu()]
        if scope == "fit" and self.anatomy_steps:  # where each rank's step time went, over a window of steady steps
            vectors = gather(torch.tensor(self._anatomy.vector(), dtype=torch.float64, device=root))
            clock = "cuda_events" if isinstance(self._clock, CudaEventClock) else "host"
            step_anatomy = anatomy.report(vectors.reshape(trainer.world_size, -1).tolist(), self._anatomy, clock)
            if step_anatomy is not None:  # how many cores a CPU step could use (python -m project plan reads it)
                step_anatomy["threads"] = torch.get_num_threads()
        self._log_dir = trainer.log_dir  # every rank must ask: Lightning broadcasts it from rank 0
        if not trainer.is_global_zero:
            return None
        labels, peaks = records.memory_entries([m for _, m in rows], self._device.type)
        return [r for r, _ in rows], labels, peaks, bubble, step_anatomy

    def _work(self, trainer: Trainer, kind: str, samples_per_second: float | None) -> dict[str, Any]:
        """TFLOP/s achieved by all devices at ``samples_per_second``, the peak used and the MFU."""
        per_sample = (self._flops or {}).get(kind)
        achieved = per_sample * samples_per_second / 1e12 if per_sample and samples_per_second else None
        device_tflops, peak_tbps = _device_peaks(self._device, str(trainer.precision))
        peak = self.peak_tflops or device_tflops
        all_devices = trainer.num_devices * trainer.num_nodes
        mfu = flops.mfu(achieved, peak * all_devices if peak else None)
        # Not rounded to a few decimals: on a CPU these are 1e-4 TFLOP/s and less.
        work = {f"{kind}_tflops_per_second": clean(achieved, 9), "peak_tflops": peak, "mfu": clean(mfu, 9)}
        batch = data_settings(trainer).get("batch_size")
        if kind == "train" and self._network is not None and samples_per_second and batch:
            moved = flops.training_traffic(
                self._network, str(trainer.precision), samples_per_second, samples_per_second / batch, all_devices
            )
            work["bandwidth_tb_per_second"] = clean(moved / 1e12, 9)
            work["peak_bandwidth_tb_per_second"] = peak_tbps
            work["bandwidth_fraction"] = clean(moved / 1e12 / (peak_tbps * all_devices), 6) if peak_tbps else None
        return work

    def _publish(self, trainer: Trainer, report: dict, scalars: dict, step: int, title: str) -> None:
        """Rank 0: TensorBoard scalars, the merged ``timing.json`` and the printed table."""
        log_scalars(trainer, scalars, step)
        report = {**report, "model_flops_per_sample": self._flops, "environment": run_environment()}
        if plan := layout_of(trainer.strategy).parallel_plan:  # fsdp's units, pipeline's stages
            report["parallel_plan"] = plan
        if trainer.loggers and self._log_dir is not None:
            self.report = update_timing_json(Path(self._log_dir) / "timing.json", report)
        else:
            self.report = report
        print(format_table(report, title), flush=True)


def _device_peaks(device: torch.device, precision: str) -> tuple[float | None, float | None]:
    """ONE device's dense peak TFLOP/s at ``precision`` and its memory bandwidth in TB/s; known for CUDA GPUs only."""
    if device.type != "cuda":
        return None, None
    from project.toolkit.timing import peaks  # GPU runs only

    return peaks.device_peak_tflops(device, precision), peaks.device_peak_tbps(device)


def _memory_and_bubble(scope: str, labels: list[str], memory: list, bubble: list[float] | None) -> dict[str, Any]:
    """Peak MiB per device and the pipeline bubble per rank as scalars: ``memory/<scope>peak_mb/<device>``, ..."""
    scalars = {f"memory/{scope}peak_mb/{label}": mb for label, mb in zip(labels, memory, strict=True)}
    return scalars | {f"time/{scope}bubble_fraction/rank{rank}": value for rank, value in enumerate(bubble or [])}

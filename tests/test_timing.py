"""The timing callback: its numbers against known sleeps and a stopwatch, across ranks, and what
it writes (timing.json, TensorBoard, the printed table)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, Dataset

from project.callbacks.timing import (
    TimingCallback,
    memory_entries,
    summarise_epoch,
    summarise_fit,
    summarise_inference,
)
from project.cli import main
from project.measure.devices import peak_memory_mb, synchronizer

# The reference for each figure is how long the sleeps really lasted, timed where they happen: on a
# busy machine a sleep can wake up late, and that is time the callback must count, not an error.
# A measured span also holds Lightning's own work around each batch (hooks, logging): a few ms on a
# quiet machine, 10-15 ms on a loaded CI runner. OVERHEAD_S bounds that per batch; it stays well
# under what a misplaced timer would add (a validation run inside an epoch is 2 x 0.2 s).
STEP_S = 0.2
VAL_STEP_S = 0.2
TEST_STEP_S = 0.1
LOAD_S = 0.1
OVERHEAD_S = 0.04
BATCHES = 5
VAL_BATCHES = 2
BATCH_SIZE = 8

REQUIRED_KEYS = {
    "strategy", "accelerator", "devices", "num_nodes", "world_size", "arch", "image_size", "batch_size",
    "precision", "epochs", "first_epoch_seconds", "epoch_seconds_mean", "epoch_seconds_std",
    "iteration_seconds_mean", "iteration_seconds_std", "iteration_seconds_p50", "iteration_seconds_p90",
    "data_wait_fraction", "train_samples_per_second", "fit_seconds", "val_epoch_seconds_mean",
    "test_batch_latency_ms", "test_sample_latency_ms", "test_samples_per_second", "peak_memory_mb",
}  # fmt: skip


def sleep(seconds: float, record: list[float]) -> None:
    """Sleep, and record how long it really took."""
    start = time.perf_counter()
    time.sleep(seconds)
    record.append(time.perf_counter() - start)


class Vectors(Dataset):
    """Random 4-vectors; with ``load_s`` the first item of every batch takes that long to load."""

    def __init__(self, length: int, load_s: float = 0.0) -> None:
        self.length, self.load_s = length, load_s
        self.loads: list[float] = []

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.load_s and index % BATCH_SIZE == 0:
            sleep(self.load_s, self.loads)
        return torch.randn(4)


class Sleepy(LightningModule):
    """Steps that take a known time: ``step_s`` per training batch, ``VAL_STEP_S`` per validation
    batch, ``TEST_STEP_S`` per test batch. The sleep stands for forward, backward and optimizer
    step, so the step does nothing else (manual optimization that never steps)."""

    def __init__(self, step_s: float = STEP_S) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.step_s = step_s
        self.layer = torch.nn.Linear(4, 2)
        self.slept: dict[str, list[float]] = {"train": [], "val": [], "test": []}

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        sleep(self.step_s, self.slept["train"])

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        sleep(VAL_STEP_S, self.slept["val"])

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        sleep(TEST_STEP_S, self.slept["test"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def sleepy_trainer(
    tmp_path: Path, callback: TimingCallback, epochs: int = 3, logger: bool = True, **options: object
) -> Trainer:
    return Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        limit_train_batches=BATCHES,
        limit_val_batches=VAL_BATCHES,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        logger=TensorBoardLogger(tmp_path, name="", version=0) if logger else False,
        callbacks=[callback],
        default_root_dir=tmp_path,
        **options,
    )


def loader(load_s: float = 0.0) -> DataLoader:
    return DataLoader(Vectors(BATCHES * BATCH_SIZE, load_s), batch_size=BATCH_SIZE)


def val_loader() -> DataLoader:
    return DataLoader(Vectors(VAL_BATCHES * BATCH_SIZE), batch_size=BATCH_SIZE)


def chunks(values: list[float], size: int) -> list[float]:
    """Sums of consecutive runs of ``size`` values: per-batch sleeps -> per-epoch totals."""
    return [sum(values[i : i + size]) for i in range(0, len(values), size)]


def assert_covers(measured: float, slept: float, batches: int = 1) -> None:
    """``measured`` holds all of ``slept`` and at most ``OVERHEAD_S`` per batch besides."""
    assert slept * 0.99 <= measured <= slept + batches * OVERHEAD_S, f"measured {measured}, slept {slept}"


def test_times_match_known_sleeps_and_a_stopwatch(tmp_path: Path) -> None:
    callback = TimingCallback(warmup_iterations=2)
    trainer = sleepy_trainer(tmp_path, callback)
    model = Sleepy()
    start = time.perf_counter()
    trainer.fit(model, loader(), val_loader())
    stopwatch = time.perf_counter() - start
    report = json.loads((tmp_path / "version_0" / "timing.json").read_text())
    steps = model.slept["train"]
    assert len(steps) == 3 * BATCHES and min(steps) >= STEP_S

    assert report["fit_seconds"] == pytest.approx(stopwatch, rel=0.05)
    assert_covers(report["iteration_seconds_mean"], statistics.fmean(steps[2:]))
    assert_covers(report["iteration_seconds_p50"], statistics.median(steps[2:]))
    assert report["iterations_measured"] == 3 * BATCHES - 2 and report["warmup_iterations_skipped"] == 2
    # an epoch is its training steps only: the validation sleeping inside it is not counted...
    assert [e["epoch"] for e in report["epochs"]] == [0, 1, 2]
    for epoch, slept in zip(report["epochs"], chunks(steps, BATCHES), strict=True):
        assert_covers(epoch["seconds"], slept, BATCHES)
        assert epoch["samples"] == BATCHES * BATCH_SIZE
    # ...but measured on its own
    assert_covers(
        report["val_epoch_seconds_mean"], statistics.fmean(chunks(model.slept["val"], VAL_BATCHES)), VAL_BATCHES
    )
    assert report["first_epoch_seconds"] == report["epochs"][0]["seconds"]
    steady = [e["seconds"] for e in report["epochs"][1:]]
    assert report["steady_epochs"] == 2
    assert report["epoch_seconds_mean"] == pytest.approx(statistics.fmean(steady), abs=1e-5)
    assert_covers(2 * BATCHES * BATCH_SIZE / report["train_samples_per_second"], sum(steps[BATCHES:]), 2 * BATCHES)
    assert report["data_wait_fraction"] < 0.05
    assert report["world_size"] == 1 and len(report["peak_memory_mb"]) == 1 and report["peak_memory_mb"][0] > 0

    tested = Sleepy()
    trainer.test(tested, DataLoader(Vectors(5 * BATCH_SIZE), batch_size=BATCH_SIZE))
    latencies = tested.slept["test"][2:]  # 5 batches, 2 of them warm-up
    merged = json.loads((tmp_path / "version_0" / "timing.json").read_text())
    assert merged["fit_seconds"] == report["fit_seconds"]  # the test's keys were added, the fit's kept
    assert merged["test_batches_measured"] == 3
    assert_covers(merged["test_batch_latency_ms"]["mean"] / 1000, statistics.fmean(latencies))
    assert_covers(merged["test_batch_latency_ms"]["p50"] / 1000, statistics.median(latencies))
    assert_covers(merged["test_sample_latency_ms"] * 3 * BATCH_SIZE / 1000, sum(latencies), 3)
    assert_covers(3 * BATCH_SIZE / merged["test_samples_per_second"], sum(latencies), 3)


def test_validation_in_the_middle_of_an_epoch_is_neither_training_nor_data_wait(tmp_path: Path) -> None:
    callback = TimingCallback(warmup_iterations=0)
    # validation after batches 2 and 4 of each epoch of 5
    trainer = sleepy_trainer(tmp_path, callback, epochs=2, logger=False, val_check_interval=0.4)
    model = Sleepy(step_s=0.1)
    trainer.fit(model, loader(), val_loader())
    report = callback.report
    assert len(model.slept["val"]) == 2 * 2 * VAL_BATCHES  # two validation runs per epoch
    for epoch, slept in zip(report["epochs"], chunks(model.slept["train"], BATCHES), strict=True):
        assert_covers(epoch["seconds"], slept, BATCHES)
    assert report["data_wait_fraction"] < 0.05
    assert_covers(
        report["val_epoch_seconds_mean"], statistics.fmean(chunks(model.slept["val"], VAL_BATCHES)), VAL_BATCHES
    )


def test_data_wait_is_nearly_all_of_an_epoch_when_loading_is_slow(tmp_path: Path) -> None:
    callback = TimingCallback(warmup_iterations=1)
    trainer = sleepy_trainer(tmp_path, callback, epochs=2)
    train = loader(load_s=LOAD_S)
    trainer.fit(Sleepy(step_s=0.0), train, val_loader())
    report = callback.report
    assert report["data_wait_fraction"] > 0.9
    assert report["iteration_seconds_mean"] < LOAD_S / 2  # the loading is not in the step
    loads = chunks(train.dataset.loads, BATCHES)
    assert_covers(report["epochs"][1]["seconds"], loads[1], BATCHES)  # but in the epoch, with the (short) steps


def test_without_a_logger_it_prints_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    callback = TimingCallback(warmup_iterations=0)
    trainer = sleepy_trainer(tmp_path, callback, epochs=1, logger=False)
    trainer.fit(Sleepy(step_s=0.01), loader(), val_loader())
    out = capsys.readouterr().out
    assert "Timing of fit" in out and "iteration" in out and "peak memory" in out
    assert callback.report["fit_seconds"] > 0
    assert callback.report["epoch_seconds_mean"] is None  # one epoch: no steady state to report
    assert not list(tmp_path.rglob("timing.json"))


def scalar_tags(run: Path) -> set[str]:
    tags: set[str] = set()
    for events in run.glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    return tags


def test_cli_reports_fit_and_test_into_one_run(tiny_args: list[str], tmp_path: Path, capsys) -> None:
    same_run = [
        "--trainer.logger.class_path=lightning.pytorch.loggers.TensorBoardLogger",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.logger.init_args.version=0",
    ]
    cli = main(["fit", *tiny_args, *same_run, "--trainer.max_epochs=2", "--trainer.limit_train_batches=3"])
    assert any(isinstance(c, TimingCallback) for c in cli.trainer.callbacks)  # on by default
    assert "Timing of fit" in capsys.readouterr().out
    main(["test", *tiny_args, *same_run, "--ckpt_path=last"])
    assert "Timing of test" in capsys.readouterr().out

    run = tmp_path / "lightning_logs" / "version_0"
    report = json.loads((run / "timing.json").read_text())
    assert REQUIRED_KEYS <= report.keys()
    assert (report["strategy"], report["accelerator"], report["world_size"], report["devices"]) == (
        "single_device",
        "cpu",
        1,
        1,
    )
    assert (report["arch"], report["image_size"], report["batch_size"]) == ("mobilenet_v2", 32, 20)
    assert report["precision"] == "32-true" and report["num_nodes"] == 1
    assert [(e["epoch"], e["samples"]) for e in report["epochs"]] == [(0, 60), (1, 60)]
    for key in ("first_epoch_seconds", "epoch_seconds_mean", "iteration_seconds_mean", "fit_seconds"):
        assert report[key] > 0, key
    assert report["fit_seconds"] > report["first_epoch_seconds"] + report["epoch_seconds_mean"]
    assert set(report["test_batch_latency_ms"]) == {"mean", "std", "p50", "p90", "p99"}
    assert report["test_batch_latency_ms"]["mean"] > 0 and report["test_samples_per_second"] > 0
    assert len(report["peak_memory_mb"]) == 1 and report["peak_memory_mb"][0] > 0

    tags = scalar_tags(run)
    expected = {
        "time/train_epoch_seconds",
        "time/data_wait_fraction",
        "time/val_epoch_seconds",
        "memory/peak_mb/rank0",
        "time/summary/fit_seconds",
        "time/summary/iteration_seconds_mean",
        "time/test/batch_latency_ms_p90",
        "memory/test/peak_mb/rank0",
    }
    assert expected <= tags, expected - tags


def test_bad_warmup_is_one_line(tiny_args: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args, "--timing.warmup_iterations=-1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: timing.warmup_iterations=-1")


@pytest.mark.slow
def test_two_ddp_processes_report_every_rank(tiny_args: list[str], tmp_path: Path) -> None:
    args = [a for a in tiny_args if not a.startswith("--trainer.devices")]
    command = [sys.executable, "-m", "project", "fit", *args, "--trainer.strategy=ddp", "--trainer.devices=2"]
    command += ["--trainer.max_epochs=2", "--trainer.limit_train_batches=3"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "lightning_logs" / "version_0" / "timing.json").read_text())
    assert report["strategy"] == "ddp" and report["world_size"] == 2 and report["devices"] == 2
    assert report["peak_memory_devices"] == ["rank0", "rank1"]
    assert len(report["peak_memory_mb"]) == 2 and min(report["peak_memory_mb"]) > 0
    # the global batch of 20 is split 10 + 10: an epoch counts the samples of both ranks
    assert [e["samples"] for e in report["epochs"]] == [60, 60]
    assert report["train_samples_per_second"] > 0
    assert result.stdout.count("Timing of fit") == 1  # printed by rank 0 only


# --------------------------------------------------------------------------- the parts on their own


def test_ranks_are_summarised_by_the_slowest_time_and_all_samples() -> None:
    nan = math.nan
    # rows: [seconds, samples, data-wait seconds, validation seconds] + (index, MiB) pairs
    epoch = summarise_epoch(1, [[2.0, 80, 0.5, 0.3, -1, 900.0], [3.0, 80, 0.2, 0.4, -1, 800.0]])
    assert (epoch["seconds"], epoch["samples"], epoch["samples_per_second"]) == (3.0, 160, 160 / 3.0)
    assert (epoch["data_wait_seconds"], epoch["val_seconds"]) == (0.5, 0.4)

    first = {"epoch": 0, "seconds": 9.0, "samples": 160, "samples_per_second": 160 / 9, "data_wait_seconds": 1.0}
    epochs = [{**first, "val_seconds": 0.1}, epoch, {**epoch, "epoch": 2, "seconds": 5.0}]
    # rows: [fit s, iteration mean, std, p50, p90, measured, skipped, validation mean]
    fit_rows = [[20.0, 0.10, 0.01, 0.10, 0.11, 30, 3, 0.3], [21.0, 0.12, 0.02, 0.12, 0.13, 30, 3, nan]]
    fit = summarise_fit(epochs, fit_rows)
    assert fit["first_epoch_seconds"] == 9.0  # kept out of the steady state:
    assert fit["epoch_seconds_mean"] == 4.0 and fit["epoch_seconds_std"] == pytest.approx(math.sqrt(2))
    assert fit["iteration_seconds_mean"] == 0.12 and fit["iteration_seconds_p90"] == 0.13  # rank 1 is slower
    assert fit["fit_seconds"] == 21.0 and fit["val_epoch_seconds_mean"] == 0.3
    assert fit["train_samples_per_second"] == pytest.approx(320 / 8.0)
    assert fit["data_wait_fraction"] == pytest.approx(1.0 / 8.0)

    # rows: [latency mean, std, p50, p90, p99 (s), batches, samples, seconds]
    test = summarise_inference(
        "test", [[0.02, 0.0, 0.02, 0.02, 0.02, 5, 50, 0.1], [0.04, 0, 0.04, 0.04, 0.04, 5, 50, 0.2]]
    )
    assert test["test_batch_latency_ms"]["mean"] == 40.0 and test["test_sample_latency_ms"] == 4.0
    assert test["test_samples_per_second"] == 500.0  # 100 samples over the slowest rank's 0.2 s


def test_memory_is_one_entry_per_device_used() -> None:
    nan = math.nan
    rows = [[0.0, 0, 900.0, 1, 300.0], [0.0, 1, 850.0, nan, nan]]  # rank 0 drove two GPUs, rank 1 one
    assert memory_entries(rows, 1, "cuda") == (["rank0_cuda0", "rank0_cuda1", "rank1_cuda1"], [900.0, 300.0, 850.0])
    assert memory_entries([[5.0, -1, 700.0]], 1, "cpu") == (["rank0"], [700.0])


def test_cpu_memory_is_the_process_peak_resident_size() -> None:
    status = Path("/proc/self/status").read_text()
    high_water_mb = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024
    [(index, mb)] = peak_memory_mb(torch.device("cpu"))
    assert index == -1 and mb == pytest.approx(high_water_mb, rel=0.05)


def test_cuda_memory_lists_every_gpu_the_process_used(monkeypatch: pytest.MonkeyPatch) -> None:
    peaks = {0: 3 * 2**30, 1: 0, 2: 2**30}  # as DataParallel leaves them: the root GPU holds more
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: peaks[i])
    assert peak_memory_mb(torch.device("cuda", 0)) == [(0, 3072.0), (2, 1024.0)]


def test_the_device_is_waited_for_where_it_runs_asynchronously(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("cuda", device)))
    synchronizer(torch.device("cuda", 1))()
    assert calls == [("cuda", torch.device("cuda", 1))]

    # torch_xla is imported only when the device is an XLA one: stand in for it here
    xla_model = types.SimpleNamespace(wait_device_ops=lambda: calls.append(("xla", None)))
    for name, module in {
        "torch_xla": types.ModuleType("torch_xla"),
        "torch_xla.core": types.ModuleType("torch_xla.core"),
        "torch_xla.core.xla_model": xla_model,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["torch_xla"].core = sys.modules["torch_xla.core"]
    sys.modules["torch_xla.core"].xla_model = xla_model
    synchronizer(torch.device("xla", 0))()
    assert calls[-1] == ("xla", None)

    assert synchronizer(torch.device("cpu")) is None  # a CPU's operations have finished when they return

"""The timing callback: its numbers against known sleeps and a stopwatch, across ranks, and what
it writes (timing.json, TensorBoard, the printed table)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, Dataset

from project.__main__ import main
from project.toolkit.callbacks.group import each_callback
from project.toolkit.timing.callback import TimingCallback
from project.toolkit.timing.records import (
    EpochRecord,
    FitRecord,
    InferenceRecord,
    gather_records,
    memory_entries,
    summarise_epoch,
    summarise_fit,
    summarise_inference,
)
from project.toolkit.timing.report import batch_size_of
from tests.support.fake_device import FakeAsyncDevice

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
    assert any(isinstance(c, TimingCallback) for c in each_callback(cli.trainer))  # on by default
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
    assert 0 <= report["last_val_acc"] <= report["best_val_acc"] <= 1  # val/acc: the same on every rank
    # the global batch of 20 is split 10 + 10: an epoch counts the samples of both ranks
    assert [e["samples"] for e in report["epochs"]] == [60, 60]
    assert report["train_samples_per_second"] > 0
    assert result.stdout.count("Timing of fit") == 1  # printed by rank 0 only
    # Ended by os._exit (project/toolkit/cli/process_exit.py), the run's TensorBoard file is whole: the last
    # epoch's val/acc is in it.
    (events,) = (tmp_path / "lightning_logs" / "version_0").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert len(accumulator.Scalars("val/acc")) == 2


# --------------------------------------------------------------------------- the parts on their own


def test_ranks_are_summarised_by_the_slowest_time_and_all_samples() -> None:
    nan = math.nan
    epoch = summarise_epoch(
        1,
        [
            EpochRecord(seconds=2.0, samples=80, data_wait_seconds=0.5, val_seconds=0.3),
            EpochRecord(seconds=3.0, samples=80, data_wait_seconds=0.2, val_seconds=0.4),
        ],
    )
    assert (epoch["seconds"], epoch["samples"], epoch["samples_per_second"]) == (3.0, 160, 160 / 3.0)
    assert (epoch["data_wait_seconds"], epoch["val_seconds"]) == (0.5, 0.4)

    first = {"epoch": 0, "seconds": 9.0, "samples": 160, "samples_per_second": 160 / 9, "data_wait_seconds": 1.0}
    epochs = [{**first, "val_seconds": 0.1}, epoch, {**epoch, "epoch": 2, "seconds": 5.0}]
    fit = summarise_fit(
        epochs,
        [
            FitRecord(20.0, 0.10, 0.01, 0.10, 0.11, iterations_measured=30, warmup_skipped=3, val_mean=0.3),
            FitRecord(21.0, 0.12, 0.02, 0.12, 0.13, iterations_measured=30, warmup_skipped=3, val_mean=nan),
        ],
    )
    assert fit["first_epoch_seconds"] == 9.0  # kept out of the steady state:
    assert fit["epoch_seconds_mean"] == 4.0 and fit["epoch_seconds_std"] == pytest.approx(math.sqrt(2))
    assert fit["iteration_seconds_mean"] == 0.12 and fit["iteration_seconds_p90"] == 0.13  # rank 1 is slower
    assert fit["fit_seconds"] == 21.0 and fit["val_epoch_seconds_mean"] == 0.3
    assert fit["train_samples_per_second"] == pytest.approx(320 / 8.0)
    assert fit["data_wait_fraction"] == pytest.approx(1.0 / 8.0)

    test = summarise_inference(
        "test",
        [
            InferenceRecord(0.02, 0.0, 0.02, 0.02, 0.02, batches=5, samples=50, seconds=0.1),
            InferenceRecord(0.04, 0.0, 0.04, 0.04, 0.04, batches=5, samples=50, seconds=0.2),
        ],
    )
    assert test["test_batch_latency_ms"]["mean"] == 40.0 and test["test_sample_latency_ms"] == 4.0
    assert test["test_samples_per_second"] == 500.0  # 100 samples over the slowest rank's 0.2 s


def test_memory_is_one_entry_per_device_used() -> None:
    # rank 0 drove two GPUs, rank 1 one
    memories = [[(0, 900.0), (1, 300.0)], [(1, 850.0)]]
    assert memory_entries(memories, "cuda") == (["rank0_cuda0", "rank0_cuda1", "rank1_cuda1"], [900.0, 300.0, 850.0])
    assert memory_entries([[(-1, 700.0)]], "cpu") == (["rank0"], [700.0])


def test_records_travel_between_ranks_by_name() -> None:
    """Two ranks' records through one all_gather of float rows, padded memory included."""
    mine = FitRecord(20.0, 0.1, nan := math.nan, 0.1, 0.1, 30, 3, nan)
    theirs = [21.0, 0.2, 0.0, 0.2, 0.2, 30, 3, 0.5, 1, 800.0, nan, nan]

    def all_gather(local: torch.Tensor) -> torch.Tensor:
        return torch.stack([local, torch.tensor(theirs, dtype=local.dtype)])

    [(first, first_memory), (second, second_memory)] = gather_records(
        mine, [(0, 900.0), (1, 300.0)], 2, all_gather, torch.device("cpu"), width=2
    )
    assert first.fit_seconds == 20.0 and first_memory == [(0, 900.0), (1, 300.0)]
    assert second == FitRecord(21.0, 0.2, 0.0, 0.2, 0.2, 30, 3, 0.5) and second_memory == [(1, 800.0)]


# --------------------------------------------------------------------------- an asynchronous device


def fit_on_fake_device(tmp_path: Path, batches: int, **options: object) -> tuple[FakeAsyncDevice, dict]:
    device = FakeAsyncDevice()
    options.setdefault("anatomy_steps", 0)  # the step anatomy's window waits twice more (tests/unit/test_anatomy.py)
    callback = TimingCallback(warmup_iterations=1, **options)
    callback.make_clock = lambda torch_device, sync_every_step: device
    trainer = sleepy_trainer(tmp_path, callback, epochs=2, logger=False)
    trainer.limit_train_batches = batches
    trainer.fit(Sleepy(step_s=0.0), loader(), val_loader())
    return device, callback.report


def test_no_wait_for_the_device_inside_an_epoch(tmp_path: Path) -> None:
    few, report = fit_on_fake_device(tmp_path / "few", batches=2)
    many, _ = fit_on_fake_device(tmp_path / "many", batches=5)
    # Waits only at the boundaries (setup, each epoch's start and end, each validation's start and
    # end, the end of fit): as many for 5 batches an epoch as for 2.
    assert few.waits == many.waits == 1 + 2 * (2 + 2) + 1
    # an epoch: a mark at its start, a start and an end mark per batch, a mark after its validation
    assert many.marks == 2 * (1 + 2 * 5 + 1)
    # within an epoch, every mark up to the validation was taken with no wait between: the waits seen at
    # those marks of one epoch are all the same number
    per_epoch = [many.waits_at_mark[i : i + 11] for i in (0, 12)]
    assert all(len(set(marks)) == 1 for marks in per_epoch)
    # the iteration times are assembled from the event pairs: each pair is 1 mark apart = 10 ms
    assert report["iteration_seconds_mean"] == pytest.approx(0.010)
    assert report["iteration_seconds_std"] == pytest.approx(0.0, abs=1e-12)
    assert report["iterations_measured"] == 2 * 2 - 1 and report["warmup_iterations_skipped"] == 1
    # so is the data wait, on the device's clock: the epoch's start to the first batch, and each batch's
    # end to the next one's start, each 1 mark apart
    assert [e["data_wait_seconds"] for e in report["epochs"]] == pytest.approx([0.020, 0.020])


def test_test_latencies_come_from_event_pairs_read_once(tmp_path: Path) -> None:
    device = FakeAsyncDevice()
    callback = TimingCallback(warmup_iterations=0)
    callback.make_clock = lambda torch_device, sync_every_step: device
    trainer = sleepy_trainer(tmp_path, callback, epochs=1, logger=False)
    trainer.test(Sleepy(), DataLoader(Vectors(4 * BATCH_SIZE), batch_size=BATCH_SIZE))
    assert device.marks == 2 * 4 and device.waits == 1  # one wait, at the end of the stage
    assert callback.report["test_batch_latency_ms"]["mean"] == pytest.approx(10.0)
    assert callback.report["test_samples_per_second"] == pytest.approx(4 * BATCH_SIZE / 0.040, rel=1e-3)


def test_sync_every_step_picks_a_clock_that_waits_at_every_mark() -> None:
    from project.toolkit.timing.clocks import CudaEventClock, HostClock, SyncingClock, device_clock

    assert type(device_clock(torch.device("cpu"))) is HostClock
    assert type(device_clock(torch.device("cuda", 0))) is CudaEventClock  # events: no host wait per step
    assert type(device_clock(torch.device("cuda", 0), sync_every_step=True)) is SyncingClock
    waits = []
    clock = SyncingClock(lambda: waits.append(1))
    clock.mark(), clock.mark()
    assert len(waits) == 2
    host = HostClock(lambda: waits.append(1))
    host.mark()
    assert len(waits) == 2  # a host clock marks without waiting


def test_work_and_environment_are_reported(tmp_path: Path, tiny_args: list[str]) -> None:
    main(["fit", *tiny_args, "--trainer.max_epochs=2"])
    report = json.loads(next(tmp_path.rglob("timing.json")).read_text())
    flops = report["model_flops_per_sample"]
    assert flops["train"] > flops["inference"] > 0
    assert report["train_tflops_per_second"] > 0
    assert report["mfu"] is None and report["peak_tflops"] is None  # a CPU: no peak, no guess
    assert {"device_name", "torch", "lightning", "git_commit", "date"} <= report["environment"].keys()


def test_an_injected_peak_gives_the_mfu(tmp_path: Path, tiny_args: list[str]) -> None:
    main(["fit", *tiny_args, "--timing.peak_tflops=0.5"])
    report = json.loads(next(tmp_path.rglob("timing.json")).read_text())
    assert report["peak_tflops"] == 0.5
    # both figures are rounded to 6 decimals in timing.json
    assert report["mfu"] == pytest.approx(report["train_tflops_per_second"] / 0.5, abs=2e-6)


class SlowFirstOfEachSize(Sleepy):
    """A test step that takes ``TEST_STEP_S`` but 10x as long for the first batch of each size, as a GPU's
    cuDNN autotuning makes it for a new shape."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: set[int] = set()

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        slow = len(batch) not in self.sizes
        self.sizes.add(len(batch))
        sleep(TEST_STEP_S * (10 if slow else 1), self.slept["test"])


def test_the_first_batch_of_a_new_size_is_left_out_of_the_inference_figures(tmp_path: Path) -> None:
    callback = TimingCallback(warmup_iterations=1)
    trainer = sleepy_trainer(tmp_path, callback, logger=False)
    model = SlowFirstOfEachSize()
    trainer.test(model, DataLoader(Vectors(3 * BATCH_SIZE + 2), batch_size=BATCH_SIZE))  # batches of 8, 8, 8, 2
    report = callback.report
    measured = model.slept["test"][1:3]  # the warm-up and the last batch (2 images, a new size) left out
    assert report["test_batches_measured"] == 2 and report["test_samples_measured"] == 2 * BATCH_SIZE
    assert_covers(report["test_batch_latency_ms"]["mean"] / 1000, statistics.fmean(measured))
    assert_covers(2 * BATCH_SIZE / report["test_samples_per_second"], sum(measured), 2)


def test_a_run_resumed_mid_epoch_times_that_epoch_from_its_first_batch(tiny_args: list[str], tmp_path: Path) -> None:
    """Lightning calls no on_train_epoch_start in an epoch it resumes in the middle; its time still starts there."""
    common = [*tiny_args, "--trainer.max_epochs=2", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=1"]
    common += ["--checkpoint.every_n_train_steps=1", "--trainer.callbacks+=tests.integration.test_data.BatchRecorder"]
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["fit", *common, "--trainer.callbacks.crash_at=3"])
    main(["fit", *common, "--ckpt_path=last"])
    timing = json.loads(sorted(tmp_path.glob("lightning_logs/version_*/timing.json"))[-1].read_text())
    (epoch,) = timing["epochs"]  # the resumed epoch 1, from its 4th batch
    assert epoch["epoch"] == 1 and epoch["samples"] == 2 * 20
    assert 0 < epoch["seconds"] <= timing["fit_seconds"] and 0 <= epoch["data_wait_seconds"] <= epoch["seconds"]


@pytest.mark.parametrize(
    "batch",
    [
        (torch.zeros(5, 3), torch.zeros(5)),
        [torch.zeros(4, 2), torch.zeros(3)],
        (torch.tensor(1.0), torch.zeros(6)),
        {"images": torch.zeros(2, 3)},
        ((torch.zeros(7, 1), torch.zeros(7)), torch.zeros(7)),
        torch.zeros(3, 2),
    ],
    ids=["images-labels", "list", "0-dim-first", "dict", "nested", "tensor"],
)
def test_a_batch_size_is_what_lightning_reads_from_the_batch(batch: object) -> None:
    from lightning.pytorch.utilities.data import extract_batch_size

    assert batch_size_of(batch) == extract_batch_size(batch)

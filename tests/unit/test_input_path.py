"""The input path a run takes by default (``--data.on_device=auto --data.num_workers=auto``): which path for
which machine and data size (the pure rule, nothing timed), that explicit options win, and that a run
says what it chose in ``timing.json`` and on the console, with a line when it waited for data."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from project.__main__ import main
from project.data import CIFAR10DataModule, ImageArrayDataModule
from project.toolkit.data.input_path import (
    DATA_WAIT_WARNING,
    MEMORY_SHARE,
    InputPath,
    Machine,
    choose_input_path,
    data_wait_advice,
    machine_of,
)
from project.toolkit.data.samplers import KeyBatches
from tests.support.data_modules import attach, make_dm

GiB = 2**30
CIFAR10_BYTES = 60_000 * 32 * 32 * 3 + 60_000 * 8  # uint8 images and int64 labels, every split
IMAGENET_BYTES = 150 * 10**9  # ImageNet-1k's training images as uint8 arrays at about 224 px

LAPTOP = Machine("cpu", memory_bytes=16 * GiB, cpus=8)
SMALL_VM = Machine("cpu", memory_bytes=2 * GiB, cpus=2)
H100 = Machine("cuda", memory_bytes=80 * GiB, cpus=16)
EIGHT_GPUS = Machine("cuda", memory_bytes=80 * GiB, cpus=32, processes=8)
SMALL_GPU = Machine("cuda", memory_bytes=4 * GiB, cpus=4)


@pytest.mark.parametrize(
    "machine, dataset_bytes, on_device, workers",
    [
        # a CPU run: the data set in the training process, augmented in batches; never workers
        (LAPTOP, CIFAR10_BYTES, True, 0),
        (SMALL_VM, CIFAR10_BYTES, True, 0),
        (LAPTOP, IMAGENET_BYTES, False, 0),  # too big for a quarter of the RAM: per-image, still no workers
        # a GPU: CIFAR-10 on the device; a set too big for it through workers, min(4, CPUs per process)
        (H100, CIFAR10_BYTES, True, 0),
        (H100, IMAGENET_BYTES, False, 4),
        (EIGHT_GPUS, CIFAR10_BYTES, True, 0),  # each process its own GPU: the budget is not split
        (EIGHT_GPUS, IMAGENET_BYTES, False, 4),
        (Machine("cuda", memory_bytes=80 * GiB, cpus=16, processes=8), IMAGENET_BYTES, False, 2),
        (Machine("cuda", memory_bytes=80 * GiB, cpus=4, processes=8), IMAGENET_BYTES, False, 1),  # at least one
        (SMALL_GPU, int(MEMORY_SHARE * 4 * GiB), True, 0),  # exactly the budget still fits
        (SMALL_GPU, int(MEMORY_SHARE * 4 * GiB) + 1, False, 4),
        # devices the rule does not put data on: XLA (untried there), memory unknown (mps)
        (Machine("xla", memory_bytes=16 * GiB, cpus=8), CIFAR10_BYTES, False, 4),
        (Machine("mps", memory_bytes=None, cpus=8), CIFAR10_BYTES, False, 4),
    ],
)
def test_auto_chooses_by_machine_and_data_size(machine: Machine, dataset_bytes: int, on_device: bool, workers: int):
    path = choose_input_path("auto", "auto", dataset_bytes, machine)
    assert (path.on_device, path.num_workers) == (on_device, workers), path.reason
    assert path.name == ("on_device" if on_device else "dataloader")


def test_the_ram_of_a_cpu_run_is_shared_by_the_processes_on_the_node() -> None:
    fits_one = int(MEMORY_SHARE * 8 * GiB * 0.75)  # fits one process's budget, not each of two
    one, two = (Machine("cpu", memory_bytes=8 * GiB, cpus=4, processes=n) for n in (1, 2))
    assert choose_input_path("auto", "auto", fits_one, one).on_device
    path = choose_input_path("auto", "auto", fits_one, two)
    assert not path.on_device and "shared by 2 processes" in path.reason


@pytest.mark.parametrize("machine", [LAPTOP, H100], ids=["cpu", "cuda"])
def test_explicit_options_win(machine: Machine) -> None:
    forced = choose_input_path(True, "auto", IMAGENET_BYTES, machine)  # even where auto would not
    assert (forced.on_device, forced.num_workers, forced.reason) == (True, 0, "data.on_device=true")
    loader = choose_input_path(False, "auto", CIFAR10_BYTES, machine)
    assert not loader.on_device and loader.reason.startswith("data.on_device=false")
    assert loader.num_workers == (0 if machine.device == "cpu" else 4)  # workers still auto
    for workers in (0, 3):  # any number asks for the DataLoader path, 0 included
        path = choose_input_path("auto", workers, CIFAR10_BYTES, machine)
        assert (path.on_device, path.num_workers) == (False, workers)
        assert path.reason == f"data.num_workers={workers} asks for the DataLoader path"
    assert choose_input_path(False, 3, CIFAR10_BYTES, machine).num_workers == 3


def test_the_reason_names_the_data_size_and_the_memory() -> None:
    reason = choose_input_path("auto", "auto", CIFAR10_BYTES, H100).reason
    assert (
        reason
        == "the data set (185 MB) fits in 25 % of the cuda device's memory (80 GiB): kept there, augmented in batches"
    )
    reason = choose_input_path("auto", "auto", IMAGENET_BYTES, LAPTOP).reason
    assert reason.startswith("the data set (150000 MB) is more than 25 % of the RAM (16 GiB); no workers: on a CPU run")


def test_data_wait_advice_names_the_option_that_would_help() -> None:
    assert data_wait_advice(None, InputPath(False, 0, ""), LAPTOP) is None  # no steady epoch measured
    assert data_wait_advice(DATA_WAIT_WARNING, InputPath(False, 0, ""), LAPTOP) is None  # 10 % is not over
    cpu = data_wait_advice(0.25, InputPath(False, 0, ""), LAPTOP)
    assert cpu.startswith("training waited for its input 25 % of the epoch time (dataloader, 0 workers); ")
    assert "--data.on_device=true" in cpu and "--data.num_workers" not in cpu  # workers would not help a CPU
    gpu = data_wait_advice(0.5, InputPath(False, 2, ""), H100)
    assert "--data.on_device=true" in gpu and gpu.endswith("or --data.num_workers=16")
    assert data_wait_advice(0.5, InputPath(False, 16, ""), H100).endswith(
        "(the data set on the cuda device, if it fits)"
    )
    on_device = data_wait_advice(0.2, InputPath(True, 0, ""), H100)
    assert "(on_device)" in on_device and "--data.image_size" in on_device and "--data.num_workers=N" in on_device


def test_machine_of_a_cpu_trainer_reads_ram_cpus_and_processes() -> None:
    dm = attach(CIFAR10DataModule(synthetic=True), world_size=2)
    machine = machine_of(dm.trainer)
    assert (machine.device, machine.processes) == ("cpu", 2)
    assert machine.memory_bytes > 2**28 and machine.cpus >= 1
    assert machine_of(None).processes == 1


@pytest.mark.parametrize(
    "options, on_device, workers",
    [
        ({}, True, 0),  # the defaults, on this CPU
        ({"on_device": False}, False, 0),
        ({"num_workers": 2}, False, 2),
        ({"num_workers": None}, True, 0),  # null: "automatic" in older configs and checkpoints
    ],
)
def test_the_data_module_takes_the_chosen_path(
    cifar_root: Path, options: dict[str, Any], on_device: bool, workers: int
):
    dm = attach(make_dm(cifar_root, **{"num_workers": "auto", **options}))
    dm.setup("fit")
    assert (dm.on_device, dm.num_workers) == (on_device, workers)
    assert ("train" in dm._on_device) == on_device  # the images were copied only on that path
    loader = dm.train_dataloader()
    # on the device: no DataLoader, batches of [index, dy, dx, flip] rows, made images after the transfer
    assert isinstance(loader, KeyBatches) if on_device else loader.num_workers == workers
    batch = next(iter(loader))
    images, labels = dm.on_after_batch_transfer(batch, dataloader_idx=0) if on_device else batch
    assert images.shape == (20, 3, 32, 32) and labels.shape == (20,)


def test_without_a_trainer_auto_takes_the_dataloader_path(cifar_root: Path) -> None:
    dm = make_dm(cifar_root, num_workers="auto")  # in a loop of one's own, with no on_after_batch_transfer
    dm.setup("fit")
    assert (dm.on_device, dm.num_workers) == (False, 0) and dm.input_path.reason.startswith("no Trainer")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (20, 3, 32, 32) and labels.shape == (20,)


def test_a_default_cpu_run_takes_the_batched_path_and_says_so(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_after_transfer = ImageArrayDataModule.on_after_batch_transfer

    def slow_input(self: ImageArrayDataModule, batch: Any, dataloader_idx: int) -> Any:
        if self.trainer.training:  # an input pipeline that makes training wait 0.5 s a batch (steps: ~0.05 s)
            time.sleep(0.5)
        return slow_after_transfer(self, batch, dataloader_idx)

    monkeypatch.setattr(ImageArrayDataModule, "on_after_batch_transfer", slow_input)
    defaults = [a for a in tiny_args if not a.startswith("--data.num_workers")]  # on_device, num_workers: auto
    cli = main(["fit", *defaults, "--trainer.max_epochs=2", "--trainer.limit_train_batches=2"])
    report = json.loads((Path(cli.trainer.log_dir) / "timing.json").read_text())
    assert (report["input_path"], report["num_workers"]) == ("on_device", 0)
    assert report["input_path_reason"].endswith(
        f"of the RAM ({machine_of(cli.trainer).memory_bytes / GiB:.0f} GiB): kept there, augmented in batches"
    )
    assert report["data_wait_fraction"] > DATA_WAIT_WARNING
    out, err = capsys.readouterr()
    assert "  input " in out and "on_device, 0 workers" in out  # the console's timing table
    (line,) = [line for line in err.splitlines() if line.startswith("training waited for its input")]
    assert "(on_device)" in line and "--data.image_size" in line

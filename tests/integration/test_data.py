"""The data module on generated official-format files: reading, checking, splitting, downloading;
augmentation that depends on (seed, epoch, image index) only, epochs that start mid-way, and
``on_device``."""

from __future__ import annotations

import pickle
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader

from project.__main__ import main
from project.data import (
    BASE_FOLDER,
    EpochIndex,
    TrainingSampler,
    download_cifar10,
    read_batch,
    read_label_names,
)
from project.data import cifar10 as data_module
from project.toolkit.data import KeyBatches, draw_crops_and_flips
from project.toolkit.errors import DataError
from tests.conftest import LABEL_NAMES, TEST_IMAGES, TRAIN_PER_FILE
from tests.integration.test_strategies import recorded, recorder_args
from tests.integration.test_strategy_runs import evaluate, metrics, run_project
from tests.support.data_modules import assert_same_batches, attach, make_dm


def copy_dataset(cifar_root: Path, tmp_path: Path) -> Path:
    shutil.copytree(cifar_root / BASE_FOLDER, tmp_path / BASE_FOLDER)
    return tmp_path


def test_read_batch_restores_images_from_the_official_layout(cifar_root: Path) -> None:
    images, labels = read_batch(cifar_root / BASE_FOLDER / "data_batch_1")
    assert images.shape == (TRAIN_PER_FILE, 32, 32, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and set(labels) == set(range(10))
    with open(cifar_root / BASE_FOLDER / "data_batch_1", "rb") as f:
        raw = pickle.load(f, encoding="bytes")[b"data"]
    # pixel (row 0, col 1) of image 0: red plane first, then green, then blue
    assert tuple(images[0, 0, 1]) == (raw[0, 1], raw[0, 1024 + 1], raw[0, 2048 + 1])


def test_label_names_come_from_batches_meta(cifar_root: Path) -> None:
    assert read_label_names(cifar_root / BASE_FOLDER / "batches.meta") == LABEL_NAMES


def test_setup_splits_a_seeded_validation_set(cifar_root: Path) -> None:
    dm = attach(make_dm(cifar_root))
    dm.setup("fit")
    assert {split: len(ds) for split, ds in dm._datasets.items()} == {"train": 5 * TRAIN_PER_FILE - 40, "val": 40}
    dm.setup("test")
    assert len(dm._datasets["test"]) == TEST_IMAGES
    again = attach(make_dm(cifar_root))
    again.setup("fit")
    assert np.array_equal(dm._datasets["val"].images, again._datasets["val"].images)
    other = attach(make_dm(cifar_root, split_seed=1))
    other.setup("fit")
    assert not np.array_equal(dm._datasets["val"].images, other._datasets["val"].images)
    assert dm.label_names == LABEL_NAMES


def test_loaders_give_normalised_batches_at_image_size(cifar_root: Path) -> None:
    dm = attach(make_dm(cifar_root, image_size=48))
    dm.setup("fit")
    dm.setup("test")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (20, 3, 48, 48) and images.dtype == torch.float32
    assert labels.shape == (20,) and labels.dtype == torch.int64
    assert -3 < images.mean() < 3 and images.min() < 0  # normalised, not raw 0..255 or 0..1
    test_images, _ = next(iter(dm.test_dataloader()))
    assert test_images.shape[-2:] == (48, 48)  # tested at the size it was trained at


def test_training_images_are_augmented_per_epoch_but_evaluation_images_are_not(cifar_root: Path) -> None:
    dm = attach(make_dm(cifar_root))
    dm.setup("fit")
    train, val = dm._datasets["train"], dm._datasets["val"]
    epochs = [torch.stack([train[EpochIndex(i, seed=0, epoch=e)][0] for i in range(20)]) for e in (0, 1)]
    plain = torch.stack([val.transform(torch.from_numpy(train.images[i]).permute(2, 0, 1)) for i in range(20)])
    assert (epochs[0] != plain).flatten(1).any(1).sum() > 10  # cropped or flipped: most images change
    assert (epochs[0] != epochs[1]).flatten(1).any(1).sum() > 10  # and differently each epoch
    assert torch.equal(val[3][0], val[3][0])
    with pytest.raises(TypeError, match="EpochIndex"):
        train[3]  # a plain index says nothing of the epoch


def images_by_index(loader: DataLoader, epoch: int) -> dict[int, torch.Tensor]:
    """Every image the loader gives in ``epoch``, keyed by its index (read from the sampler)."""
    loader.sampler.set_epoch(epoch)
    order = [int(i) for i in loader.sampler]
    images = torch.cat([batch[0] for batch in loader])
    return dict(zip(order, images, strict=False))  # drop_last: the order may be longer


def test_an_image_gets_the_same_augmentation_whatever_worker_loads_it(cifar_root: Path) -> None:
    loaders = []
    for workers in (0, 2):
        dm = attach(make_dm(cifar_root, num_workers=workers))
        dm.setup("fit")
        loaders.append(dm.train_dataloader())
    assert loaders[1].persistent_workers  # the workers outlive epoch 0: the epoch travels with the index
    for epoch in (0, 1):
        in_process, in_workers = (images_by_index(loader, epoch) for loader in loaders)
        assert in_process.keys() == in_workers.keys()
        for index, image in in_process.items():
            assert torch.equal(image, in_workers[index]), index
    train = dm._datasets["train"]
    index = next(iter(in_process))  # epoch 1's first image, read alone, after every other image
    assert torch.equal(train[EpochIndex(index, seed=0, epoch=1)][0], in_process[index])
    assert not torch.equal(train[EpochIndex(index, seed=0, epoch=0)][0], in_process[index])


def test_an_epoch_can_resume_at_any_batch_until_the_next_epoch(cifar_root: Path) -> None:
    dm = attach(make_dm(cifar_root))
    dm.setup("fit")
    loader = dm.train_dataloader()
    sampler = loader.sampler
    assert isinstance(sampler, TrainingSampler) and sampler.batch_size == 20
    sampler.set_epoch(3)
    order, batches = list(sampler), [images for images, _ in loader]
    sampler.set_epoch(0)
    sampler.resume_at(epoch=3, batches_done=5)
    assert list(sampler) == order[100:] and len(sampler) == len(order)  # the shard's length: Lightning counts
    assert all(torch.equal(a, b) for a, b in zip([images for images, _ in loader], batches[5:], strict=True))
    sampler.set_epoch(3)  # Lightning sets the epoch it resumes (after the callback has called resume_at)
    assert list(sampler) == order[100:]
    sampler.set_epoch(4)
    assert len(list(sampler)) == len(order)  # the next epoch is whole
    sampler.set_epoch(3)
    assert list(sampler) == order  # and so is epoch 3 run again
    with pytest.raises(ValueError, match="cannot resume after 9 batches: an epoch has 8 on this process"):
        sampler.resume_at(epoch=3, batches_done=9)


def test_on_device_training_batches_are_the_samplers_keys_and_resume_at_any_batch(cifar_root: Path) -> None:
    dm = attach(make_dm(cifar_root, on_device=True))
    dm.setup("fit")
    batches = dm.train_dataloader()
    assert isinstance(batches, KeyBatches)
    batches.sampler.set_epoch(3)  # as Lightning does, through the loader's sampler
    whole = list(batches)
    rows = torch.cat(whole)
    assert [len(batch) for batch in whole] == [20] * len(batches) and len(batches) == 8
    assert rows[:, 0].tolist() == [int(key) for key in batches.sampler][: len(rows)]  # the sampler's order
    table = draw_crops_and_flips(batches.sampler.seed, 3, len(dm._datasets["train"]))
    assert torch.equal(rows[:, 1:], torch.from_numpy(table[rows[:, 0].numpy()]))  # and epoch 3's crops and flips
    batches.sampler.resume_at(epoch=3, batches_done=5)
    resumed = list(batches)
    assert len(resumed) == 3 and all(torch.equal(a, b) for a, b in zip(resumed, whole[5:], strict=True))
    assert len(batches) == 8  # the whole shard's batches: Lightning counts the ones done
    batches.sampler.resume_at(epoch=3, batches_done=8)
    assert list(batches) == []  # saved after the epoch's last batch: nothing left, not one empty batch
    made_early = iter(batches)  # as Lightning makes it, before it sets the epoch of a resumed run
    batches.sampler.set_epoch(4)
    assert torch.equal(next(made_early), next(iter(batches)))  # epoch 4's first batch, whole


class BatchRecorder(Callback):
    """Records a checksum of every training batch; with ``crash_at`` fails at that batch of epoch 1.
    (The resume itself is the CLI's: project.reproducibility.ReseedEveryEpoch.)"""

    def __init__(self, crash_at: int = -1) -> None:
        self.crash_at, self.batches = crash_at, {}

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 1 and batch_idx == self.crash_at:
            raise RuntimeError("simulated crash")
        self.batches[trainer.current_epoch, batch_idx] = float(batch[0].double().sum())


def recorded_batches(cli: LightningCLI) -> dict[tuple[int, int], float]:
    return next(c for c in cli.trainer.callbacks if isinstance(c, BatchRecorder)).batches


@pytest.mark.slow
def test_on_device_resumed_mid_epoch_trains_on_the_batches_of_an_unbroken_one(tiny_args: list[str]) -> None:
    # With DataLoader workers, the same (and the final weights) is asserted in the kill -9 test of
    # tests/faults/test_faults.py.
    common = [*tiny_args, "--data.on_device=true", "--trainer.max_epochs=2", "--trainer.limit_train_batches=5"]
    common += ["--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0"]
    common += ["--checkpoint.every_n_train_steps=1", f"--trainer.callbacks+={__name__}.BatchRecorder"]
    unbroken = recorded_batches(main(["fit", *common]))
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["fit", *common, "--trainer.callbacks.crash_at=3"])
    resumed = recorded_batches(main(["fit", *common, "--ckpt_path=last"]))
    assert list(resumed) == [(1, 3), (1, 4)]  # epoch 1 from its 4th batch on
    assert resumed == {key: unbroken[key] for key in resumed}


def test_global_batch_is_split_across_processes(cifar_root: Path) -> None:
    dm = attach(make_dm(cifar_root, batch_size=20), world_size=2, rank=1)
    dm.setup("fit")
    assert dm.per_process_batch_size == 10
    loader = dm.train_dataloader()
    assert loader.batch_size == 10


@pytest.mark.parametrize("on_device", [False, True])
def test_ranks_see_disjoint_shards_reshuffled_per_epoch(cifar_root: Path, on_device: bool) -> None:
    orders = {}
    for rank in (0, 1):
        dm = attach(make_dm(cifar_root, on_device=on_device), world_size=2, rank=rank)
        dm.setup("fit")
        sampler = dm.train_dataloader().sampler
        sampler.set_epoch(0)
        first = list(sampler)
        sampler.set_epoch(1)
        second = list(sampler)
        sampler.resume_at(epoch=1, batches_done=2)
        orders[rank] = (first, second, list(sampler))
    assert not set(orders[0][0]) & set(orders[1][0])
    assert len(orders[0][0]) == len(orders[1][0]) == 80
    assert orders[0][0] != orders[0][1]
    assert all(order[2] == order[1][20:] for order in orders.values())  # 2 batches of 10 left out on each rank


def test_batch_size_that_does_not_divide_is_refused(cifar_root: Path) -> None:
    dm = attach(make_dm(cifar_root, batch_size=20), world_size=3)
    with pytest.raises(DataError, match=r"data.batch_size=20 .* 3 processes .* multiple of 3"):
        dm.setup("fit")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"image_size": 0}, "data.image_size=0"),
        ({"batch_size": -8}, "data.batch_size=-8"),
        ({"num_workers": -1}, "data.num_workers=-1"),
        ({"augmentation": "flip"}, "data.augmentation='flip' is not allowed: use crop_flip, random_resized_crop, none"),
        ({"resize_size": 24}, "data.resize_size=24 is not allowed: it must be an integer >= 32"),  # the crop's side
    ],
)
def test_bad_options_are_refused_at_construction(cifar_root: Path, options: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        make_dm(cifar_root, **options)


def test_val_size_larger_than_the_data_is_refused(cifar_root: Path) -> None:
    with pytest.raises(DataError, match=r"data.val_size=500 .* 200 training images"):
        attach(make_dm(cifar_root, val_size=500)).setup("fit")


def test_truncated_file_is_an_error_naming_it(cifar_root: Path, tmp_path: Path) -> None:
    root = copy_dataset(cifar_root, tmp_path)
    victim = root / BASE_FOLDER / "data_batch_3"
    victim.write_bytes(victim.read_bytes()[:5000])
    with pytest.raises(DataError, match=rf"{victim}: not a readable data file"):
        attach(make_dm(root)).setup("fit")


@pytest.mark.parametrize(
    "entry, message",
    [
        ({b"labels": [0]}, r"missing key\(s\) \['data'\]"),
        ({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, r"shape \(N, 3072\)"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "2 images but labels"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"labels must lie in 0..9"),
        ([1, 2, 3], "expected a dict"),
    ],
)
def test_malformed_file_is_an_error_naming_it(tmp_path: Path, entry: object, message: str) -> None:
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(DataError, match=rf"{path}: .*{message}"):
        read_batch(path)


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": shutil.rmtree, b"labels": []}, protocol=2))
    with pytest.raises(DataError, match="unexpected object shutil.rmtree"):
        read_batch(path)


def test_missing_data_without_download_says_where_it_looked_and_the_ways_out(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        make_dm(tmp_path / "nowhere").prepare_data()
    message = str(err.value)
    assert str(tmp_path / "nowhere" / BASE_FOLDER) in message
    assert "--data.data_dir" in message and "--data.synthetic=true" in message


def test_failed_download_says_why_and_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    target = tmp_path / "fresh"
    with pytest.raises(DataError) as err:
        make_dm(target, download=True).prepare_data()
    message = str(err.value)
    assert "download" in message and "Name or service not known" in message
    assert "--data.data_dir" in message and "--data.synthetic=true" in message
    assert not target.exists()


def test_download_verifies_and_unpacks_the_archive(tmp_path: Path, cifar_archive: tuple[Path, str]) -> None:
    archive, md5 = cifar_archive
    download_cifar10(tmp_path, url=archive.as_uri(), md5=md5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [BASE_FOLDER]  # no staging folder left
    dm = attach(make_dm(tmp_path))
    dm.prepare_data()  # already complete: nothing to do
    dm.setup("test")
    assert len(dm._datasets["test"]) == TEST_IMAGES


def test_prepare_data_downloads_when_files_are_missing(
    tmp_path: Path, cifar_archive: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, md5 = cifar_archive
    monkeypatch.setattr(data_module, "CIFAR10_URL", archive.as_uri())
    monkeypatch.setattr(data_module, "CIFAR10_MD5", md5)
    make_dm(tmp_path, download=True).prepare_data()
    assert (tmp_path / BASE_FOLDER / "test_batch").is_file()


def test_checksum_mismatch_keeps_no_partial_data(tmp_path: Path, cifar_archive: tuple[Path, str]) -> None:
    archive, _ = cifar_archive
    with pytest.raises(ValueError, match="checksum mismatch"):
        download_cifar10(tmp_path, url=archive.as_uri(), md5="0" * 32)
    assert list(tmp_path.iterdir()) == []


def test_a_download_interrupted_half_way_leaves_nothing_that_loads(
    tmp_path: Path, cifar_archive: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, md5 = cifar_archive
    real_urlopen = urllib.request.urlopen

    class DropsHalfWay:
        """The archive's first half, then the connection breaks."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.left = archive.read_bytes()[: archive.stat().st_size // 2]

        def __enter__(self) -> DropsHalfWay:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def read(self, size: int) -> bytes:
            if not self.left:
                raise ConnectionResetError("connection reset by peer")
            chunk, self.left = self.left[:size], self.left[size:]
            return chunk

    monkeypatch.setattr(data_module, "CIFAR10_URL", archive.as_uri())
    monkeypatch.setattr(data_module, "CIFAR10_MD5", md5)
    monkeypatch.setattr(urllib.request, "urlopen", DropsHalfWay)
    with pytest.raises(DataError, match="connection reset by peer"):
        make_dm(tmp_path, download=True).prepare_data()
    assert list(tmp_path.iterdir()) == []  # no partial data set, no staging folder

    monkeypatch.setattr(urllib.request, "urlopen", real_urlopen)
    dm = attach(make_dm(tmp_path, download=True))
    dm.prepare_data()  # the next start downloads again
    dm.setup("test")
    assert len(dm._datasets["test"]) == TEST_IMAGES


def test_two_processes_downloading_at_once_both_succeed(
    tmp_path: Path, cifar_archive: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks (or two runs) preparing the same data_dir: both download, then both find the data
    missing and rename their copy into place at the same moment. One rename wins; the other must
    see a complete data set in its way and succeed, not fail or leave its copy behind."""
    archive, md5 = cifar_archive
    both_checked = threading.Barrier(2, timeout=30)
    real_missing_files = data_module.missing_files

    def missing_files_in_step(root: Path) -> list[str]:
        missing = real_missing_files(root)
        if missing and threading.current_thread().name.startswith("downloader"):
            both_checked.wait()  # neither renames before both have looked
        return missing

    monkeypatch.setattr(data_module, "missing_files", missing_files_in_step)
    errors: list[BaseException] = []

    def download() -> None:
        try:
            download_cifar10(tmp_path, url=archive.as_uri(), md5=md5)
        except BaseException as err:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=download, name=f"downloader-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [BASE_FOLDER]
    assert real_missing_files(tmp_path / BASE_FOLDER) == []


def test_incomplete_folder_is_not_overwritten(cifar_root: Path, tmp_path: Path) -> None:
    root = copy_dataset(cifar_root, tmp_path)
    (root / BASE_FOLDER / "data_batch_2").unlink()
    with pytest.raises(DataError, match=r"incomplete \(missing data_batch_2\); delete that folder"):
        make_dm(root, download=True).prepare_data()
    assert (root / BASE_FOLDER / "data_batch_1").is_file()


def test_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    with pytest.raises(DataError, match=rf"data.data_dir={path} is a file"):
        make_dm(path, download=True).prepare_data()


def test_synthetic_data_needs_no_files(tmp_path: Path) -> None:
    dm = attach(make_dm(tmp_path / "never-created", synthetic=True, synthetic_size=100, val_size=10))
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    assert {k: len(v) for k, v in dm._datasets.items()} == {"train": 90, "val": 10, "test": 20}
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (20, 3, 32, 32) and int(labels.max()) < 10
    assert not (tmp_path / "never-created").exists()


# --------------------------------------------------------------------------- on_device


@pytest.mark.parametrize("world_size, rank", [(1, 0), (2, 1)])
def test_on_device_gives_the_images_of_the_default_path(cifar_root: Path, world_size: int, rank: int) -> None:
    default, on_device = (
        attach(make_dm(cifar_root, image_size=48, on_device=flag), world_size, rank) for flag in (False, True)
    )
    for dm in (default, on_device):
        dm.setup("fit")
        dm.setup("test")
    assert on_device._on_device["train"][0].shape == (160, 32, 32, 3)  # uint8 as the arrays come, on the (CPU) device
    assert_same_batches(default, on_device, epoch=2)
    # evaluation batches are slices of the images on the device: no DataLoader, no worker processes
    batches = list(on_device.test_dataloader())
    assert batches and all(isinstance(batch, slice) for batch in batches)


def test_on_device_fit_equals_the_default_one_and_evaluates(tiny_args: list[str], tmp_path: Path) -> None:
    common = [*tiny_args, "--trainer.max_epochs=2", "--trainer.limit_train_batches=3", "--trainer.deterministic=true"]
    fits = {
        flag: main(["fit", *common, f"--data.on_device={flag}", f"--trainer.default_root_dir={tmp_path / flag}"])
        for flag in ("false", "true")
    }
    weights = {flag: cli.model.state_dict() for flag, cli in fits.items()}
    for name, expected in weights["false"].items():  # the same images, so the same training
        torch.testing.assert_close(weights["true"][name], expected, rtol=0, atol=0, msg=name)
    val_acc = {flag: cli.trainer.callback_metrics["val/acc"] for flag, cli in fits.items()}
    assert val_acc["true"] == val_acc["false"]

    root = [f"--trainer.default_root_dir={tmp_path / 'true'}", "--data.on_device=true", "--ckpt_path=last"]
    tested = main(["test", *common, *root]).trainer.callback_metrics
    assert {"test/loss", "test/acc"} <= tested.keys()
    predicted = main(["predict", *common, *root])
    with open(Path(predicted.trainer.log_dir) / "predictions.csv") as f:
        assert len(f.readlines()) == 1 + TEST_IMAGES


@pytest.mark.slow
def test_on_device_under_two_process_ddp_shards_training_and_evaluates_every_image_once(
    tiny_args: list[str], tmp_path: Path
) -> None:
    common = [*tiny_args, "--data.on_device=true", "--data.val_size=41", "--trainer.strategy=ddp"]
    common += ["--trainer.devices=2", "--trainer.num_sanity_val_steps=0"]
    out = tmp_path / "records"
    run_project(
        "fit", *common, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", *recorder_args(out), cwd=tmp_path
    )
    ranks = [recorded(out, "fit", rank) for rank in (0, 1)]
    shards = [set(r["train_order"][0]) for r in ranks]
    assert not shards[0] & shards[1] and len(shards[0]) == len(shards[1]) == 79  # 159 images: one sits out
    assert all(r["batch_sizes"] == [10, 10] for r in ranks)  # the global batch of 20, split
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert metrics(out, "fit", "val") == pytest.approx(evaluate(last, "val"), rel=1e-5)

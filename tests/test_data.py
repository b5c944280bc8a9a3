"""The data module on generated official-format files: reading, checking, splitting, downloading."""

from __future__ import annotations

import pickle
import shutil
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from project import data as data_module
from project.data import (
    BASE_FOLDER,
    CIFAR10DataModule,
    build_transform,
    download_cifar10,
    read_batch,
    read_label_names,
)
from project.errors import DataError
from tests.conftest import LABEL_NAMES, TEST_IMAGES, TRAIN_PER_FILE


def make_dm(root: Path, **kwargs) -> CIFAR10DataModule:
    options = dict(data_dir=str(root), download=False, image_size=32, batch_size=20, val_size=40, num_workers=0)
    return CIFAR10DataModule(**{**options, **kwargs})


def attach(dm: CIFAR10DataModule, world_size: int = 1, rank: int = 0) -> CIFAR10DataModule:
    """Give the data module the few trainer attributes it reads, as a run of `world_size` would."""
    dm.trainer = SimpleNamespace(world_size=world_size, global_rank=rank, num_devices=world_size, accelerator=None)
    return dm


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


def test_train_augmentation_crops_and_flips_but_evaluation_does_not() -> None:
    image = torch.arange(3 * 32 * 32, dtype=torch.int64).reshape(3, 32, 32).to(torch.uint8)
    train, evaluate = build_transform(32, train=True), build_transform(32, train=False)
    torch.manual_seed(0)
    assert any(not torch.equal(train(image), train(image)) for _ in range(5))
    assert torch.equal(evaluate(image), evaluate(image))
    assert build_transform(112, train=True)(image).shape == (3, 112, 112)


def test_global_batch_is_split_across_processes(cifar_root: Path) -> None:
    dm = attach(make_dm(cifar_root, batch_size=20), world_size=2, rank=1)
    dm.setup("fit")
    assert dm.per_process_batch_size == 10
    loader = dm.train_dataloader()
    assert loader.batch_size == 10


def test_ranks_see_disjoint_shards_reshuffled_per_epoch(cifar_root: Path) -> None:
    orders = {}
    for rank in (0, 1):
        dm = attach(make_dm(cifar_root), world_size=2, rank=rank)
        dm.setup("fit")
        sampler = dm.train_dataloader().sampler
        sampler.set_epoch(0)
        first = list(sampler)
        sampler.set_epoch(1)
        orders[rank] = (first, list(sampler))
    assert not set(orders[0][0]) & set(orders[1][0])
    assert orders[0][0] != orders[0][1]


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
    with pytest.raises(DataError, match=rf"{victim}: not a readable CIFAR-10 file"):
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

    monkeypatch.setattr(data_module.urllib.request, "urlopen", offline)
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

"""Tar shards as a folder data set's splits (``project/data/shards.py``): the images of class folders packed into
plain tars, or WebDataset's ``KEY.jpg`` + ``KEY.cls``, read in place by offset; the same run as from the folder."""

from __future__ import annotations

import csv
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from project.__main__ import main
from project.data import ImageFolderDataModule
from project.data.shards import Member, scan_shards
from project.toolkit.errors import DataError
from tests.support.data_modules import attach
from tests.support.image_folders import CLASSES, image_folder


def pack(split: Path, out: Path, shards: int = 2, webdataset: bool = False) -> list[Path]:
    """``split``'s class folders as ``shards`` tars in ``out``, the files dealt out in turn: ``class/file`` members
    (as ``tar cf`` of the folder), or WebDataset's ``KEY.ext`` and ``KEY.cls`` (the class's number)."""
    out.mkdir(parents=True)
    files = sorted(p for p in split.rglob("*") if p.is_file())
    paths = [out / f"{split.name}-{n:04d}.tar" for n in range(shards)]
    tars = [tarfile.open(path, "w") for path in paths]
    for n, file in enumerate(files):
        tar, label = tars[n % shards], CLASSES.index(file.parent.name)
        if not webdataset:
            tar.add(file, arcname=f"./{file.parent.name}/{file.name}")
            continue
        key = f"{label}{file.stem}"
        tar.add(file, arcname=f"{key}{file.suffix}")
        number = f"{label}\n".encode()
        info = tarfile.TarInfo(f"{key}.cls")
        info.size = len(number)
        tar.addfile(info, io.BytesIO(number))
    for tar in tars:
        tar.close()
    return paths


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_folder(tmp_path_factory.mktemp("photos"), train=20, test=6)


@pytest.fixture(scope="module")
def sharded(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    for split in ("train", "test"):
        pack(photos / split, root / split, shards=3)
    return root


def module(root: Path, **options) -> ImageFolderDataModule:
    return attach(ImageFolderDataModule(str(root), image_size=24, batch_size=8, num_workers=0, **options))


def test_shards_give_the_folders_images_labels_and_classes(photos: Path, sharded: Path) -> None:
    folder, shards = module(photos), module(sharded)
    for dm in (folder, shards):
        dm.setup("fit")
        dm.setup("test")
    assert shards.label_names == folder.label_names == list(CLASSES)
    for split in ("train", "val", "test"):
        a, b = folder._datasets[split], shards._datasets[split]
        assert len(a) == len(b) > 0 and np.array_equal(a.labels, b.labels)
        assert all(np.array_equal(a.images[i], b.images[i]) for i in range(len(a))), split
    assert shards.predict_names[0] == "test/test-0000.tar:horizontal/0000.png"
    assert shards.state_dict()["mean"] == folder.state_dict()["mean"]


def test_webdataset_shards_take_their_classes_from_cls_members(photos: Path, tmp_path: Path) -> None:
    pack(photos / "train", tmp_path / "train", shards=2, webdataset=True)
    members, labels, names = scan_shards(tmp_path / "train")
    assert names == ["0", "1"] and len(members) == 40 and labels.tolist() == [0] * 20 + [1] * 20
    assert all(
        isinstance(m, Member) and m.name.startswith(str(label)) for m, label in zip(members, labels, strict=True)
    )
    assert module(tmp_path, classes=["horizontal", "vertical"]).label_names == ["horizontal", "vertical"]


def test_a_run_on_shards_ends_with_the_weights_of_the_run_on_the_folder(
    photos: Path, sharded: Path, tmp_path: Path
) -> None:
    args = ["--data=project.data.ImageFolderDataModule", "--data.image_size=16", "--data.batch_size=8"]
    args += ["--data.num_workers=1", "--model.arch=tests.support.user_nets.sequential_convnet", "--seed_everything=3"]
    args += ["--trainer.max_epochs=2", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"]
    weights = []
    for name, root in (("folder", photos), ("shards", sharded)):
        out = tmp_path / name
        main(["fit", *args, f"--data.data_dir={root}", f"--trainer.default_root_dir={out}"])
        main(["predict", f"--data.data_dir={root}", f"--trainer.default_root_dir={out}", "--ckpt_path=last"])
        last = torch.load(next(out.glob("lightning_logs/version_0/checkpoints/last.ckpt")), weights_only=True)
        weights.append(last["state_dict"])
        rows = list(csv.DictReader(open(next(out.glob("lightning_logs/version_1/predictions.csv")))))
        assert len(rows) == 12
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_each_wrong_shard_is_one_line(photos: Path, tmp_path: Path) -> None:
    def split_with(name: str, write) -> Path:
        folder = tmp_path / name / "train"
        folder.mkdir(parents=True)
        write(folder)
        return folder

    def compressed(folder: Path) -> None:
        with tarfile.open(folder / "a.tar", "w:gz") as tar:
            tar.add(photos / "train" / "vertical" / "0001.jpg", arcname="vertical/0001.jpg")

    def loose(folder: Path) -> None:
        with tarfile.open(folder / "a.tar", "w") as tar:
            tar.add(photos / "train" / "vertical" / "0001.jpg", arcname="0001.jpg")

    def half_labelled(folder: Path) -> None:
        pack(photos / "train", folder / "x", shards=1, webdataset=True)
        with tarfile.open(folder / "x" / "train-0000.tar", "a") as tar:
            tar.add(photos / "train" / "vertical" / "0001.jpg", arcname="extra.jpg")
        (folder / "x" / "train-0000.tar").rename(folder / "b.tar")
        (folder / "x").rmdir()

    def truncated(folder: Path) -> None:
        data = (photos / "train" / "vertical" / "0001.jpg").read_bytes()[:-200]
        with tarfile.open(folder / "a.tar", "w") as tar:
            info = tarfile.TarInfo("vertical/0001.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            info = tarfile.TarInfo("horizontal/0002.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    cases = {
        "compressed": (compressed, r"a\.tar is not a readable plain tar file .*; shards must be uncompressed \.tar"),
        "loose": (loose, r"a\.tar:0001\.jpg is in no class folder and has no \.cls beside it"),
        "half": (half_labelled, r"b\.tar:extra\.jpg has no extra\.cls beside it \(of 1 image\(s\) without a class\)"),
        "truncated": (truncated, r"2 image files cannot be read: .*a\.tar:horizontal/0002\.jpg \(a truncated JPEG"),
    }
    for name, (write, message) in cases.items():
        split_with(name, write)
        with pytest.raises(DataError, match=message):
            dm = module(tmp_path / name)
            dm.setup("fit")


def test_a_member_is_read_by_its_offset(sharded: Path) -> None:
    members, _, _ = scan_shards(sharded / "train")
    with tarfile.open(members[5].shard) as tar:
        whole = tar.extractfile(members[5].name.join(["./", ""])).read()
    assert members[5].read() == whole and members[5].read(-10) == whole[-10:] and members[5].read(0, 8) == whole[:8]
    assert np.array_equal(np.frombuffer(members[5].open().read(), np.uint8), np.frombuffer(whole, np.uint8))

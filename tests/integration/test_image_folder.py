"""``ImageFolderDataModule``: a folder of JPEG and PNG files in class folders, decoded in DataLoader workers,
under every strategy, and one line for each way the folder can be wrong."""

from __future__ import annotations

import csv
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from project.data import ImageFiles, ImageFolderDataModule
from project.toolkit.errors import DataError
from tests.integration.test_strategy_runs import run_project
from tests.support.data_modules import attach
from tests.support.image_folders import CLASSES, image_folder, write_split

FOLDER = "--data=project.data.ImageFolderDataModule"
NET = "--model.arch=tests.support.user_nets.sequential_convnet"


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 training and 10 test files per class; a third grey PNGs, the rest colour JPEGs, 20-47 px."""
    return image_folder(tmp_path_factory.mktemp("photos"))


def folder_dm(root: Path, **options) -> ImageFolderDataModule:
    return ImageFolderDataModule(data_dir=str(root), **{"image_size": 24, "batch_size": 8, "num_workers": 0, **options})


@pytest.mark.parametrize("channels", [1, 3])
def test_files_become_batches_of_the_asked_size_and_channels(photos: Path, channels: int) -> None:
    dm = attach(folder_dm(photos, channels=channels, num_workers=1))
    dm.setup("fit")
    dm.setup("test")
    assert dm.num_classes == 2 and dm.label_names == list(CLASSES) and dm.in_channels == channels
    assert {split: len(ds) for split, ds in dm._datasets.items()} == {"train": 72, "val": 8, "test": 20}
    assert not dm.on_device and dm.num_workers == 1 and "decoded from files" in dm.input_path.reason
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        images, labels = next(iter(loader))
        assert images.shape == (8, channels, 24, 24) and images.dtype == torch.float32
        assert set(labels.tolist()) <= {0, 1}
    assert dm.predict_names[:2] == ["test/horizontal/0000.png", "test/horizontal/0001.jpg"]
    stats = dm.state_dict()
    assert len(stats["mean"]) == channels and all(0 < s <= 1 for s in stats["std"])


def test_images_are_decoded_only_when_read(photos: Path) -> None:
    files = ImageFiles(sorted((photos / "train" / "vertical").glob("*")), size=16, channels=3, root=photos)
    subset = files.subset([3, 0])
    assert isinstance(subset, ImageFiles) and subset.paths == [files.paths[3], files.paths[0]]
    assert files.shape == (40, 16, 16, 3) and files.nbytes == 40 * 16 * 16 * 3
    one, two = files[0], subset[np.array([1, 0])]  # one: the whole photo; several: their centre squares
    assert one.dtype == np.uint8 and min(one.shape[:2]) == 16 and one.shape[2] == 3
    top, left = round((one.shape[0] - 16) / 2), round((one.shape[1] - 16) / 2)  # as torchvision centre-crops
    assert np.array_equal(two[0], one[top : top + 16, left : left + 16]) and two.shape == (2, 16, 16, 3)


def test_training_sees_the_whole_photo_and_evaluation_its_centre_as_resize_size_says(photos: Path) -> None:
    dm = attach(folder_dm(photos, image_size=16, resize_size=20, augmentation="random_resized_crop"))
    dm.setup("fit")
    train, val = dm._datasets["train"], dm._datasets["val"]
    whole = [train.images[i] for i in range(8)]  # as decoded: shorter side 20, not cropped to a square
    assert {min(image.shape[:2]) for image in whole} == {20} and any(max(image.shape[:2]) > 20 for image in whole)
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (8, 3, 16, 16)
    photo = torch.from_numpy(np.array(Image.open(val.images.paths[0]).convert("RGB"))).permute(2, 0, 1)
    steps = [v2.Resize(20, antialias=True), v2.CenterCrop(16), v2.ToDtype(torch.float32, scale=True)]
    expected = v2.Compose([*steps, v2.Normalize(*dm.channel_stats)])(photo)  # weights.transforms()'s steps
    torch.testing.assert_close(val[0][0], expected, rtol=0, atol=1e-5)


class Lines(logging.Handler):
    """The lines a logger says, whether or not it propagates (the project's does not once main() ran here)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_files_other_than_images_are_counted_and_named_once(tmp_path: Path) -> None:
    root = image_folder(tmp_path, train=3, test=1)
    (root / "train" / "vertical" / "anim.gif").write_bytes(b"GIF89a")
    (root / "train" / "horizontal" / "notes.txt").write_text("not an image")
    logger, said = logging.getLogger("project.data.folder"), Lines()
    logger.addHandler(said)
    try:
        dm = attach(folder_dm(root, batch_size=2))
        dm.setup("fit")  # lists the files again: said once
    finally:
        logger.removeHandler(said)
    assert [line for line in said.lines if "skipped" in line] == [
        f"{root / 'train'}: 2 file(s) skipped, not .jpg/.jpeg/.png: horizontal/notes.txt, vertical/anim.gif "
        "(6 images used)"
    ]


def test_a_val_folder_is_the_validation_split(tmp_path: Path) -> None:
    dm = attach(folder_dm(image_folder(tmp_path, train=6, test=2, val=3), val_size=5))
    dm.setup("fit")
    assert len(dm._datasets["train"]) == 12 and len(dm._datasets["val"]) == 6


def test_declared_statistics_are_used_and_checked(photos: Path) -> None:
    dm = attach(folder_dm(photos, channels=1, mean=[0.5], std=[0.25]))
    dm.setup("fit")
    assert dm.channel_stats == ((0.5,), (0.25,))
    with pytest.raises(DataError, match=r"ImageFolderDataModule.mean=\[0.5, 0.5\] is not allowed: it must be 1"):
        folder_dm(photos, channels=1, mean=[0.5, 0.5], std=[0.2, 0.2])


def test_each_wrong_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data.data_dir=.*nowhere is not a folder; it must hold train/<class>"):
        folder_dm(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"empty/train is not a folder; a split is a folder of class folders"):
        folder_dm(Path(tmp_path / "empty").resolve().mkdir() or tmp_path / "empty")
    (tmp_path / "flat" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match=r"flat/train has no class folders: put each class's images in"):
        folder_dm(tmp_path / "flat")
    root = image_folder(tmp_path / "lacking", train=2, test=1)
    (root / "train" / "zebra").mkdir()
    (root / "train" / "zebra" / "notes.txt").write_text("no images here")
    with pytest.raises(DataError, match=r"class folder .*train/zebra has no images \(.jpg, .jpeg, .png\)"):
        folder_dm(root)
    root = image_folder(tmp_path / "differ", train=2, test=1)
    write_split(root / "test", 1, seed=3, classes=("horizontal", "diagonal"))
    dm = attach(folder_dm(root))
    with pytest.raises(DataError, match=r"test has other classes than the training split: only here \['diagonal'\]"):
        dm.setup("test")
    shutil.rmtree(root / "test")
    with pytest.raises(DataError, match=r"test does not exist: test and predict read data.test_folder=test"):
        attach(folder_dm(root)).setup("test")
    with pytest.raises(DataError, match=r"data.on_device=true needs the images in memory; ImageFolderDataModule"):
        attach(folder_dm(root, on_device=True)).setup("fit")


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    root = image_folder(tmp_path, train=3, test=1)
    (root / "train" / "vertical" / "0001.jpg").write_bytes(b"not an image")
    dm = attach(folder_dm(root, mean=[0.5] * 3, std=[0.3] * 3, val_size=0, batch_size=2))
    with pytest.raises(DataError, match=r"train/vertical/0001.jpg cannot be read as an image \(not a readable JPEG"):
        dm.setup("fit")  # every file's first and last bytes are read before training


@pytest.mark.slow
def test_an_unreadable_file_in_a_worker_is_one_line_and_exit_2(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "data", train=3, test=1)
    (root / "train" / "vertical" / "0001.jpg").write_bytes(b"not an image")
    err = run_project(
        "fit", FOLDER, f"--data.data_dir={root}", "--data.image_size=16", "--data.batch_size=2",
        "--data.num_workers=1", "--data.val_size=0", "--data.mean=[0.5,0.5,0.5]", "--data.std=[0.3,0.3,0.3]",
        NET, "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false", cwd=tmp_path, expect=2,
    )  # fmt: skip
    assert err.strip().splitlines()[-1].endswith("0001.jpg cannot be read as an image (not a readable JPEG or PNG "
                                                 "file); remove it or replace it")  # fmt: skip
    assert "Traceback" not in err


STRATEGIES = {
    "single_device": [],
    "ddp": ["--trainer.strategy=ddp", "--trainer.devices=2"],
    "fsdp": ["--trainer.strategy=fsdp", "--trainer.devices=2"],
    "pipeline": ["--config=configs/strategy/pipeline.yaml", "--trainer.devices=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_folder_trains_under_every_strategy_and_predicts_by_file(strategy: str, photos: Path, tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    options = [
        FOLDER, f"--data.data_dir={photos}", "--data.image_size=24", "--data.batch_size=16",
        "--data.num_workers=1", NET, "--trainer.max_epochs=3", "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
    ]  # fmt: skip
    strategy_options = [option.replace("configs/", f"{repo}/configs/") for option in STRATEGIES[strategy]]
    run_project("fit", *options, *strategy_options, cwd=tmp_path)
    tested = subprocess.run(
        [sys.executable, "-m", "project", "test", "--ckpt_path=last", "--trainer.enable_progress_bar=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stderr[-3000:]
    accuracy = float(re.search(r"test/acc (\d\.\d+)", tested.stdout).group(1))  # the end-of-run summary's line
    assert accuracy > 0.75, tested.stdout[-2000:]  # two classes: chance is 0.5
    run_project("predict", "--ckpt_path=last", "--trainer.enable_progress_bar=false", cwd=tmp_path)
    rows = list(csv.DictReader(open(next((tmp_path / "lightning_logs").glob("version_*/predictions.csv")))))
    assert [row["file"] for row in rows] == sorted(str(p.relative_to(photos)) for p in photos.glob("test/*/*"))
    right = sum(row["predicted_name"] == row["file"].split("/")[1] for row in rows)
    assert right / len(rows) > 0.75

"""Adding a data set is one small class: a subclass of ImageArrayDataModule that says how to get its
arrays gets both pipelines, the global batch split across processes, synthetic data and the checks
of what it reads, and trains when chosen with ``--data=``. The class is the one docs/data.md shows,
read from that page, so the page cannot drift from what works."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from project.__main__ import main
from project.toolkit.errors import DataError
from tests.integration.test_dataset_choice import run_args
from tests.support.data_modules import attach, on_device_batches

DOCS = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def documented_data_set() -> type:
    """The class of the first python block under docs/data.md's "Add a data set", defined in this module
    (so that ``--data=tests.integration.test_new_dataset.TinyImages`` names it)."""
    section = DOCS.read_text().split("## Add a data set", 1)[1]
    source = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = {"__name__": __name__}
    exec(compile(source, str(DOCS), "exec"), namespace)
    return namespace["TinyImages"]


TinyImages = documented_data_set()
TRAIN_IMAGES, TEST_IMAGES = 48, 20


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    """``tiny.npz``: random uint8 images, and labels of the three classes."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, count in (("train", TRAIN_IMAGES), ("test", TEST_IMAGES)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (count, 8, 8, 3), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 3, count)
    np.savez(tmp_path / "tiny.npz", **arrays)
    return tmp_path


def make_tiny(root: Path, **kwargs) -> TinyImages:
    options = dict(data_dir=str(root), image_size=16, batch_size=8, val_size=8, num_workers=0)
    return TinyImages(**{**options, **kwargs})


@pytest.mark.parametrize("on_device", [False, True])
def test_loaders_give_batches_of_the_new_data_set(tiny_dir: Path, on_device: bool) -> None:
    dm = attach(make_tiny(tiny_dir, on_device=on_device))
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    assert {split: len(ds) for split, ds in dm._datasets.items()} == {"train": 40, "val": 8, "test": TEST_IMAGES}
    for stage in ("train", "val", "test"):
        loader = getattr(dm, f"{stage}_dataloader")()
        batches = on_device_batches(dm, loader, stage) if on_device else list(loader)
        images, labels = batches[0]
        assert images.shape == (8, 3, 16, 16) and images.dtype == torch.float32, stage
        assert labels.shape == (8,) and labels.dtype == torch.int64, stage
        assert int(labels.min()) >= 0 and int(labels.max()) < 3
        assert sum(len(b[1]) for b in batches) == {"train": 40, "val": 8, "test": TEST_IMAGES}[stage]


def test_the_global_batch_is_divided_across_processes(tiny_dir: Path) -> None:
    seen = []
    for rank in (0, 1):
        dm = attach(make_tiny(tiny_dir), world_size=2, rank=rank)
        dm.setup("fit")
        assert dm.per_process_batch_size == 4
        images, _ = next(iter(dm.train_dataloader()))
        assert images.shape[0] == 4
        val = list(dm.val_dataloader())
        assert [len(labels) for _, labels in val] == [4]  # 8 validation images: 4 on each process
        seen += [image for images, _ in val for image in images]
    assert len({image.sum().item() for image in seen}) == 8  # every validation image, once

    with pytest.raises(DataError, match=r"data.batch_size=8 .* 3 processes .* multiple of 3"):
        attach(make_tiny(tiny_dir), world_size=3).setup("fit")


def test_synthetic_data_has_the_data_sets_shape_and_needs_no_file(tmp_path: Path) -> None:
    dm = attach(make_tiny(tmp_path / "nowhere", synthetic=True, synthetic_size=40, image_size=8))
    dm.prepare_data()
    dm.setup("fit")
    assert dm._datasets["train"].images.shape == (32, 8, 8, 3)
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (8, 3, 8, 8) and int(labels.max()) < 3
    assert dm.label_names == ["0", "1", "2"]


def test_a_missing_file_is_the_data_sets_own_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"tiny.npz not found"):
        attach(make_tiny(tmp_path)).setup("fit")


@pytest.mark.parametrize(
    "images, labels, message",
    [
        (np.zeros((4, 8, 8, 3), np.float32), np.zeros(4, int), r"images must be uint8 of shape \(N, 8, 8, 3\)"),
        (np.zeros((4, 3, 8, 8), np.uint8), np.zeros(4, int), r"found uint8 of shape \(4, 3, 8, 8\)"),
        (np.zeros((4, 8, 8, 3), np.uint8), np.zeros(3, int), "4 images need as many integer labels"),
        (np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4), "integer labels; found float64"),
        (np.zeros((4, 8, 8, 3), np.uint8), np.array([0, 1, 2, 3]), r"labels must lie in 0..2; found 0..3"),
    ],
)
def test_arrays_the_pipelines_cannot_take_are_refused_naming_the_data_set(
    tmp_path: Path, images: np.ndarray, labels: np.ndarray, message: str
) -> None:
    class Broken(TinyImages):
        def load_split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
            return images, labels

    with pytest.raises(DataError, match=rf"Broken.load_split\(train=True\): .*{message}"):
        attach(Broken(data_dir=str(tmp_path), val_size=1, num_workers=0)).setup("fit")


def test_chosen_by_option_it_trains_and_tests(tiny_dir: Path, tmp_path: Path) -> None:
    # the dataset-choice tests' fit, on this data set's file, at 32 px (the later option wins)
    args = [*run_args(tmp_path, f"{__name__}.TinyImages"), f"--data.data_dir={tiny_dir}", "--data.image_size=32"]
    fit = main(["fit", *args])
    assert type(fit.datamodule) is TinyImages and fit.model.hparams.num_classes == 3
    assert {"train/loss", "val/acc"} <= fit.trainer.callback_metrics.keys()
    assert torch.isfinite(fit.trainer.callback_metrics["train/loss"])
    tested = main(["test", *args, "--ckpt_path=last"])
    assert {"test/loss", "test/acc"} <= tested.trainer.callback_metrics.keys()


def test_a_config_file_chooses_it_as_the_docs_show(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    section = DOCS.read_text().split("## Add a data set", 1)[1]
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    assert config["data"]["class_path"] == "project.data.tiny.TinyImages"  # where the page puts the file
    config["data"]["class_path"] = f"{__name__}.TinyImages"  # where this test defines it
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit):
        main(["fit", f"--config={tmp_path / 'tiny.yaml'}", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)["data"]
    assert printed["class_path"] == f"{__name__}.TinyImages"
    assert printed["init_args"]["data_dir"] == "folder/with/npz" and printed["init_args"]["image_size"] == 32

"""A model trained on a folder of images answers right on new ones: predict takes the classes, image size, channels
and normalisation from the checkpoint, and any folder of images (issue 44)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch

from project.__main__ import main
from project.data import ImageFiles, ImageFolderDataModule
from project.model import ImageClassifier
from project.toolkit.data.augmentation import to_model_input
from tests.support.image_folders import CLASSES, image_folder
from tests.support.runs import one_error_line

FOLDER = "--data=project.data.ImageFolderDataModule"
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu"]
FIT = [
    FOLDER, "--data.image_size=24", "--data.batch_size=8", "--data.num_workers=0",
    "--model.arch=tests.support.user_nets.sequential_convnet", "--trainer.max_epochs=2", *QUIET,
]  # fmt: skip


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(data folder, run folder)`` of a fit of two epochs on generated stripes, in a process of its own folder."""
    root = tmp_path_factory.mktemp("answers")
    data = image_folder(root / "data", train=20, test=4)
    main(["fit", *FIT, f"--data.data_dir={data}", f"--trainer.default_root_dir={root}"])
    return data, root / "lightning_logs" / "version_0"


def new_images(data: Path, folder: Path, classes: tuple[str, ...] = CLASSES) -> Path:
    """``folder`` with two loose test images and one in a class folder of each of ``classes``: no ``train/``."""
    folder.mkdir()
    tests = sorted((data / "test").rglob("*.*"))
    for n, path in enumerate(tests[:2]):
        shutil.copy(path, folder / f"loose{n}{path.suffix}")
    for name, path in zip(classes, tests[-len(classes) :], strict=True):
        (folder / name).mkdir()
        shutil.copy(path, folder / name / path.name)
    return folder


def predictions(run: Path) -> list[dict[str, str]]:
    with open(run / "predictions.csv") as f:
        return list(csv.DictReader(f))


def test_predict_reads_a_new_folder_with_the_checkpoints_classes_and_statistics(
    fitted: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data, run = fitted
    new = new_images(data, tmp_path / "new")
    last = run / "checkpoints" / "last.ckpt"
    main(["predict", f"--ckpt_path={last}", f"--data.data_dir={new}", *QUIET])
    assert "as given" not in capsys.readouterr().err
    rows = predictions(run)  # the fit's folder: the checkpoint's run
    files = sorted(p.relative_to(new).as_posix() for p in new.rglob("*.*"))
    assert sorted(row["file"] for row in rows) == files
    # The checkpoint's statistics and class names, not any measured on the new folder.
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    saved = checkpoint["datamodule_hyper_parameters"]
    model = ImageClassifier.load_from_checkpoint(last, map_location="cpu").eval()
    images = ImageFiles([new / row["file"] for row in rows], 24, 3, new)
    batch = to_model_input(torch.from_numpy(images[:]).permute(0, 3, 1, 2), 24, saved["mean"], saved["std"])
    with torch.inference_mode():
        expected = model(batch).argmax(1).tolist()
    assert [int(row["predicted"]) for row in rows] == expected
    assert [row["predicted_name"] for row in rows] == [CLASSES[i] for i in expected]


def test_class_folders_the_model_does_not_know_are_one_line(
    fitted: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data, run = fitted
    new = new_images(data, tmp_path / "new", classes=("bird", "cat"))
    with pytest.raises(SystemExit) as stopped:
        main(["predict", f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}", FOLDER, f"--data.data_dir={new}", *QUIET])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert "image folders ['bird', 'cat'] that are not among the model's classes ['horizontal', 'vertical']" in line


def test_only_options_given_are_reported_as_given(fitted: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    data, run = fitted
    last = run / "checkpoints" / "last.ckpt"
    main(["test", f"--ckpt_path={last}", FOLDER, f"--data.data_dir={data}", *QUIET])
    err = capsys.readouterr().err
    assert "as given" not in err and "data.batch_size=8" in err  # adopted from the checkpoint, silently given
    main(["test", f"--ckpt_path={last}", FOLDER, f"--data.data_dir={data}", "--data.batch_size=4", *QUIET])
    assert "running with data.batch_size=4 as given" in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--data.test_folder=train"], ["--data.test_folder", "train"]], ids=["=", "space"])
def test_options_of_the_checkpoints_data_set_are_taken_without_naming_it_again(
    fitted: tuple[Path, Path], option: list[str], capsys: pytest.CaptureFixture
) -> None:
    data, run = fitted
    root = f"--trainer.default_root_dir={run.parent.parent}"
    cli = main(["test", "--ckpt_path=best", *option, root, *QUIET])  # no --data=: the checkpoint's data set
    hparams = cli.datamodule.hparams
    assert type(cli.datamodule) is ImageFolderDataModule and hparams.test_folder == "train"
    assert hparams.data_dir == str(data) and hparams.image_size == 24  # the fit's, from the checkpoint
    assert "test/acc" in cli.trainer.callback_metrics
    assert capsys.readouterr().err.count("--ckpt_path=best: ") == 1  # the checkpoint is found once
    line = one_error_line("test", ["--ckpt_path=best", "--data.test_foldr=train", root, *QUIET], capsys)
    assert "--data.test_foldr" in line  # a misspelt option is still refused


def test_the_default_batch_is_lowered_on_a_small_folder_and_workers_capped(
    fitted: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from project.toolkit.data import datamodule

    data, _ = fitted
    monkeypatch.setattr(datamodule, "usable_cores", lambda: 2)
    dm = ImageFolderDataModule(data_dir=str(data), image_size=16, num_workers=5)
    dm.setup("fit")  # 36 training images, 4 held out: a batch of 256 would be one step an epoch
    assert dm.hparams.batch_size == 3 and dm.per_process_batch_size == 3 and dm.batch_lowered_from == 256
    assert dm.hparams.num_workers == 2 and dm.num_workers == 2
    given = ImageFolderDataModule(data_dir=str(data), image_size=16, batch_size=8, num_workers=0)
    given.setup("fit")
    assert given.hparams.batch_size == 8 and given.batch_lowered_from is None  # a batch given is kept


def test_test_of_a_fit_that_left_settings_unset_writes_into_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tests.support.fixtures import TINY_RUN

    options = [o for o in TINY_RUN if not o.startswith(("--data.image_size", "--data.batch_size"))]
    options += ["--trainer.devices=1", f"--trainer.default_root_dir={tmp_path}"]
    fit = main(["fit", *options, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"])
    said = capsys.readouterr().err
    assert "data.batch_size=256 (the default) is lowered to 16" in said
    assert "model.lr=0.1 (the default, for data.batch_size=256) is scaled to 0.00625 for the lowered batch" in said
    assert fit.trainer.optimizers[0].param_groups[0]["initial_lr"] == pytest.approx(0.1 * 16 / 256)
    runs = tmp_path / "lightning_logs"
    main(["test", *options, f"--ckpt_path={runs / 'version_0' / 'checkpoints' / 'last.ckpt'}"])
    assert sorted(p.name for p in runs.iterdir()) == ["version_0"]
    assert (runs / "version_0" / "config-test.yaml").is_file()


def test_fit_checks_every_split_and_every_file_before_the_first_step(tmp_path: Path) -> None:
    from project.toolkit.errors import DataError
    from tests.support.image_folders import write_split

    root = image_folder(tmp_path / "classes", train=6, test=1)
    write_split(root / "test", 1, seed=3, classes=("horizontal", "diagonal"))
    dm = ImageFolderDataModule(data_dir=str(root), image_size=16, batch_size=4, num_workers=0)
    with pytest.raises(DataError, match=r"test has other classes than the training split: only here \['diagonal'\]"):
        dm.setup("fit")
    root = image_folder(tmp_path / "broken", train=6, test=1)
    whole = (root / "train" / "vertical" / "0001.jpg").read_bytes()
    (root / "train" / "vertical" / "0001.jpg").write_bytes(whole[: len(whole) // 2])  # cut off: header intact
    dm = ImageFolderDataModule(data_dir=str(root), image_size=16, batch_size=4, num_workers=0)
    with pytest.raises(DataError, match=r"vertical/0001.jpg cannot be read as an image \(a truncated JPEG file"):
        dm.setup("fit")
    (root / "train" / "horizontal" / "0002.jpg").write_bytes(b"not an image")
    (root / "train" / "horizontal" / "0003.png").write_bytes(whole)  # a JPEG named .png is fine: Pillow reads it
    dm = ImageFolderDataModule(data_dir=str(root), image_size=16, batch_size=4, num_workers=0)
    with pytest.raises(DataError, match=r"^2 image files cannot be read: .*0002.jpg \(not a readable JPEG or PNG"):
        dm.setup("fit")


def test_a_misspelled_architecture_gets_the_nearest_names() -> None:
    from project.nets import build_network
    from project.toolkit.errors import ProjectError

    with pytest.raises(ProjectError, match=r"model.arch='mobilenetv2' is neither .*; did you mean mobilenet_v2"):
        build_network("mobilenetv2", num_classes=3)

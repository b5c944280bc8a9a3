"""A data set of one's own, chosen with ``--data=package.module.Class`` (here the classes of
``tests/support/fixture_datasets.py``): grey or colour images, normalised with the statistics the data set
declares or, when it declares none, with those of its training split, measured once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from project.__main__ import main
from project.toolkit.data import datamodule as datamodule_module
from project.toolkit.data.statistics import ChannelStats, measure_channel_stats
from project.toolkit.errors import DataError
from tests.support.data_modules import assert_same_batches, attach
from tests.support.fixture_datasets import TRAIN_IMAGES, ColourTiles, GreyBars
from tests.support.runs import one_error_line

GREY, COLOUR = "tests.support.fixture_datasets.GreyBars", "tests.support.fixture_datasets.ColourTiles"
VAL_IMAGES = 8


class TwoChannels(GreyBars):
    image_shape = (12, 12, 2)


def run_args(tmp_path: Path, data: str) -> list[str]:
    """A fit of two 8-image batches at 16 px on the CPU, the data set chosen by ``data``."""
    return [
        f"--data={data}",
        "--data.image_size=16",
        "--data.batch_size=8",
        f"--data.val_size={VAL_IMAGES}",
        "--data.num_workers=0",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]


def numpy_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of uint8 ``(N, H, W, C)`` images on the 0-1 scale."""
    scaled = images.astype(np.float64) / 255
    return scaled.mean(axis=(0, 1, 2)), scaled.std(axis=(0, 1, 2))


def assert_statistics_are_numpys(stats: ChannelStats, images: np.ndarray) -> None:
    """``stats`` (mean, std) are numpy's of ``images``, to the last bits."""
    mean, std = numpy_stats(images)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(stats.std, std, rtol=1e-12)


def test_a_grey_data_set_chosen_by_option_trains_a_one_channel_network_and_tests_it(tmp_path: Path) -> None:
    args = run_args(tmp_path, GREY)
    fit = main(["fit", *args])
    dm, model = fit.datamodule, fit.model
    assert type(dm) is GreyBars
    assert (model.hparams.in_channels, model.hparams.num_classes) == (1, 3)  # linked from the data set
    assert next(m for m in model.net.modules() if isinstance(m, nn.Conv2d)).in_channels == 1
    train_images = dm._datasets["train"].images
    assert train_images.shape == (TRAIN_IMAGES - VAL_IMAGES, 12, 12, 1)  # given as (N, H, W): the channel added
    assert_statistics_are_numpys(dm.channel_stats, train_images)
    assert torch.isfinite(fit.trainer.callback_metrics["train/loss"])

    tested = main(["test", *args, "--ckpt_path=last"])
    assert {"test/loss", "test/acc"} <= tested.trainer.callback_metrics.keys()
    assert tested.datamodule.channel_stats == dm.channel_stats  # tested as trained: the training split's


def test_a_colour_data_set_fits_and_tests_and_its_checkpoint_is_refused_for_another_class_count(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = run_args(tmp_path, COLOUR)
    fit = main(["fit", *args])
    assert fit.model.hparams.num_classes == 10 and fit.model.hparams.in_channels == 3
    assert_statistics_are_numpys(fit.datamodule.channel_stats, fit.datamodule._datasets["train"].images)
    tested = main(["test", *args, "--ckpt_path=last"])
    assert {"test/loss", "test/acc"} <= tested.trainer.callback_metrics.keys()

    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    assert one_error_line("test", [*run_args(tmp_path / "grey", GREY), f"--ckpt_path={last}"], capsys) == (
        f"error: --ckpt_path={last}: a model of 10 classes, but this data has 3; use a checkpoint trained on this data"
    )


def test_test_and_predict_take_the_data_set_from_the_checkpoint(tmp_path: Path) -> None:
    args = run_args(tmp_path, GREY)
    main(["fit", *args])
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    without_data = [arg for arg in args if not arg.startswith("--data")]
    tested = main(["test", *without_data, f"--ckpt_path={last}"])  # no --data: the default would be CIFAR-10
    assert type(tested.datamodule).__name__ == "GreyBars" and tested.datamodule.hparams.image_size == 16
    assert tested.model.hparams.in_channels == 1 and "test/acc" in tested.trainer.callback_metrics


def test_grey_images_are_the_same_through_both_input_paths() -> None:
    default, on_device = (
        attach(GreyBars(image_size=16, batch_size=8, val_size=VAL_IMAGES, num_workers=0, on_device=flag))
        for flag in (False, True)
    )
    for dm in (default, on_device):
        dm.setup("fit")
        dm.setup("test")
    assert on_device._on_device["train"][0].shape == (TRAIN_IMAGES - VAL_IMAGES, 12, 12, 1)  # as the arrays come
    for images, labels in assert_same_batches(default, on_device, epoch=1):
        assert images.shape == (len(labels), 1, 16, 16)


def test_statistics_not_declared_are_measured_once_from_the_training_split(monkeypatch: pytest.MonkeyPatch) -> None:
    measured = []
    measure = datamodule_module.measure_channel_stats
    monkeypatch.setattr(datamodule_module, "measure_channel_stats", lambda *a: measured.append(a) or measure(*a))
    dm = attach(ColourTiles(image_size=8, batch_size=8, val_size=VAL_IMAGES, num_workers=0))
    for stage in ("fit", "validate", "test"):
        dm.setup(stage)
    assert len(measured) == 1
    # at the native size, the training images normalised with them have mean 0 and deviation 1 per channel
    train = dm._datasets["train"]
    normalised = torch.stack(
        [dm._datasets["val"].transform(torch.from_numpy(image).permute(2, 0, 1)) for image in train.images]
    )
    torch.testing.assert_close(normalised.mean(dim=(0, 2, 3)), torch.zeros(3), rtol=0, atol=1e-5)
    torch.testing.assert_close(normalised.std(dim=(0, 2, 3), unbiased=False), torch.ones(3), rtol=0, atol=1e-5)

    alone = attach(ColourTiles(image_size=8, batch_size=8, val_size=VAL_IMAGES, num_workers=0))
    alone.setup("test")  # a test on its own measures the training split too, as the model was trained on it
    assert alone.channel_stats == dm.channel_stats and len(measured) == 2


def test_measured_statistics_equal_numpys_and_a_constant_channel_is_only_centred() -> None:
    images = np.random.default_rng(0).integers(0, 256, (50, 5, 5, 3), dtype=np.uint8)
    images[..., 2] = 7
    indices = np.arange(3, 50, 2)
    stats = measure_channel_stats(images, indices, chunk=4)  # chunks of 4 images: the sums carry across them
    mean, std = numpy_stats(images[indices])
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(stats.std[:2], std[:2], rtol=1e-12)
    assert stats.std[2] == 1.0  # not 0, which would divide by zero


def test_declared_statistics_are_used_as_they_are() -> None:
    class Declared(ColourTiles):
        mean, std = (0.5, 0.4, 0.3), (0.25, 0.2, 0.1)

    dm = attach(Declared(image_size=8, batch_size=8, val_size=VAL_IMAGES, num_workers=0))
    dm.setup("fit")
    assert dm.channel_stats == ((0.5, 0.4, 0.3), (0.25, 0.2, 0.1))
    image = torch.from_numpy(dm._datasets["val"].images[0]).permute(2, 0, 1)
    expected = (image / 255 - torch.tensor([0.5, 0.4, 0.3])[:, None, None]) / torch.tensor([0.25, 0.2, 0.1])[
        :, None, None
    ]
    torch.testing.assert_close(dm._datasets["val"][0][0], expected)


def test_grey_synthetic_data_has_one_channel() -> None:
    dm = attach(GreyBars(image_size=16, batch_size=8, val_size=4, num_workers=0, synthetic=True, synthetic_size=20))
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (8, 1, 16, 16) and int(labels.max()) < 3
    assert len(dm.channel_stats.mean) == 1 and abs(dm.channel_stats.mean[0] - 0.5) < 0.05  # uniform 0..255


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({"num_classes": 1}, r"Bad.num_classes=1 is not allowed: it must be an integer >= 2"),
        ({"image_shape": None}, r"Bad.image_shape=None is not allowed: it must be \(height, width, channels\)"),
        ({"image_shape": (12, 12, 2)}, r"Bad.image_shape=\(12, 12, 2\) is not allowed: .* channels 1 or 3"),
        (
            {"image_shape": (12, 12)},
            r"Bad.image_shape=\(12, 12\) is not allowed: it must be \(height, width, channels\)",
        ),
        ({"mean": (0.5, 0.5), "std": (0.2, 0.2)}, r"Bad.mean=\(0.5, 0.5\) is not allowed: it must be 1 number"),
        ({"mean": (120.0,), "std": (60.0,)}, r"Bad.mean=\(120.0,\) is not allowed: .* on the 0-1 scale"),
        ({"mean": (0.5,), "std": (0.0,)}, r"Bad.std=\(0.0,\) is not allowed: it must be 1 number\(s\) in \(0, 1\]"),
        ({"mean": (0.5,)}, "Bad declares only one of mean and std"),
    ],
)
def test_a_data_set_class_that_the_pipelines_cannot_take_is_refused_in_one_line(attributes: dict, message: str) -> None:
    bad = type("Bad", (GreyBars,), attributes)
    with pytest.raises(DataError, match=message):
        bad(num_workers=0)


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--data=no.such.Module"],
            "error: data=no.such.Module is not allowed: it must name a LightningDataModule subclass as "
            "package.module.Class (No module named 'no')",
        ),
        (
            ["--data=torch.nn.Linear"],
            "error: data=torch.nn.Linear is not allowed: it must name a LightningDataModule subclass as "
            "package.module.Class (not a LightningDataModule subclass)",
        ),
        (
            [f"--data={GREY}", "--data.image_sise=8"],
            "error: unrecognized arguments: --data.image_sise=8; did you mean --data.image_size?",
        ),
        (
            [f"--data={GREY}", "--data.image_size=big"],
            "error: data.image_size=big is not allowed; expected int or null",
        ),
        (
            [f"--data={__name__}.TwoChannels"],
            "error: TwoChannels.image_shape=(12, 12, 2) is not allowed: it must be (height, width, channels) "
            "with channels 1 or 3",
        ),
    ],
)
def test_a_bad_data_choice_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], line: str
) -> None:
    error = one_error_line("fit", [f"--trainer.default_root_dir={tmp_path}", *args], capsys)
    assert error.split(" (see python -m project")[0] == line
    assert not any(tmp_path.iterdir())  # nothing left behind

"""Precise BatchNorm statistics: after a short fit on a small folder of images, evaluation sees what training saw
(issue 44: train/acc 0.98, val/acc 0.56 on 432 drawn shapes, from running averages of the last few batches)."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from PIL import Image, ImageDraw

from project.__main__ import main
from project.toolkit.callbacks.precise_bn import PreciseBatchNorm
from project.toolkit.data.augmentation import to_model_input
from project.toolkit.errors import ProjectError

SHAPES = ("circle", "square", "triangle")
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu"]


def draw_shape(rng: np.random.Generator, shape: str, grey: bool) -> Image.Image:
    """One filled ``shape`` of random size, place and colours on a canvas of 40x30 to 80x60 pixels."""
    width = int(rng.integers(40, 81))
    height = width * 3 // 4
    background = tuple(int(v) for v in rng.integers(0, 100, 3))
    image = Image.new("RGB", (width, height), background)
    side = int(rng.integers(height // 2, height - 4))
    x, y = int(rng.integers(0, width - side)), int(rng.integers(0, height - side))
    colour = tuple(int(v) for v in rng.integers(140, 256, 3))
    draw = ImageDraw.Draw(image)
    if shape == "circle":
        draw.ellipse([x, y, x + side, y + side], fill=colour)
    elif shape == "square":
        draw.rectangle([x, y, x + side, y + side], fill=colour)
    else:
        draw.polygon([(x, y + side), (x + side, y + side), (x + side // 2, y)], fill=colour)
    return image.convert("L") if grey else image


def shapes_folder(root: Path, train: int, test: int, seed: int = 0) -> Path:
    """``root/{train,test}/<shape>/``: a quarter grey PNGs, the rest colour JPEGs, of mixed sizes."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("test", test)):
        for shape in SHAPES:
            (root / split / shape).mkdir(parents=True)
            for n in range(count):
                grey = n % 4 == 0
                path = root / split / shape / f"{shape}_{n:03d}.{'png' if grey else 'jpg'}"
                draw_shape(rng, shape, grey).save(path, quality=90)
    return root


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int, train: bool) -> float:
    """``model``'s accuracy on ``images`` in shuffled batches of ``batch``, in train mode (batch statistics) or not."""
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    model.train(train)
    with torch.no_grad():
        right = sum(int((model(images[i]).argmax(1) == labels[i]).sum()) for i in order.split(batch))
    return right / len(labels)


@pytest.mark.slow
def test_eval_mode_scores_as_train_mode_on_the_training_images(tmp_path: Path) -> None:
    """The issue's folder at 64 px: MobileNetV2, batch 32, lr 0.02, 8 epochs (14 batches each), long enough that
    the model has learned the shapes whatever the seed; with precise statistics eval mode scores as train mode."""
    torch.set_num_threads(1)
    data = shapes_folder(tmp_path / "shapes", train=160, test=1)
    fit = main([
        "fit", "--data=project.data.ImageFolderDataModule", f"--data.data_dir={data}", "--data.image_size=64",
        "--data.batch_size=32", "--data.num_workers=0", "--model.lr=0.02", "--trainer.max_epochs=8",
        f"--trainer.default_root_dir={tmp_path}", *QUIET,
    ])  # fmt: skip
    model, dm = fit.trainer.lightning_module, fit.trainer.datamodule
    train, (mean, std) = dm._datasets["train"], dm.channel_stats
    images = to_model_input(torch.from_numpy(train.images[:]).permute(0, 3, 1, 2), 64, mean, std)
    labels = torch.from_numpy(train.labels)
    in_eval, in_train = accuracy(model, images, labels, 32, False), accuracy(model, images, labels, 32, True)
    assert in_train > 0.8 and abs(in_eval - in_train) <= 0.05, (in_eval, in_train)


@pytest.mark.parametrize("on_device", ["false", "true"])  # DataLoader batches; the on-device path's own
def test_the_statistics_are_the_plain_average_over_training_batches(tiny_args: list[str], on_device: str) -> None:
    fit = main(["fit", *tiny_args, "--trainer.max_epochs=1", "--precise_bn.batches=3", f"--data.on_device={on_device}"])
    model, dm = fit.trainer.lightning_module, fit.trainer.datamodule
    members = [m for c in fit.trainer.callbacks for m in getattr(c, "members", [c])]  # also inside a group
    callback = next(m for m in members if isinstance(m, PreciseBatchNorm))
    assert callback.active and len(callback.seconds) == 1  # before the one validation; not again at epoch end
    stored = {name: buffer.clone() for name, buffer in model.named_buffers() if "running_" in name}
    means: dict[str, list[torch.Tensor]] = {name: [] for name in stored}
    model = copy.deepcopy(model).eval()  # as the pass runs it: BatchNorm layers on their batch's statistics
    layers = {name: m.train() for name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}

    def record(name: str):  # noqa: ANN202
        def hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
            means[f"{name}.running_mean"].append(args[0].mean((0, 2, 3)))
            means[f"{name}.running_var"].append(args[0].var((0, 2, 3)))

        return hook

    hooks = [layer.register_forward_hook(record(name)) for name, layer in layers.items()]
    with torch.no_grad():
        for _, (images, _) in zip(range(3), dm.training_batches(0), strict=False):
            model(images)
    for hook in hooks:
        hook.remove()
    for name, values in means.items():
        torch.testing.assert_close(stored[name], torch.stack(values).mean(0), rtol=1e-4, atol=1e-5)


def test_auto_is_off_for_the_default_job_and_on_for_a_small_data_set() -> None:
    from types import SimpleNamespace

    model = torch.nn.Sequential(torch.nn.BatchNorm2d(3))
    for batches, active in ((175, False), (14, True)):  # CIFAR-10 at batch 256; the folder at batch 32
        data = SimpleNamespace(training_batches=lambda epoch: iter(()), in_channels=3, input_path=None)
        data.batch_lowered_from = None
        data.label_names, data.predict_names = ["a", "b"], None  # the rest of what the toolkit reads of a data set
        trainer = SimpleNamespace(num_training_batches=batches, strategy=object(), datamodule=data)
        callback = PreciseBatchNorm()
        callback.on_train_start(trainer, model)
        assert callback.active is active
    with pytest.raises(ProjectError, match=r"precise_bn.batches=0 is not allowed: it must be an integer >= 1"):
        PreciseBatchNorm(batches=0)


class RanksAgree(Callback):
    """Says on stderr, at each validation of a fit, how far apart the processes' last BatchNorm variances are."""

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            layer = [m for m in pl_module.modules() if isinstance(m, torch.nn.BatchNorm2d)][-1]
            gathered = trainer.strategy.all_gather(layer.running_var.clone())
            print(f"rank spread {float((gathered[0] - gathered[1]).abs().max())}", file=sys.stderr, flush=True)


@pytest.mark.slow
def test_ddp_processes_hold_the_same_statistics(tmp_path: Path) -> None:
    from tests.integration.test_strategy_runs import run_project
    from tests.support.image_folders import image_folder

    data = image_folder(tmp_path / "data", train=30, test=2)
    err = run_project(
        "fit", "--data=project.data.ImageFolderDataModule", f"--data.data_dir={data}", "--data.image_size=24",
        "--data.batch_size=8", "--data.num_workers=0", "--model.arch=tests.support.user_nets.sequential_convnet",
        "--trainer.max_epochs=2", "--trainer.strategy=ddp", "--trainer.devices=2", *QUIET,
        f"--trainer.callbacks+={__name__}.RanksAgree", cwd=tmp_path,
    )  # fmt: skip
    # each process says it, at both validations; the two processes' lines may interleave on the shared stderr
    spreads = re.findall(r"rank spread ([-+.\deE]+?)(?=rank|\s|$)", err)
    assert len(spreads) == 4 and set(spreads) == {"0.0"}, err[-2000:]


def test_a_recalibration_reads_no_more_batches_than_an_epoch_trains(
    tiny_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from project.toolkit.data.datamodule import ImageArrayDataModule

    read = []
    batches = ImageArrayDataModule.training_batches

    def counted(self: ImageArrayDataModule, epoch: int):  # noqa: ANN202
        for batch in batches(self, epoch):
            read.append(epoch)
            yield batch

    monkeypatch.setattr(ImageArrayDataModule, "training_batches", counted)
    main(["fit", *tiny_args, "--trainer.fast_dev_run=true"])  # one training batch: the smoke run stays seconds
    assert read == [0]

"""The augmentation as functions of (seed, epoch, image index): the torchvision distribution, the
torchvision steps, and the same result one image at a time or in a batch; ``--data.augmentation``: none or a
user's transform, the same on both input paths."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from project.__main__ import main
from project.toolkit.data.augmentation import (
    augment,
    crop_and_flip,
    draw_crops_and_flips,
    image_seeds,
    to_model_input,
)
from tests.support.data_modules import assert_same_batches, attach, make_dm

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)  # any per-channel statistics a data set may have
EVERY_CROP_AND_FLIP = torch.tensor(list(itertools.product(range(9), range(9), range(2))))  # 81 offsets x 2 flips


def random_images(count: int, seed: int = 0, channels: int = 3) -> torch.Tensor:
    shape = (count, channels, 32, 32)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("channels", [1, 3])
def test_crop_and_flip_is_torchvisions_padded_crop_then_flip_for_every_parameter(channels: int) -> None:
    image = random_images(1, channels=channels)[0]
    batch = image.expand(len(EVERY_CROP_AND_FLIP), -1, -1, -1)
    out = crop_and_flip(batch, EVERY_CROP_AND_FLIP)
    padded = F.pad(image, [4])  # RandomCrop(32, padding=4): zeros around, then a 32 px window
    for (dy, dx, flip), got in zip(EVERY_CROP_AND_FLIP.tolist(), out, strict=True):
        expected = F.crop(padded, dy, dx, 32, 32)
        assert torch.equal(got, F.horizontal_flip(expected) if flip else expected), (dy, dx, flip)


def test_draws_are_uniform_over_the_81_offsets_and_2_flips() -> None:
    # 162 cells, 500 draws expected in each. The seed is fixed, so this cannot flake; the bound on
    # chi-square (161 degrees of freedom, mean 161, sd 18) would reject a wrong distribution.
    table = draw_crops_and_flips(seed=1234, epoch=5, count=162 * 500)
    assert table.min(axis=0).tolist() == [0, 0, 0] and table.max(axis=0).tolist() == [8, 8, 1]
    cells = np.bincount(table[:, 0] * 18 + table[:, 1] * 2 + table[:, 2], minlength=162)
    chi_square = ((cells - 500) ** 2 / 500).sum()
    assert len(cells) == 162 and chi_square < 161 + 6 * 18
    assert np.corrcoef(table.T.astype(float))[np.triu_indices(3, 1)].max() < 0.02  # independent axes


def test_draws_depend_on_seed_and_epoch_only() -> None:
    table = draw_crops_and_flips(seed=0, epoch=1, count=1000)
    assert np.array_equal(table, draw_crops_and_flips.__wrapped__(0, 1, 1000))  # not an artefact of the cache
    assert (table != draw_crops_and_flips(seed=0, epoch=2, count=1000)).any(axis=1).mean() > 0.9
    assert (table != draw_crops_and_flips(seed=1, epoch=1, count=1000)).any(axis=1).mean() > 0.9
    assert not table.flags.writeable  # shared through the cache: nobody may change it


@pytest.mark.parametrize("image_size, channels", [(32, 3), (112, 3), (48, 1)])
def test_to_model_input_is_the_torchvision_evaluation_transform(image_size: int, channels: int) -> None:
    images = random_images(4, channels=channels)
    mean, std = MEAN[:channels], STD[:channels]
    steps = [v2.Resize(image_size, antialias=True)] if image_size != 32 else []
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    expected = torch.stack([v2.Compose(steps)(image) for image in images])
    batch = to_model_input(images, image_size, mean, std)
    torch.testing.assert_close(batch, expected, rtol=0, atol=1e-6)
    assert torch.equal(to_model_input(images[0], image_size, mean, std), batch[0])


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_to_model_input_resizes_the_shorter_side_then_crops_the_centre_as_torchvision(interpolation: str) -> None:
    images = torch.randint(0, 256, (2, 3, 30, 45), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    mode = v2.InterpolationMode(interpolation)
    steps = [v2.Resize(36, interpolation=mode, antialias=True), v2.CenterCrop(32)]  # weights.transforms()'s order
    expected = v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])(images)
    batch = to_model_input(images, 32, MEAN, STD, resize_size=36, interpolation=interpolation)
    torch.testing.assert_close(batch, expected, rtol=0, atol=1e-5)
    portrait = to_model_input(images.transpose(-1, -2), 32, MEAN, STD)  # no resize_size: the shorter side to 32
    expected = v2.Compose([v2.Resize(32, antialias=True), v2.CenterCrop(32)])(images.transpose(-1, -2))
    torch.testing.assert_close(portrait, to_model_input(expected, 32, MEAN, STD), rtol=0, atol=0)


@pytest.mark.parametrize("channels", [1, 3])
def test_a_batch_is_augmented_as_its_images_one_at_a_time(channels: int) -> None:
    images = random_images(16, channels=channels)
    mean, std = MEAN[:channels], STD[:channels]
    params = torch.from_numpy(draw_crops_and_flips(seed=3, epoch=0, count=16).copy())
    one_by_one = torch.cat([augment(images[i : i + 1], params[i : i + 1], 48, mean, std) for i in range(16)])
    assert torch.equal(augment(images, params, 48, mean, std), one_by_one)


# A user's transform: random draws (flip, jitter), and a size of its own that the batch is resized from.
USERS = v2.Compose([v2.RandomHorizontalFlip(), v2.ColorJitter(brightness=0.5), v2.RandomResizedCrop(24)])


@pytest.mark.parametrize("augmentation", ["none", USERS], ids=["none", "users"])
def test_an_augmentation_gives_the_same_batches_on_both_input_paths(cifar_root: Path, augmentation: object) -> None:
    default, on_device = (attach(make_dm(cifar_root, on_device=flag, augmentation=augmentation)) for flag in (0, 1))
    for dm in (default, on_device):
        dm.setup("fit")
        dm.setup("test")
    on_device.trainer.current_epoch = 2
    state = torch.random.get_rng_state()
    assert_same_batches(default, on_device, epoch=2)  # workers' images, one at a time, as the device's batches
    assert torch.equal(torch.random.get_rng_state(), state)  # the transform's seeding leaves torch's as it was
    train = default._datasets["train"]
    images = torch.from_numpy(train.images).permute(0, 3, 1, 2)
    loader = default.train_dataloader()
    loader.sampler.set_epoch(2)
    order, (batch, _) = loader.sampler.shard()[:20], next(iter(loader))
    if augmentation == "none":  # the evaluation transform of the images, no more
        torch.testing.assert_close(batch, to_model_input(images[order], 32, *default.channel_stats), rtol=0, atol=0)
    else:  # the transform of each image, seeded by (seed, epoch, image)
        for index, image in zip(order, batch, strict=True):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(image_seeds(0, 2, [index])[0])
                expected = F.resize(USERS(images[index]), [32, 32], antialias=True)
            torch.testing.assert_close(image, to_model_input(expected, 32, *default.channel_stats), rtol=0, atol=0)


def test_random_resized_crop_is_torchvisions_seeded_per_image_on_both_input_paths(cifar_root: Path) -> None:
    options = dict(augmentation="random_resized_crop", resize_size=40, interpolation="bicubic")
    default, on_device = (attach(make_dm(cifar_root, on_device=flag, **options)) for flag in (0, 1))
    for dm in (default, on_device):
        dm.setup("fit")
        dm.setup("test")
    on_device.trainer.current_epoch = 1
    assert_same_batches(default, on_device, epoch=1)  # training, and evaluation resized to 40 and cropped to 32
    images = torch.from_numpy(default._datasets["train"].images).permute(0, 3, 1, 2)
    loader = default.train_dataloader()
    loader.sampler.set_epoch(1)
    order, (batch, _) = loader.sampler.shard()[:20], next(iter(loader))
    recipe = v2.Compose(
        [v2.RandomResizedCrop(32, interpolation=v2.InterpolationMode.BICUBIC), v2.RandomHorizontalFlip()]
    )
    for index, image in zip(order, batch, strict=True):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(image_seeds(0, 1, [index])[0])
            expected = recipe(images[index])  # scale (0.08, 1), ratio (3/4, 4/3): torchvision's defaults
        torch.testing.assert_close(image, to_model_input(expected, 32, *default.channel_stats), rtol=0, atol=0)
    val_images = torch.from_numpy(default._datasets["val"].images[:20]).permute(0, 3, 1, 2)
    (val_batch, _) = next(iter(default.val_dataloader()))
    evaluation = v2.Compose([v2.Resize(40, interpolation=v2.InterpolationMode.BICUBIC), v2.CenterCrop(32)])
    torch.testing.assert_close(val_batch, to_model_input(evaluation(val_images), 32, *default.channel_stats))


def test_a_users_transform_by_its_class_path_trains_and_is_saved(tiny_args: list[str]) -> None:
    option = '{"class_path": "torchvision.transforms.v2.RandAugment", "init_args": {"num_ops": 3}}'
    fit = main(
        [
            "fit",
            *tiny_args,
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            f"--data.augmentation={option}",
        ]
    )
    augmentation = fit.trainer.datamodule.augmentation
    assert isinstance(augmentation, v2.RandAugment) and augmentation.num_ops == 3
    checkpoint = torch.load(Path(fit.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    saved = checkpoint["datamodule_hyper_parameters"]["augmentation"]  # as given: a resumed fit builds it again
    assert saved["class_path"] == "torchvision.transforms.v2.RandAugment" and saved["init_args"]["num_ops"] == 3

"""The CIFAR-10 data module outside a Trainer, for the tests of the data pipeline: built on the tests' files, given
the few trainer attributes it reads, and its on-device batches compared with the default path's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from lightning.pytorch.plugins.precision import Precision
from torch.utils.data import DataLoader

from project.data import CIFAR10DataModule, ImageArrayDataModule


def make_dm(root: Path, **kwargs) -> CIFAR10DataModule:
    options = dict(data_dir=str(root), download=False, image_size=32, batch_size=20, val_size=40, num_workers=0)
    return CIFAR10DataModule(**{**options, **kwargs})


def attach(dm: CIFAR10DataModule, world_size: int = 1, rank: int = 0) -> CIFAR10DataModule:
    """Give the data module the few trainer attributes it reads, as a training process of a CPU run
    of `world_size` would."""
    dm.trainer = SimpleNamespace(
        world_size=world_size,
        global_rank=rank,
        num_devices=world_size,
        accelerator=None,
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        precision_plugin=Precision(),
        training=True,
        testing=False,
        predicting=False,
    )
    return dm


def on_device_batches(dm: CIFAR10DataModule, loader: DataLoader, stage: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What the model gets from an on_device loader in ``stage``: each batch of indices through the
    hook Lightning calls after moving it to the device (here the CPU)."""
    dm.trainer.training, dm.trainer.testing = stage == "train", stage == "test"
    return [dm.on_after_batch_transfer(batch, dataloader_idx=0) for batch in loader]


def assert_same_batches(
    default: ImageArrayDataModule, on_device: ImageArrayDataModule, epoch: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every train (at ``epoch``), val and test batch of the on_device module equals the default module's;
    returns the default module's batches it compared, of all three stages."""
    compared = []
    for stage in ("train", "val", "test"):
        loaders = [getattr(dm, f"{stage}_dataloader")() for dm in (default, on_device)]
        if stage == "train":
            for loader in loaders:
                loader.sampler.set_epoch(epoch)
        expected, actual = list(loaders[0]), on_device_batches(on_device, loaders[1], stage)
        assert len(actual) == len(expected) > 0
        for (images, labels), (want_images, want_labels) in zip(actual, expected, strict=True):
            torch.testing.assert_close(images, want_images, rtol=0, atol=1e-6)
            assert torch.equal(labels, want_labels)
        compared += expected
    return compared

"""MixUp and CutMix of the training batches (``--data.batch_augmentation``), loaded only when asked for: torchvision's
``v2.MixUp`` or ``v2.CutMix`` (``mixup_or_cutmix``: ``v2.RandomChoice`` of the two, per batch) mixes each image with
the batch's previous one and makes the labels class probabilities ``(N, num_classes)``. Their draws (the share, the
box, the choice) come from torch's CPU generator seeded by ``(seed, epoch, the batch's first image)``: the same batch
on either input path, whatever the workers, after a resume; on every stage of a pipeline. The on-device path mixes on
the device after the batch's augmentation (the draws are host values: nothing is read back); the DataLoader path in
the workers, as it collates the batch. Evaluation and ``training_batches`` (precise BatchNorm) are never mixed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate
from torchvision.transforms import v2

from project.toolkit.errors import DataError

# An image's key is a samplers.EpochIndex (an int carrying .seed and .epoch), the on-device batches are
# samplers.KeyBatches; not imported: samplers.py imports augmentation.py, which loads this module.
Key = int

MIXING_STREAM = 1  # in the batch's seed, apart from its first image's own (image_seeds): their draws differ
# What a training DataLoader keeps when it is made again to mix: all that the data module sets.
_LOADER_SETTINGS = ("batch_size", "sampler", "num_workers", "pin_memory", "drop_last", "persistent_workers")


class BatchMixing:
    """``kind`` (``mixup``, ``cutmix`` or ``mixup_or_cutmix``) of a batch of ``num_classes`` classes, as a function of
    the batch's first key; ``*_alpha``: the Beta(alpha, alpha) distribution of each's share of an image."""

    def __init__(self, kind: str, num_classes: int, mixup_alpha: float = 0.2, cutmix_alpha: float = 1.0) -> None:
        for name, alpha in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if not alpha > 0:  # Beta(0, 0) is no distribution; NaN is refused too
                raise DataError(f"data.{name}={alpha} is not allowed: it must be a number > 0 (of Beta(alpha, alpha))")
        mixup = v2.MixUp(alpha=mixup_alpha, num_classes=num_classes)
        cutmix = v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)
        kinds = {"mixup": mixup, "cutmix": cutmix, "mixup_or_cutmix": v2.RandomChoice([mixup, cutmix])}
        if kind not in kinds:
            raise DataError(f"data.batch_augmentation={kind!r} is not allowed: use none, {', '.join(kinds)}")
        self.kind, self.transform, self.num_classes = kind, kinds[kind], num_classes

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, first: Key) -> tuple[torch.Tensor, ...]:
        """The batch whose first image is ``first`` mixed: its images and soft labels, on the images' device; no
        value of the batch is read on the host (the draws are the CPU generator's)."""
        # One-hot by scatter: torch's one_hot reads the labels' range on the host off CUDA.
        one_hot = torch.zeros(len(labels), self.num_classes, device=labels.device).scatter_(1, labels[:, None], 1.0)
        with torch.random.fork_rng(devices=[]):  # the caller's generator left as it was
            torch.random.default_generator.manual_seed(hash((first.seed, first.epoch, int(first), MIXING_STREAM)))
            return self.transform(images, one_hot)

    def collate(self, items: Sequence[tuple[torch.Tensor, int, Key]]) -> tuple[torch.Tensor, ...]:
        """The DataLoader path's ``collate_fn``: the items of :class:`KeyedImages` as one batch, mixed."""
        images, labels = default_collate([item[:2] for item in items])
        return self(images, labels, items[0][2])

    def loader(self, loader: DataLoader | Any) -> DataLoader | MixedKeyBatches:
        """The training ``loader`` whose batches come mixed (DataLoader) or ready to mix (:class:`MixedKeyBatches`)."""
        if not isinstance(loader, DataLoader):  # the on-device path's KeyBatches
            return MixedKeyBatches(loader)
        settings = {name: getattr(loader, name) for name in (*_LOADER_SETTINGS, "generator")}
        return DataLoader(KeyedImages(loader.dataset), collate_fn=self.collate, **settings)


class KeyedImages(Dataset):
    """A training Dataset whose items carry their key last, ``(image, label, key)``: what the batch's seed needs."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Key) -> tuple[Any, ...]:
        return (*self.dataset[key], key)


class MixedKeyBatches:
    """The on-device path's :class:`KeyBatches`, each batch with its first key: ``(keys, first)``, which
    ``on_after_batch_transfer`` makes a mixed batch of images on the device."""

    def __init__(self, batches: Any) -> None:
        self.batches = batches

    @property
    def sampler(self) -> Any:
        """The :class:`TrainingSampler`, which Lightning and a mid-epoch resume move to their epoch and batch."""
        return self.batches.sampler

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, Key]]:
        # A generator, as KeyBatches': the keys are read at the first batch, after Lightning sets a resumed epoch.
        firsts = list(self.sampler)[:: self.sampler.batch_size]
        yield from zip(self.batches, firsts, strict=False)  # a last, partial batch is dropped by KeyBatches

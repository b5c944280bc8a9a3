"""Which images a process loads, in what order: the resumable training sampler, the evaluation batches that
give every process as many, and the on-device path's batches of indices (no DataLoader needed)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from project.toolkit.data.augmentation import draw_crops_and_flips
from project.toolkit.errors import DataError


def run_seed() -> int:
    """The run's base seed (``--seed_everything``; 0 unseeded): the training order's and augmentation's."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class EpochIndex(int):
    """An image index (an ``int`` everywhere else) that carries the ``(seed, epoch)`` it is drawn for, so its
    augmentation can be looked up wherever it goes, in a worker started epochs ago too."""

    seed: int
    epoch: int

    def __new__(cls, index: int, seed: int, epoch: int) -> EpochIndex:
        key = super().__new__(cls, index)
        key.seed, key.epoch = seed, epoch
        return key

    def __reduce__(self) -> tuple[type, tuple[int, int, int]]:  # to and from the worker processes
        return EpochIndex, (int(self), self.seed, self.epoch)

    def __repr__(self) -> str:
        return f"EpochIndex({int(self)}, seed={self.seed}, epoch={self.epoch})"


class TrainingSampler(DistributedSampler):
    """This process's shard of an epoch's training images as :class:`EpochIndex` keys, in DistributedSampler's
    order; :meth:`resume_at` starts mid-epoch (``len()`` stays the shard's: Lightning counts those batches done)."""

    def __init__(self, dataset: Dataset, batch_size: int, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.batches_done = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for ``epoch``; moving to another epoch starts it from its first batch."""
        if epoch != self.epoch:
            self.batches_done = 0
        super().set_epoch(epoch)

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """Go to ``epoch`` and skip its first ``batches_done`` batches until :meth:`set_epoch` moves on: for a
        callback resuming mid-epoch (``on_train_start``; then ``iter()`` Lightning's data fetcher again)."""
        batches = len(self) // self.batch_size
        if not 0 <= batches_done <= batches:
            raise ValueError(f"cannot resume after {batches_done} batches: an epoch has {batches} on this process")
        super().set_epoch(epoch)
        self.batches_done = batches_done

    def shard(self) -> list[int]:
        """This process's image indices for the epoch, in order, less the batches done (:meth:`resume_at`)."""
        return list(super().__iter__())[self.batches_done * self.batch_size :]

    def __iter__(self) -> Iterator[EpochIndex]:
        return (EpochIndex(index, self.seed, self.epoch) for index in self.shard())


class KeyBatches:
    """The on-device path's training batches without a DataLoader: whole ``(batch_size, 4)`` int64 rows ``[index, dy,
    dx, flip]`` of ``sampler``'s shard, views of one table made on ``device`` per epoch (Lightning reads sampler)."""

    def __init__(self, sampler: TrainingSampler, device: torch.device | str = "cpu") -> None:
        self.sampler, self.device = sampler, torch.device(device)

    def __len__(self) -> int:
        return len(self.sampler) // self.sampler.batch_size

    def __iter__(self) -> Iterator[torch.Tensor]:
        # A generator: the epoch is read at the first batch, after Lightning sets the epoch of a resumed run.
        sampler, size = self.sampler, self.sampler.batch_size
        index = np.asarray(sampler.shard(), dtype=np.int64)
        index = index[: len(index) // size * size]
        if not len(index):  # split would give one empty batch
            return
        table = draw_crops_and_flips(sampler.seed, sampler.epoch, len(sampler.dataset))
        yield from torch.from_numpy(np.column_stack([index, table[index]])).to(self.device).split(size)


class EvenBatchSampler(DistributedSampler):
    """One process's evaluation batches (lists of indices): every image once across processes, and as many batches
    on each, which fsdp's collective forwards need. A DistributedSampler, so Lightning adds none of its own."""

    def __init__(self, dataset: Dataset, batch_size: int, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        own = list(range(rank, len(dataset), num_replicas))
        count = math.ceil(math.ceil(len(dataset) / num_replicas) / batch_size)  # the largest share's batches
        if len(own) < count:
            raise DataError(
                f"{len(dataset)} evaluation images cannot give each of the {num_replicas} processes the same number "
                f"of batches of at most {batch_size} (needed so no process waits for another); use a per-process "
                "batch of 2 or more (data.batch_size >= 2 x processes) and at least one image per process"
            )
        self.batches: list[list[int]] = []
        start = 0
        for batches_left in range(count, 0, -1):
            size = min(batch_size, len(own) - start - (batches_left - 1))  # leave an image for each batch to come
            self.batches.append(own[start : start + size])
            start += size

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class SliceBatches:
    """:class:`EvenBatchSampler`'s batches as slices of the on-device image tensor (step ``num_replicas``):
    no gather, no DataLoader; Lightning iterates any sized iterable as a loader."""

    def __init__(self, count: int, batch_size: int, num_replicas: int, rank: int) -> None:
        batches = EvenBatchSampler(range(count), batch_size, num_replicas=num_replicas, rank=rank).batches
        self.slices = [slice(batch[0], batch[-1] + 1, num_replicas) for batch in batches]

    def batch_indices(self) -> list[list[int]]:
        """The image indices of every batch, in order (Lightning tracks them only for a DataLoader)."""
        return [list(range(s.start, s.stop, s.step)) for s in self.slices]

    def __iter__(self) -> Iterator[slice]:
        return iter(self.slices)

    def __len__(self) -> int:
        return len(self.slices)

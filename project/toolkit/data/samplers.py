"""The samplers of the generic pipeline: which images a process loads, in what order.

Training: :class:`TrainingSampler` deals each process a disjoint shard, reshuffled every epoch, as
:class:`EpochIndex` keys that carry ``(seed, epoch)`` along with the image index, so an image's
augmentation can be looked up wherever the key goes, and an epoch can start at any batch.
Evaluation under several processes: :class:`EvenBatchSampler` gives every image exactly once and
every process the same number of batches.

The on-device path needs no DataLoader: :class:`KeyBatches` (training) and :class:`SliceBatches`
(evaluation and prediction) hand Lightning, which iterates any sized iterable as a loader, batches of
indices to look the images up by on the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from project.toolkit.data.augmentation import draw_crops_and_flips
from project.toolkit.errors import DataError


class EpochIndex(int):
    """An image index that also carries the ``(seed, epoch)`` it is drawn for, so that the image's
    augmentation can be looked up wherever the index goes -- in a DataLoader worker that was started
    epochs ago, too. It is an ``int`` everywhere else (equal to, hashed and JSON-encoded as its
    index).

    >>> key = EpochIndex(7, seed=42, epoch=3)
    >>> key == 7, key.epoch, key
    (True, 3, EpochIndex(7, seed=42, epoch=3))
    """

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
    """This process's share of the training images for one epoch, as :class:`EpochIndex` keys.

    The order is DistributedSampler's: the images shuffled by ``seed + epoch``, dealt out to the
    ``num_replicas`` processes in turn, the few that do not divide evenly left out this epoch
    (``drop_last``). Lightning calls :meth:`set_epoch` before every epoch, so every process sees a
    disjoint shard, reshuffled each epoch, and a resumed run sees the order of an unbroken one.

    To resume in the middle of an epoch, :meth:`resume_at` leaves out the batches the interrupted
    run had trained on. ``len()`` stays the length of the whole shard: Lightning counts those
    batches as done already.

    >>> sampler = TrainingSampler(range(6), batch_size=2, num_replicas=1, rank=0, seed=0)
    >>> sampler.set_epoch(1)
    >>> order = list(sampler)
    >>> sampler.resume_at(epoch=1, batches_done=2)
    >>> list(sampler) == order[4:], len(sampler), order[4]
    (True, 6, EpochIndex(3, seed=0, epoch=1))
    """

    def __init__(self, dataset: Dataset, batch_size: int, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.batches_done = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for ``epoch``. Moving to another epoch starts it from its first batch; setting the
        epoch it is at already (as Lightning does after :meth:`resume_at`) keeps the batches done."""
        if epoch != self.epoch:
            self.batches_done = 0
        super().set_epoch(epoch)

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """Go to ``epoch`` and leave out the first ``batches_done`` batches of this process's shard
        in every iteration until :meth:`set_epoch` moves to another epoch.

        For a callback that resumes a run from a checkpoint taken in the middle of an epoch. The
        sampler is ``trainer.train_dataloader.sampler``. In ``on_train_start`` (Lightning calls no
        ``on_train_epoch_start`` for an epoch it resumes mid-way), call
        ``resume_at(trainer.current_epoch, batches_done)`` with the batches of that epoch the
        checkpoint has trained on, then ``iter()`` Lightning's data fetcher, whose iterator was made
        before the checkpoint was loaded. The next image is then the one the interrupted run would
        have trained on next, with the same augmentation, whatever ``num_workers``.
        """
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
    """The training batches of the on-device path, with no DataLoader: each a ``(batch_size, 4)`` int64 tensor
    of rows ``[index, dy, dx, flip]``, an image of ``sampler``'s shard (in its order) and the crop and flip
    :func:`~project.toolkit.data.augmentation.draw_crops_and_flips` gives that image this epoch -- the
    augmentation the DataLoader path gives it (:class:`~project.toolkit.data.datasets.AugmentedImages`).
    Whole batches only, as the DataLoader path drops an incomplete last one.

    The epoch's rows are made at once when an iteration starts, and each batch is a view of them: on a CPU
    a DataLoader over the keys took 0.5 ms a batch of 128 (half a percent of MobileNetV2's training step at
    32 px), this takes microseconds. ``sampler`` is where a loader's is, for Lightning, which calls its
    ``set_epoch`` every epoch, and for :class:`~project.toolkit.callbacks.reproducibility.ReseedEveryEpoch`,
    which calls its ``resume_at``.

    >>> sampler = TrainingSampler(range(5), batch_size=2, num_replicas=1, rank=0, seed=0)
    >>> batches, order, table = KeyBatches(sampler), sampler.shard(), draw_crops_and_flips(0, 0, 5)
    >>> len(batches), [batch.tolist() for batch in batches] == [[[i, *table[i]] for i in order[:2]],
    ...                                                         [[i, *table[i]] for i in order[2:4]]]
    (2, True)
    """

    def __init__(self, sampler: TrainingSampler) -> None:
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.sampler) // self.sampler.batch_size

    def __iter__(self) -> Iterator[torch.Tensor]:
        # A generator: the epoch is read at the first batch, not when the iterator is made. Lightning makes
        # it before it sets the epoch of a run that resumes (as a DataLoader's iterator reads its sampler late).
        sampler, size = self.sampler, self.sampler.batch_size
        index = np.asarray(sampler.shard(), dtype=np.int64)
        index = index[: len(index) // size * size]
        if not len(index):  # split would give one empty batch
            return
        table = draw_crops_and_flips(sampler.seed, sampler.epoch, len(sampler.dataset))
        yield from torch.from_numpy(np.column_stack([index, table[index]])).split(size)


class EvenBatchSampler(DistributedSampler):
    """The evaluation batches of one of ``num_replicas`` processes, each a list of indices.

    Every image is seen exactly once across the processes (process r takes images r, r + N, r + 2N,
    ...), so metrics reduced across them equal a single-process evaluation. And every process gets
    the SAME number of batches: under fsdp each forward pass is collective (the processes gather
    each block's parameters together), so a process with one batch fewer would leave the others
    waiting forever. Batches hold at most ``batch_size`` images; a process with fewer images than
    another makes its last batches smaller. It is a DistributedSampler so that Lightning sees the
    data split already and puts in no sampler of its own.

    >>> [list(EvenBatchSampler(range(5), batch_size=2, num_replicas=2, rank=rank)) for rank in (0, 1)]
    [[[0, 2], [4]], [[1], [3]]]
    >>> [[len(batch) for batch in EvenBatchSampler(range(41), 10, num_replicas=2, rank=rank)] for rank in (0, 1)]
    [[10, 10, 1], [10, 9, 1]]
    """

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
    """The evaluation and prediction batches of one of ``num_replicas`` processes as slices of the image
    tensor, for the on-device input path: :class:`EvenBatchSampler`'s batches (every image once, as many
    batches on every process), each a run of every ``num_replicas``-th image, so a slice with that step.
    Lightning takes them as they are -- it iterates any sized iterable as a loader -- and the batch becomes
    images with no gather and no DataLoader (on a CPU, a DataLoader's batches of 128 indices cost 0.2-0.3 ms
    each, about 1 % of MobileNetV2's evaluation step at 32 px).

    >>> [list(SliceBatches(5, batch_size=2, num_replicas=2, rank=rank)) for rank in (0, 1)]
    [[slice(0, 3, 2), slice(4, 5, 2)], [slice(1, 2, 2), slice(3, 4, 2)]]
    >>> SliceBatches(5, batch_size=2, num_replicas=2, rank=0).batch_indices()
    [[0, 2], [4]]
    """

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

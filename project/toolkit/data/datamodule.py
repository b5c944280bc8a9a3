"""A LightningDataModule for any image classification set of uint8 images, held in memory as arrays or decoded from
files in DataLoader workers: the global batch split across processes, training reproducible whatever the workers and
resumable mid-epoch, evaluation of every image once, augmentation on the device or in workers (:mod:`.input_path`)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset

from project.toolkit.data.augmentation import (
    CROP_FLIP,
    RANDOM_RESIZED_CROP,
    Augmentation,
    Interpolation,
    augment,
    batch_mixing,
    check_augmentation,
    check_transform,
    image_seeds,
    rows_of,
    to_model_input,
)
from project.toolkit.data.datasets import AugmentedImages, ImageArrayDataset, IndexBatches
from project.toolkit.data.declarations import check_declarations, checked_split, images_at
from project.toolkit.data.input_path import AUTO, InputPath, choose_input_path, machine_of
from project.toolkit.data.samplers import EvenBatchSampler, KeyBatches, SliceBatches, TrainingSampler, run_seed
from project.toolkit.data.statistics import ChannelStats, measure_channel_stats
from project.toolkit.errors import DataError
from project.toolkit.helpers import usable_cores
from project.toolkit.interfaces import layout_of
from project.toolkit.log import get_logger

log = get_logger(__name__)

DEFAULT_BATCH_SIZE = 256  # lowered on a small data set (see _fit_default_batch); a batch given is kept
STATS_SAMPLE = 1000  # training images decoded to measure the normalisation of a data set of files


class ImageArrayDataModule(LightningDataModule):
    """An image classification set of uint8 ``(N, H, W, C)`` images: an array, or a sequence of files decoded
    on demand (an object with ``shape``, ``dtype``, ``subset(indices)`` and items as arrays).

    A subclass sets ``num_classes``, ``image_shape`` (``mean``/``std`` if known) and :meth:`load_split`.

    Args:
        data_dir: Folder that holds (or will hold) the data set's files.
        download: Download the data set if its files are missing.
        image_size: Side of the square images fed to the model, cropped from the centre of images resized to
            ``resize_size``; null: the data set's ``default_image_size`` (CIFAR-10: 112) or else its ``image_shape``'s.
        batch_size: GLOBAL batch size: each of the run's N processes loads ``batch_size / N``. The default, 256, is
            lowered to a tenth of the training images where that is fewer (a small data set).
        num_workers: DataLoader workers per process; ``auto``: none on a CPU run, ``min(4, CPUs per process)`` else;
            capped to the CPU cores the process may use.
        val_size: Training images held out (seeded) for validation: a count, or a fraction below 1; 0 trains on
            every image, without validation. Ignored where the data set has validation files of its own.
        synthetic: Use random images and labels instead of files: no disk, no network.
        synthetic_size: Training-set size of the synthetic data (its test set is a fifth of it).
        split_seed: Seed of the validation split and the synthetic data, apart from the training seed.
        on_device: Keep the images on the training device, augmented there in batches; ``auto``: if they fit.
        augmentation: The training images' augmentation: ``crop_flip`` (a random crop of the image padded by 4 px,
            and a horizontal flip), ``none``, or a transform of a uint8 ``(C, H, W)`` image to a uint8 image (an
            import path, or ``class_path``/``init_args`` such as ``torchvision.transforms.v2.RandAugment``), run on
            each image at its stored size with torch's generator seeded by ``(seed, epoch, image)``;
            ``random_resized_crop``: torchvision's RandomResizedCrop to ``image_size`` and a flip, seeded so too.
        resize_size: The images' shorter side before the centre crop to ``image_size``; null: ``image_size``.
        interpolation: Of every resize: ``bilinear`` or ``bicubic``. (A torchvision ``--model.weights`` name sets
            ``image_size``, ``resize_size``, ``interpolation``, ``mean`` and ``std`` where they are not given.)
        batch_augmentation: Each training batch mixed, its labels made soft: ``mixup``, ``cutmix``, ``mixup_or_cutmix``.
        mixup_alpha: MixUp's share of an image is Beta(alpha, alpha)-distributed (torchvision's recipe: 0.2).
        cutmix_alpha: CutMix's share of an image (the area outside its box) likewise (1.0: uniform).
    """

    num_classes: int  # the CLI links it to model.num_classes
    image_shape: tuple[int, int, int]  # (height, width, channels) of one image as load_split gives it; channels 1 or 3
    mean: tuple[float, ...] | None = None  # per channel, 0-1 scale; None: measured in setup from the training split
    std: tuple[float, ...] | None = None
    default_image_size: int | None = None  # the image_size when the option is null; None: image_shape's side

    @property
    def in_channels(self) -> int:
        """Channels of one image (1 or 3); the CLI links it to ``model.in_channels``."""
        return self.image_shape[2]

    def __init__(
        self,
        data_dir: str = "data",
        download: bool = True,
        image_size: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        num_workers: int | Literal["auto"] = AUTO,
        val_size: int | float = 0.1,
        synthetic: bool = False,
        synthetic_size: int = 50_000,
        split_seed: int = 0,
        on_device: bool | Literal["auto"] = AUTO,
        augmentation: Augmentation = CROP_FLIP,
        resize_size: int | None = None,
        interpolation: Interpolation = "bilinear",
        batch_augmentation: Literal["none", "mixup", "cutmix", "mixup_or_cutmix"] = "none",
        mixup_alpha: float = 0.2,
        cutmix_alpha: float = 1.0,
    ) -> None:
        super().__init__()
        self.channel_stats: ChannelStats | None = check_declarations(self)  # None: measured in setup
        if num_workers is None:  # accepted for auto (in older configs and checkpoints)
            num_workers = AUTO
        if image_size is None:
            image_size = self.default_image_size or max(self.image_shape[:2])
        minimums = {"image_size": (image_size, 1), "batch_size": (batch_size, 1), "synthetic_size": (synthetic_size, 2)}
        minimums["resize_size"] = (image_size if resize_size is None else resize_size, image_size)  # the crop fits
        for name, (value, low) in minimums.items():
            if value < low:
                raise DataError(f"data.{name}={value} is not allowed: it must be an integer >= {low}")
        if not (val_size >= 1 and float(val_size).is_integer() or 0 <= val_size < 1):
            raise DataError(f"data.val_size={val_size} is not allowed: use a count (0: none) or a fraction below 1")
        if num_workers != AUTO and not (isinstance(num_workers, int) and num_workers >= 0):
            raise DataError(f"data.num_workers={num_workers} is not allowed: use an integer >= 0, or auto")
        check_augmentation(augmentation)
        self.batch_mixing = batch_mixing(batch_augmentation, self.num_classes, mixup_alpha, cutmix_alpha)
        if on_device not in (True, False, AUTO):
            raise DataError(f"data.on_device={on_device} is not allowed: use true, false or auto")
        if on_device is True and num_workers != AUTO and num_workers > 0:
            log.warning("data.num_workers=%d is ignored: data.on_device=true needs no workers", num_workers)
        self.save_hyperparameters()
        self.hparams["image_size"] = image_size  # resolved: what the run trains at, as checkpoints record it
        self.data_dir, self.augmentation = Path(data_dir), augmentation  # hparams hold it as the options gave it
        self._resizing = {"resize_size": resize_size, "interpolation": interpolation}  # of every image, as given
        self.label_names: list[str] = [str(i) for i in range(self.num_classes)]
        self._datasets: dict[str, ImageArrayDataset] = {}
        self._on_device: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # on_device: images, labels per split
        self._input_path: InputPath | None = None  # chosen in setup, from the options and the machine
        self.batch_lowered_from: int | None = None  # the default batch, where setup lowered it (a small data set)

    def prepare_files(self) -> None:
        """Make :meth:`load_split`'s files available (download them, or say where); once per node, not if synthetic."""

    def load_split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """The training (``train=True``) or test images and labels: uint8 ``(N, *image_shape)`` and integers in
        ``0..num_classes - 1``. Runs on every process; may set ``self.label_names``."""
        raise NotImplementedError(f"{type(self).__name__} must define load_split: how to read its images")

    def load_val_split(self) -> tuple[Any, np.ndarray] | None:
        """The data set's own validation images and labels; None: ``val_size`` of the training images are held out."""
        return None

    def prepare_data(self) -> None:
        if not self.hparams.synthetic:
            self.prepare_files()

    @property
    def world_size(self) -> int:
        """The processes that split each batch: all, unless each sample goes to several (``sample_copies``)."""
        return self._replica()[0]

    def _replica(self) -> tuple[int, int]:
        """``(replicas, this process's replica)``: how the batches are dealt out."""
        if self.trainer is None:
            return 1, 0
        copies = layout_of(self.trainer.strategy).sample_copies
        return self.trainer.world_size // copies, self.trainer.global_rank // copies

    @property
    def per_process_batch_size(self) -> int:
        return self.hparams.batch_size // self.world_size

    def setup(self, stage: str) -> None:
        world, batch = self.world_size, self.hparams.batch_size
        if batch % world:
            raise DataError(
                f"data.batch_size={batch} is the global batch and must divide evenly across the "
                f"{world} processes of this run; use a multiple of {world}"
            )
        size = self.hparams.image_size
        if stage in ("fit", "validate") and "train" not in self._datasets:
            images, labels = self._load(train=True)
            own_val = None if self.hparams.synthetic else self.load_val_split()
            train, val = self._split(len(images)) if own_val is None else (np.arange(len(images)), None)
            self._fit_default_batch(len(train))
            mean, std = self._normalisation_stats(images, train)
            if callable(self.augmentation):  # a user's transform: tried on one image before the first step
                check_transform(self.augmentation, torch.from_numpy(np.asarray(images[train[0]])).permute(2, 0, 1))
            train_set = AugmentedImages(images_at(images, train), labels[train], size, mean, std, self.augmentation)
            train_set.resize_size, train_set.interpolation = self._resizing.values()
            self._datasets["train"] = train_set
            if own_val is not None:
                images, labels = checked_split(self, *own_val, where=f"{type(self).__name__}.load_val_split()")
                val = np.arange(len(images))
            self._datasets["val"] = ImageArrayDataset(images_at(images, val), labels[val], self._evaluation_transform())
        if stage in ("test", "predict") and "test" not in self._datasets:
            if self.channel_stats is None:  # the statistics the model was trained with: the training split's
                images, _ = self._load(train=True)
                self._normalisation_stats(images, self._split(len(images))[0])
            self._datasets["test"] = ImageArrayDataset(*self._load(train=False), self._evaluation_transform())
        self._cap_workers()
        splits = {"fit": ("train", "val"), "validate": ("val",)}.get(stage, ("test",))
        path = self._input_path = self._choose_input_path(splits)
        log.info("input: %s, %d workers (%s)", path.name, path.num_workers, path.reason)
        if path.on_device:
            self._move_to_device(splits)
        if not path.on_device and path.num_workers == 0 and self.hparams.num_workers == AUTO:
            # Lightning's advice for more workers: auto chose none on a CPU, where they would slow the step.
            warnings.filterwarnings("ignore", message=r"The '\w+_dataloader' does not have many workers")

    def _fit_default_batch(self, count: int) -> None:
        """The default batch lowered to a tenth of the ``count`` training images where it is more: a handful of
        steps an epoch does not learn (a batch given explicitly is kept)."""
        batch, world = self.hparams.batch_size, self.world_size
        tenth = count // 10 // world * world
        if batch == DEFAULT_BATCH_SIZE and world <= tenth < batch:
            log.warning(
                "data.batch_size=%d (the default) is lowered to %d, a tenth of the %d training images: %d step(s) "
                "an epoch would be too few to learn; --data.batch_size=N chooses another",
                batch,
                tenth,
                count,
                count // batch,
            )
            self.hparams["batch_size"], self.batch_lowered_from = tenth, batch

    def _cap_workers(self) -> None:
        """DataLoader workers beyond this process's CPU cores capped to them: more only contend for the cores."""
        workers, cores = self.hparams.num_workers, usable_cores()
        if workers != AUTO and workers > cores:
            log.warning("data.num_workers=%d is capped to %d, the CPU cores this process may use", workers, cores)
            self.hparams["num_workers"] = cores

    def state_dict(self) -> dict[str, Any]:
        """What checkpoints keep of the data: the normalisation ``export`` builds in, the class names of ``predict``."""
        stats = self.channel_stats
        return {"mean": stats and list(stats.mean), "std": stats and list(stats.std), "label_names": self.label_names}

    def _choose_input_path(self, splits: tuple[str, ...]) -> InputPath:
        held = {*splits, *self._on_device}
        size = sum(self._datasets[s].images.nbytes + self._datasets[s].labels.nbytes for s in held)
        machine, trainer, on_device = machine_of(self.trainer), self.trainer is not None, self.hparams.on_device
        files = any(not isinstance(self._datasets[s].images, np.ndarray) for s in held)
        if files and on_device is True:
            raise DataError(f"data.on_device=true needs the images in memory; {type(self).__name__} reads files")
        return choose_input_path(on_device, self.hparams.num_workers, size, machine, trainer, from_files=files)

    @property
    def input_path(self) -> InputPath:
        """The input path this run takes, its workers and why; before :meth:`setup`: for an empty data set."""
        return self._input_path or self._choose_input_path(())

    @property
    def on_device(self) -> bool:
        """Whether the data set is kept on the device (the option, or what ``auto`` chose)."""
        return self.input_path.on_device

    def _split(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(training, validation)`` indices of the ``count`` training images: the seeded hold-out."""
        val_size = self.hparams.val_size
        held = int(val_size) if val_size >= 1 else max(1, round(val_size * count)) if val_size else 0
        if not held < count:
            raise DataError(
                f"data.val_size={val_size} is not allowed: it must lie between 0 (no validation) "
                f"and {count - 1} (the data set has {count} training images), or be a fraction below 1"
            )
        order = np.random.default_rng(self.hparams.split_seed).permutation(count)
        return order[held:], order[:held]

    def _normalisation_stats(self, images: np.ndarray, train: np.ndarray) -> ChannelStats:
        """The declared statistics, else measured once on ``images[train]`` (the same on every rank)."""
        if self.channel_stats is None:  # of files: on a sample (``train`` is in random order)
            sample = train if isinstance(images, np.ndarray) else train[:STATS_SAMPLE]
            self.channel_stats = measure_channel_stats(images, sample)
            if "mean" in self.hparams and self.hparams.get("mean") is None:  # options: checkpoints carry them
                self.hparams["mean"], self.hparams["std"] = list(self.channel_stats.mean), list(self.channel_stats.std)
            said = "%s normalises with the statistics of its %d training images: mean=%s std=%s (declare them as "
            rounded = [[round(v, 4) for v in values] for values in self.channel_stats]
            log.info(said + "the class's mean and std to skip measuring)", type(self).__name__, len(sample), *rounded)
        return self.channel_stats

    def _evaluation_transform(self) -> partial:
        mean, std = self.channel_stats
        return partial(to_model_input, image_size=self.hparams.image_size, mean=mean, std=std, **self._resizing)

    def _move_to_device(self, splits: tuple[str, ...]) -> None:
        if self.trainer is None:
            raise DataError("data.on_device=true needs a Trainer, whose accelerator holds the images")
        device = self.trainer.strategy.root_device
        for split in splits:
            if split not in self._on_device:
                dataset = self._datasets[split]  # as the arrays come, (N, H, W, C): rows_of makes batches of them
                self._on_device[split] = tuple(torch.from_numpy(a).to(device) for a in (dataset.images, dataset.labels))

    def _load(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        if self.hparams.synthetic:
            count = self.hparams.synthetic_size if train else max(1, self.hparams.synthetic_size // 5)
            rng = np.random.default_rng([self.hparams.split_seed, int(train)])
            images = rng.integers(0, 256, (count, *self.image_shape), dtype=np.uint8)
            return images, rng.integers(0, self.num_classes, count)
        where = f"{type(self).__name__}.load_split(train={train})"
        try:
            return checked_split(self, *self.load_split(train), where=where)
        except (OSError, ValueError, KeyError, EOFError) as err:  # reading the user's files: say which, and where
            raise DataError(f"{where} failed with data.data_dir={self.data_dir}: {type(err).__name__}: {err}") from None

    @property
    def predict_names(self) -> list[str] | None:
        """The names of the images ``predict`` sees, by index (files' names), where the data set has them."""
        return getattr(self._datasets["test"].images, "names", None) if "test" in self._datasets else None

    def _loader(self, split: str, train: bool = False, predict: bool = False) -> DataLoader | KeyBatches | SliceBatches:
        dataset: Dataset = self._datasets[split]
        world, rank = self._replica()
        if self.on_device:  # batches of indices, which on_after_batch_transfer makes images on the device
            if train:
                return KeyBatches(self._training_sampler(dataset, world, rank), self._on_device["train"][0].device)
            return SliceBatches(len(dataset), self.per_process_batch_size, num_replicas=world, rank=rank)
        workers, trainer = self.num_workers, self.trainer
        # A generator of its own: the workers' base seed would otherwise be drawn from torch's global generator,
        # as often as the workers start, shifting the model's dropout masks.
        common = dict(num_workers=workers, persistent_workers=workers > 0, generator=torch.Generator().manual_seed(0))
        common["pin_memory"] = trainer is not None and isinstance(trainer.accelerator, CUDAAccelerator)
        if world > 1 and not train and not predict:
            # Every image once across the ranks (metrics equal one process's), as many batches on each (for fsdp).
            batches = EvenBatchSampler(dataset, self.per_process_batch_size, num_replicas=world, rank=rank)
            return DataLoader(IndexBatches(dataset), batch_size=None, sampler=batches, **common)
        sampler = None
        if train:
            sampler = self._training_sampler(dataset, world, rank)
        elif world > 1:
            # predict: every image once, by a DataLoader that batches: Lightning records its batches' indices.
            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        return DataLoader(dataset, batch_size=self.per_process_batch_size, sampler=sampler, drop_last=train, **common)

    def _training_sampler(self, dataset: Dataset, world: int, rank: int) -> TrainingSampler:
        """Ours even on one process: its order depends only on (seed, epoch), so shards are disjoint and resumable."""
        return TrainingSampler(dataset, self.per_process_batch_size, num_replicas=world, rank=rank, seed=run_seed())

    def training_batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This process's augmented training batches of ``epoch`` as ``(images, labels)``, from a loader of their own
        (the fit's is left where it is): for passes outside the training loop, such as precise BatchNorm."""
        if not self.on_device:
            loader = self._loader("train", train=True)
            loader.sampler.set_epoch(epoch)
            yield from loader
            return
        sampler = self._training_sampler(self._datasets["train"], *self._replica())
        sampler.set_epoch(epoch)
        images, labels = self._on_device["train"]
        for keys in KeyBatches(sampler, images.device):
            yield self._augmented(images, keys, epoch), labels.index_select(0, keys[:, 0])

    def _augmented(self, images: torch.Tensor, keys: torch.Tensor, epoch: int | None = None) -> torch.Tensor:
        """on_device: the images of ``keys``' rows ``[index, dy, dx, flip]``, augmented as in ``epoch`` (or now)."""
        index, augmentation, seeds = keys[:, 0], self.augmentation, []
        if callable(augmentation) or augmentation == RANDOM_RESIZED_CROP:  # seeded per image: it reads the indices
            epoch = self.trainer.current_epoch if epoch is None else epoch
            seeds = image_seeds(run_seed(), epoch, index.tolist())
        size, (mean, std) = self.hparams.image_size, self.channel_stats
        return augment(rows_of(images, index), keys[:, 1:], size, mean, std, augmentation, seeds, **self._resizing)

    @property
    def num_workers(self) -> int:
        """DataLoader worker processes per training process: the option, or what ``auto`` chose."""
        return self.input_path.num_workers

    def train_dataloader(self) -> DataLoader | KeyBatches:
        loader = self._loader("train", train=True)  # with batch_augmentation: its batches mixed (or ready to mix)
        return loader if self.batch_mixing is None else self.batch_mixing.loader(loader)

    def val_dataloader(self) -> DataLoader | SliceBatches:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader | SliceBatches:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader | SliceBatches:
        return self._loader("test", predict=True)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """on_device: a batch of indices made ``(images, labels)`` on the device, converted for the run's precision."""
        if not self.on_device:
            return batch
        if self.trainer.training:
            images, labels = self._on_device["train"]
            keys, first = batch if self.batch_mixing else (batch, None)  # mixed: (keys, the batch's first key)
            batch = self._augmented(images, keys), labels.index_select(0, keys[:, 0])
            batch = batch if first is None else self.batch_mixing(*batch, first)
        else:
            images, labels = self._on_device["test" if self.trainer.testing or self.trainer.predicting else "val"]
            size, (mean, std) = self.hparams.image_size, self.channel_stats
            batch = to_model_input(rows_of(images, batch), size, mean, std, **self._resizing), labels[batch]
        return self.trainer.precision_plugin.convert_input(batch)

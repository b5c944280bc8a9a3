"""CIFAR-10 as a LightningDataModule.

The data set is read from the official python-format files (``cifar-10-batches-py/``), downloaded
once per node if missing, checked for structure (not re-hashed) on every start, and served with the
standard augmentation at any ``image_size`` (the material upscales 32 px to 112 px).
``synthetic=True`` swaps in random CIFAR-shaped data that needs no disk and no network.

``batch_size`` is the GLOBAL batch: the data module splits it across the processes of the run.

Training is reproducible whatever the number of DataLoader workers, and can resume in the middle of
an epoch: the order of an epoch and the augmentation of every image depend only on
``(seed, epoch, image index)`` (see :class:`TrainingSampler` and :mod:`project.data.augmentation`).
``on_device=True`` keeps the whole data set on the accelerator and augments there, in batches.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset

from project.data.augmentation import augment, to_model_input
from project.data.datasets import AugmentedImages, AugmentKeys, ImageArrayDataset, IndexBatches, Indices
from project.data.samplers import EvenBatchSampler, TrainingSampler
from project.errors import DataError
from project.log import get_logger

log = get_logger(__name__)

# The official archive and its layout (the same constants torchvision's CIFAR10 uses).
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
BASE_FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)  # height, width, channels: the on-disk layout after reshaping


# --------------------------------------------------------------------------- reading the files


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """The official files are pickles; refuse anything but the numpy arrays they contain, so a
    tampered file cannot run code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store raw bytes
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name}")
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict[str, Any]:
    """Load one official pickle, with its byte-string keys turned into str."""
    try:
        with open(path, "rb") as f:
            entry = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except Exception as err:  # truncated, garbled or not a pickle at all
        raise DataError(
            f"{path}: not a readable CIFAR-10 file ({type(err).__name__}: {err}); delete the folder and download again"
        ) from None
    if not isinstance(entry, dict):
        raise DataError(f"{path}: expected a dict, found {type(entry).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one official batch file and check its structure.

    Returns images as uint8 ``(N, 32, 32, 3)`` and labels as int64 ``(N,)``.
    """
    entry = _unpickle(path)
    missing = {"data", "labels"} - entry.keys()
    if missing:
        raise DataError(f"{path}: missing key(s) {sorted(missing)}; found {sorted(entry)}")
    data, labels = entry["data"], np.asarray(entry["labels"])
    pixels = int(np.prod(IMAGE_SHAPE))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != pixels:
        shape = getattr(data, "shape", None)
        raise DataError(f"{path}: 'data' must be a uint8 array of shape (N, {pixels}); found {shape}")
    if labels.shape != (len(data),):
        raise DataError(f"{path}: {len(data)} images but labels of shape {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{path}: labels must lie in 0..{NUM_CLASSES - 1}; found {labels.min()}..{labels.max()}")
    # Stored channel-first per image (R plane, G plane, B plane); keep HWC so one image is one slice.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels.astype(np.int64)


def read_label_names(path: Path) -> list[str]:
    """Class names from ``batches.meta``."""
    names = _unpickle(path).get("label_names")
    if not isinstance(names, list) or len(names) != NUM_CLASSES:
        raise DataError(f"{path}: 'label_names' must list {NUM_CLASSES} names")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def read_split(root: Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """All images and labels of the training files (``train=True``) or of the test file."""
    parts = [read_batch(root / name) for name in (TRAIN_FILES if train else (TEST_FILE,))]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def missing_files(root: Path) -> list[str]:
    """Which of the official files are absent from ``root`` (cheap: no reading, no hashing)."""
    return [name for name in (*TRAIN_FILES, TEST_FILE, META_FILE) if not (root / name).is_file()]


# --------------------------------------------------------------------------- downloading


def download_cifar10(data_dir: Path, url: str = CIFAR10_URL, md5: str = CIFAR10_MD5, timeout: float = 60.0) -> None:
    """Download, verify and unpack the official archive into ``data_dir / BASE_FOLDER``.

    Everything is written under a private temporary name and moved into place with one rename, so
    an interrupted download never leaves a partial data set, and two processes (two nodes on a
    shared disk, two runs at once) never write the same files. Raises ``OSError`` or ``ValueError``
    on failure; the caller turns that into a message for the user.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".cifar10-download-", dir=data_dir))
    try:
        archive = staging / "archive.tar.gz"
        digest = hashlib.md5()
        with urllib.request.urlopen(url, timeout=timeout) as response, open(archive, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != md5:
            raise ValueError(f"checksum mismatch: got md5 {digest.hexdigest()}, expected {md5}")
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        target = data_dir / BASE_FOLDER
        try:
            if missing_files(target):  # else another process finished first; its copy is as good as ours
                os.replace(staging / BASE_FOLDER, target)
        except OSError:
            if missing_files(target):  # it finished while we renamed: fine; anything else is a failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --------------------------------------------------------------------------- the data module


class CIFAR10DataModule(LightningDataModule):
    """CIFAR-10 (or a synthetic stand-in of the same shape) for image classification.

    Args:
        data_dir: Folder that holds (or will hold) ``cifar-10-batches-py/``.
        download: Download the official archive if the files are missing.
        image_size: Side of the square images fed to the model; 32 is CIFAR's native size, 112
            the material's upscaled one.
        batch_size: GLOBAL batch size: each of the run's N processes loads ``batch_size / N``.
        num_workers: DataLoader worker processes per training process; ``None`` picks
            ``min(4, CPUs per process)``. Any number gives the same images: each image's
            augmentation depends only on (seed, epoch, image index).
        val_size: Training images held out (a seeded random choice) for validation.
        synthetic: Use random images and labels instead of files: no disk, no network.
        synthetic_size: Training-set size of the synthetic data (its test set is a fifth of it).
        split_seed: Seed of the validation split and of the synthetic data; kept apart from the
            training seed so the split stays put when the training seed changes.
        on_device: Keep all images (uint8, about 180 MB for CIFAR-10) on the accelerator and crop,
            flip, resize and normalise whole batches there, with no DataLoader workers; the loaders
            then carry only image indices. The same images as the default (``false``), made where
            the CPU cannot hold back a fast accelerator.
    """

    def __init__(
        self,
        data_dir: str = "data",
        download: bool = True,
        image_size: int = 112,
        batch_size: int = 256,
        num_workers: int | None = None,
        val_size: int = 5000,
        synthetic: bool = False,
        synthetic_size: int = 50_000,
        split_seed: int = 0,
        on_device: bool = False,
    ) -> None:
        super().__init__()
        for name, value, low in (
            ("image_size", image_size, 1),
            ("batch_size", batch_size, 1),
            ("val_size", val_size, 1),
            ("synthetic_size", synthetic_size, 2),
        ):
            if value < low:
                raise DataError(f"data.{name}={value} is not allowed: it must be an integer >= {low}")
        if num_workers is not None and num_workers < 0:
            raise DataError(
                f"data.num_workers={num_workers} is not allowed: use an integer >= 0, or null for automatic"
            )
        if on_device and num_workers:
            log.warning("data.num_workers=%d is ignored: data.on_device=true needs no workers", num_workers)
        self.save_hyperparameters()
        self.data_dir = Path(data_dir)
        self.label_names: list[str] = [str(i) for i in range(NUM_CLASSES)]
        self._datasets: dict[str, ImageArrayDataset] = {}
        # on_device: each split's images (uint8, N x 3 x 32 x 32) and labels on the accelerator
        self._on_device: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_classes(self) -> int:
        """Linked to ``model.num_classes`` by the CLI, so it is never typed twice."""
        return NUM_CLASSES

    @property
    def root(self) -> Path:
        return self.data_dir / BASE_FOLDER

    # -- preparing: once per node, before any other rank reads --------------------------------

    def prepare_data(self) -> None:
        if self.hparams.synthetic:
            return
        missing = missing_files(self.root)
        if not missing:
            return
        if self.data_dir.exists() and not self.data_dir.is_dir():
            raise DataError(f"data.data_dir={self.data_dir} is a file; it must be a folder (or not exist yet)")
        if self.root.exists():
            raise DataError(
                f"{self.root} is incomplete (missing {', '.join(missing)}); delete that folder to download "
                "again, or point --data.data_dir at a complete copy"
            )
        ways_out = "point --data.data_dir at an existing copy, or run offline with --data.synthetic=true"
        if not self.hparams.download:
            raise DataError(f"CIFAR-10 not found in {self.root} and --data.download=false: {ways_out}")
        log.info("Downloading CIFAR-10 from %s into %s", CIFAR10_URL, self.data_dir)
        created = not self.data_dir.exists()
        try:
            download_cifar10(self.data_dir, url=CIFAR10_URL, md5=CIFAR10_MD5)
        except (OSError, ValueError, tarfile.TarError) as err:
            if created:
                shutil.rmtree(self.data_dir, ignore_errors=True)  # leave no empty folder behind
            reason = getattr(err, "reason", None) or err
            raise DataError(
                f"CIFAR-10 not found in {self.root} and the download from {CIFAR10_URL} failed ({reason}): {ways_out}"
            ) from None

    # -- setting up: on every rank -------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

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
            if not 0 < self.hparams.val_size < len(images):
                raise DataError(
                    f"data.val_size={self.hparams.val_size} is not allowed: it must lie between 1 and "
                    f"{len(images) - 1} (the data set has {len(images)} training images)"
                )
            order = np.random.default_rng(self.hparams.split_seed).permutation(len(images))
            val, train = order[: self.hparams.val_size], order[self.hparams.val_size :]
            self._datasets["train"] = AugmentedImages(images[train], labels[train], size)
            self._datasets["val"] = ImageArrayDataset(
                images[val], labels[val], partial(to_model_input, image_size=size)
            )
        if stage in ("test", "predict") and "test" not in self._datasets:
            test = ImageArrayDataset(*self._load(train=False), partial(to_model_input, image_size=size))
            self._datasets["test"] = test
        if self.hparams.on_device:
            self._move_to_device({"fit": ("train", "val"), "validate": ("val",)}.get(stage, ("test",)))

    def _move_to_device(self, splits: tuple[str, ...]) -> None:
        """on_device: copy the images and labels of ``splits`` to the accelerator, once. Lightning
        sets up the strategy (and so the device of this process) before the data."""
        if self.trainer is None:
            raise DataError("data.on_device=true needs a Trainer, whose accelerator holds the images")
        device = self.trainer.strategy.root_device
        for split in splits:
            if split not in self._on_device:
                dataset = self._datasets[split]
                images = torch.from_numpy(dataset.images).to(device).permute(0, 3, 1, 2).contiguous()
                self._on_device[split] = images, torch.from_numpy(dataset.labels).to(device)
        # Lightning advises more workers for a loader with fewer than 2; these carry indices only.
        warnings.filterwarnings("ignore", message=r"The '\w+_dataloader' does not have many workers")

    def _load(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """Images and labels of the training files or of the test file (or their synthetic twin)."""
        if self.hparams.synthetic:
            count = self.hparams.synthetic_size if train else max(1, self.hparams.synthetic_size // 5)
            rng = np.random.default_rng([self.hparams.split_seed, int(train)])
            return rng.integers(0, 256, (count, *IMAGE_SHAPE), dtype=np.uint8), rng.integers(0, NUM_CLASSES, count)
        missing = missing_files(self.root)
        if missing:  # prepare_data ran on another node, or was skipped
            raise DataError(f"{self.root} is missing {', '.join(missing)}; run with --data.download=true")
        self.label_names = read_label_names(self.root / META_FILE)
        return read_split(self.root, train=train)

    # -- loaders -----------------------------------------------------------------------------

    def _loader(self, split: str, train: bool = False, predict: bool = False) -> DataLoader:
        dataset: Dataset = self._datasets[split]
        if self.hparams.on_device:  # indices only: on_after_batch_transfer makes them images
            dataset = AugmentKeys(len(dataset)) if train else Indices(len(dataset))
        world = self.world_size
        rank = self.trainer.global_rank if self.trainer is not None else 0
        workers = self.num_workers
        on_cuda = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        pin = on_cuda and not self.hparams.on_device  # index batches are too small to gain from it
        # A generator of its own: a DataLoader draws its workers' base seed when it starts iterating,
        # from torch's global generator by default, and how often it does (once with persistent
        # workers, every epoch without) would then shift the dropout masks the model draws after it.
        # Nothing in loading is random otherwise: the samplers and the augmentation have their own seeds.
        common = {
            "num_workers": workers,
            "pin_memory": pin,
            "persistent_workers": workers > 0,
            "generator": torch.Generator().manual_seed(0),
        }
        if world > 1 and not train and not predict:
            # Every image exactly once across the ranks (the default sampler pads the last shard with
            # repeats), so distributed val/test metrics equal a single-process evaluation; and as many
            # batches on every rank, which fsdp needs (see EvenBatchSampler).
            batches = EvenBatchSampler(dataset, self.per_process_batch_size, num_replicas=world, rank=rank)
            return DataLoader(IndexBatches(dataset), batch_size=None, sampler=batches, **common)
        sampler = None
        if train:
            # Our own sampler even on one process: its order depends only on (seed, epoch), which
            # Lightning advances with set_epoch every epoch, so every rank sees a disjoint shard,
            # reshuffled each epoch, and a resumed run sees the same order as an unbroken one.
            # drop_last: the few images that do not divide across the ranks sit this epoch out (as
            # an incomplete last batch does) instead of being repeated on some rank. The sampler also
            # hands each image its augmentation's (seed, epoch), and can start an epoch mid-way.
            seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
            sampler = TrainingSampler(dataset, self.per_process_batch_size, num_replicas=world, rank=rank, seed=seed)
        elif world > 1:
            # predict: every image once, in batches of batch_size, which Lightning can track the image
            # indices of (it does so only for a loader that batches by itself).
            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        return DataLoader(
            dataset,
            batch_size=self.per_process_batch_size,
            sampler=sampler,
            drop_last=train,  # equal-sized training steps; evaluation sees every image
            **common,
        )

    @property
    def num_workers(self) -> int:
        if self.hparams.on_device:
            return 0
        if self.hparams.num_workers is not None:
            return self.hparams.num_workers
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        processes_here = self.trainer.num_devices if self.trainer is not None else 1
        return max(1, min(4, cpus // max(1, processes_here)))

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", predict=True)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """on_device: turn a batch of indices, now on the accelerator, into ``(images, labels)``:
        training batches (rows ``[index, dy, dx, flip]``, see :class:`AugmentKeys`) cropped, flipped,
        resized and normalised, evaluation batches resized and normalised, all in one go. The
        result is converted as Lightning converts a loaded batch for the run's precision."""
        if not self.hparams.on_device:
            return batch
        size = self.hparams.image_size
        if self.trainer.training:
            images, labels = self._on_device["train"]
            index = batch[:, 0]
            batch = augment(images[index], batch[:, 1:], size), labels[index]
        else:
            images, labels = self._on_device["test" if self.trainer.testing or self.trainer.predicting else "val"]
            batch = to_model_input(images[batch], size), labels[batch]
        return self.trainer.precision_plugin.convert_input(batch)

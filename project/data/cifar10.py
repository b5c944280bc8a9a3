"""CIFAR-10: its official files, read without arbitrary unpickling, their download, and
:class:`CIFAR10DataModule`, the generic :class:`~project.toolkit.data.datamodule.ImageArrayDataModule` on them.

The data set is read from the official python-format files (``cifar-10-batches-py/``), downloaded
once per node if missing, checked for structure (not re-hashed) on every start, and served with the
standard augmentation at any ``image_size`` (the material upscales 32 px to 112 px).
``synthetic=True`` swaps in random CIFAR-shaped data that needs no disk and no network.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import numpy as np

from project.toolkit.data.datamodule import ImageArrayDataModule
from project.toolkit.data.files import download_archive, load_numpy_pickle
from project.toolkit.errors import DataError
from project.toolkit.log import get_logger

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
# Per-channel mean and standard deviation of the 50,000 training images on the 0-1 scale, the values
# CIFAR-10 code commonly uses; declared, so no run has to measure them.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


# --------------------------------------------------------------------------- reading the files


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one official batch file and check its structure.

    Returns images as uint8 ``(N, 32, 32, 3)`` and labels as int64 ``(N,)``.
    """
    entry = load_numpy_pickle(path)
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
    names = load_numpy_pickle(path).get("label_names")
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
    """Download, verify and unpack the official archive into ``data_dir / BASE_FOLDER``, atomically
    (:func:`~project.toolkit.data.files.download_archive`)."""
    download_archive(
        url, md5, data_dir, BASE_FOLDER, is_complete=lambda folder: not missing_files(folder), timeout=timeout
    )


# --------------------------------------------------------------------------- the data module


class CIFAR10DataModule(ImageArrayDataModule):
    """CIFAR-10 (or a synthetic stand-in of the same shape) for image classification. Its options are the
    generic data module's (:class:`~project.toolkit.data.datamodule.ImageArrayDataModule`, whose docs
    ``--help`` shows): ``data_dir`` holds ``cifar-10-batches-py/``, ``download`` fetches the official
    archive when a file is missing, and the whole set takes about 180 MB as uint8 (``on_device``).
    ``image_size`` 32 is CIFAR's native size, 112 the material's upscaled one.
    """

    num_classes = NUM_CLASSES
    image_shape = IMAGE_SHAPE
    mean = CIFAR10_MEAN
    std = CIFAR10_STD
    default_image_size = 112  # the material's upscaled size; the default val_size, a tenth, holds out 5,000

    @property
    def root(self) -> Path:
        """Where the official files are: ``data_dir / cifar-10-batches-py``."""
        return self.data_dir / BASE_FOLDER

    def prepare_files(self) -> None:
        """Download the official archive if any file is missing and ``download`` allows; else say
        where it looked and the ways out."""
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

    def load_split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """The five training files, or the test file; the class names from ``batches.meta``."""
        missing = missing_files(self.root)
        if missing:  # prepare_data ran on another node, or was skipped
            raise DataError(f"{self.root} is missing {', '.join(missing)}; run with --data.download=true")
        self.label_names = read_label_names(self.root / META_FILE)
        return read_split(self.root, train=train)

"""The data sets, one file each: :mod:`project.data.cifar10` is the default (``--data=...`` picks
another), :mod:`project.data.folder` takes a folder of images in class folders. A data set is a small
subclass of :class:`ImageArrayDataModule` (the generic machinery, re-exported here with its helpers):
``from project.data import ImageArrayDataModule``."""

from project.data.cifar10 import (
    BASE_FOLDER,
    CIFAR10_MD5,
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR10_URL,
    IMAGE_SHAPE,
    META_FILE,
    NUM_CLASSES,
    TEST_FILE,
    TRAIN_FILES,
    CIFAR10DataModule,
    download_cifar10,
    missing_files,
    read_batch,
    read_label_names,
    read_split,
)
from project.data.folder import ImageFiles, ImageFolderDataModule
from project.toolkit.data import *  # noqa: F403  (the generic names, for a data set's file)
from project.toolkit.data import __all__ as _generic

__all__ = [
    *_generic,
    "BASE_FOLDER",
    "CIFAR10_MD5",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR10_URL",
    "IMAGE_SHAPE",
    "META_FILE",
    "NUM_CLASSES",
    "TEST_FILE",
    "TRAIN_FILES",
    "CIFAR10DataModule",
    "ImageFiles",
    "ImageFolderDataModule",
    "download_cifar10",
    "missing_files",
    "read_batch",
    "read_label_names",
    "read_split",
]

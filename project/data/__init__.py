"""The data: a generic data module for image sets held in memory, and CIFAR-10 on it.

- :mod:`project.data.augmentation`: the training augmentation as pure functions of
  ``(seed, epoch, image index)``, for one image or a batch, on any device;
- :mod:`project.data.samplers`: the resumable training sampler and the evaluation batch sampler
  that gives every process as many batches;
- :mod:`project.data.datasets`: the Datasets over uint8 image arrays that the loaders read;
- :mod:`project.data.datamodule`: :class:`ImageArrayDataModule`, the data module that serves any
  such arrays (both pipelines, the global batch split across processes); a data set subclasses it;
- :mod:`project.data.cifar10`: CIFAR-10's files, their download, and :class:`CIFAR10DataModule`.

Every public name is re-exported here: ``from project.data import CIFAR10DataModule``.
"""

from project.data.augmentation import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    PADDING,
    augment,
    crop_and_flip,
    draw_crops_and_flips,
    to_model_input,
)
from project.data.cifar10 import (
    BASE_FOLDER,
    CIFAR10_MD5,
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
from project.data.datamodule import ImageArrayDataModule
from project.data.datasets import (
    AugmentedImages,
    AugmentKeys,
    ImageArrayDataset,
    IndexBatches,
    Indices,
    crop_and_flip_of,
)
from project.data.samplers import EpochIndex, EvenBatchSampler, TrainingSampler

__all__ = [
    "BASE_FOLDER",
    "CIFAR10_MD5",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR10_URL",
    "IMAGE_SHAPE",
    "META_FILE",
    "NUM_CLASSES",
    "PADDING",
    "TEST_FILE",
    "TRAIN_FILES",
    "AugmentKeys",
    "AugmentedImages",
    "CIFAR10DataModule",
    "EpochIndex",
    "EvenBatchSampler",
    "ImageArrayDataModule",
    "ImageArrayDataset",
    "IndexBatches",
    "Indices",
    "TrainingSampler",
    "augment",
    "crop_and_flip",
    "crop_and_flip_of",
    "download_cifar10",
    "draw_crops_and_flips",
    "missing_files",
    "read_batch",
    "read_label_names",
    "read_split",
    "to_model_input",
]

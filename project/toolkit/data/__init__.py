"""The generic data machinery for image sets held in memory: augmentation, statistics, samplers, Datasets and
:class:`ImageArrayDataModule`; a data set is one small subclass of it in ``project/data/<name>.py``."""

from project.toolkit.data.augmentation import PADDING, augment, crop_and_flip, draw_crops_and_flips, to_model_input
from project.toolkit.data.datamodule import ImageArrayDataModule
from project.toolkit.data.datasets import AugmentedImages, ImageArrayDataset, IndexBatches, crop_and_flip_of
from project.toolkit.data.samplers import EpochIndex, EvenBatchSampler, KeyBatches, SliceBatches, TrainingSampler
from project.toolkit.data.statistics import ChannelStats, measure_channel_stats

__all__ = [
    "PADDING", "AugmentedImages", "ChannelStats", "EpochIndex", "EvenBatchSampler", "ImageArrayDataModule",
    "ImageArrayDataset", "IndexBatches", "KeyBatches", "SliceBatches", "TrainingSampler", "augment", "crop_and_flip",
    "crop_and_flip_of", "draw_crops_and_flips", "measure_channel_stats", "to_model_input",
]  # fmt: skip

"""The generic data machinery for image sets held in memory; a data set is one small subclass of
:class:`ImageArrayDataModule` in the template layer (``project/data/<name>.py``).

- :mod:`.augmentation`: the training augmentation as pure functions of ``(seed, epoch, image index)``,
  for one image or a batch, on any device;
- :mod:`.statistics`: a data set's per-channel normalisation statistics, measured from its images;
- :mod:`.declarations`: the checks of what a data set class declares (classes, image shape, statistics);
- :mod:`.samplers`: the resumable training sampler and the evaluation batch sampler that gives every
  process as many batches; the on-device path's batches of indices, which need no DataLoader;
- :mod:`.datasets`: the Datasets over uint8 image arrays that the loaders read;
- :mod:`.datamodule`: :class:`ImageArrayDataModule`, the data module that serves any such arrays (both
  pipelines, the global batch split across processes).
"""

from project.toolkit.data.augmentation import (
    PADDING,
    augment,
    crop_and_flip,
    draw_crops_and_flips,
    to_model_input,
)
from project.toolkit.data.datamodule import ImageArrayDataModule
from project.toolkit.data.datasets import (
    AugmentedImages,
    ImageArrayDataset,
    IndexBatches,
    crop_and_flip_of,
)
from project.toolkit.data.samplers import EpochIndex, EvenBatchSampler, KeyBatches, SliceBatches, TrainingSampler
from project.toolkit.data.statistics import ChannelStats, measure_channel_stats

__all__ = [
    "PADDING",
    "AugmentedImages",
    "ChannelStats",
    "EpochIndex",
    "EvenBatchSampler",
    "ImageArrayDataModule",
    "ImageArrayDataset",
    "IndexBatches",
    "KeyBatches",
    "SliceBatches",
    "TrainingSampler",
    "augment",
    "crop_and_flip",
    "crop_and_flip_of",
    "draw_crops_and_flips",
    "measure_channel_stats",
    "to_model_input",
]

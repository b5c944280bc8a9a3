"""What the toolkit's parts read of each other, declared in one place: of a strategy (:class:`StrategyLayout`, through
:func:`layout_of`) and of a data module (:class:`ImageData`, through :func:`image_data`). Lightning's own strategies and
a user's LightningDataModule have neither, and get the defaults; the template's have both."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class StrategyLayout:
    """How a strategy spreads a run: what the data module, the timing callback and precise BatchNorm need of it."""

    sample_copies: int = 1  # processes that see each sample: a pipeline's stages all do; the data deals to the rest
    parallel_plan: dict[str, Any] | None = None  # fsdp's units or the pipeline's stages, for timing.json
    bubble: Any = None  # the pipeline's BubbleMeter (project/toolkit/timing/bubble.py), once fit set it up


@runtime_checkable
class DescribesLayout(Protocol):
    """A strategy that says how it spreads a run (the template's fsdp and pipeline)."""

    def layout(self) -> StrategyLayout: ...


def layout_of(strategy: object) -> StrategyLayout:
    """``strategy``'s layout; every other strategy's: each sample seen once, no plan, no bubble."""
    return strategy.layout() if isinstance(strategy, DescribesLayout) else StrategyLayout()


@runtime_checkable
class ImageData(Protocol):
    """What the toolkit reads of a data module beyond Lightning's (:class:`project.toolkit.data.ImageArrayDataModule`
    has it all): the image channels, the input path it took, the default batch it lowered, class and file names, and a
    pass over the training batches outside the training loop."""

    in_channels: int  # the CLI links it to model.in_channels
    input_path: Any  # project.toolkit.data.input_path.InputPath: on the device or a DataLoader, its workers, why
    batch_lowered_from: int | None  # the default batch, where setup lowered it for a small data set; else None
    label_names: list[str]
    predict_names: list[str] | None  # the names of the images predict sees, where they are files

    def training_batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


def image_data(trainer: Any) -> ImageData | None:
    """``trainer``'s data module where it is an :class:`ImageData`; None for any other, or none."""
    return trainer.datamodule if isinstance(trainer.datamodule, ImageData) else None


def data_settings(trainer: Any) -> Mapping[str, Any]:
    """The hyperparameters of ``trainer``'s data module (``image_size``, the global ``batch_size``, ...); or none."""
    return trainer.datamodule.hparams if trainer.datamodule is not None else {}


def image_channels(trainer: Any) -> int:
    """Channels of the images ``trainer``'s data module gives; 3 where it does not say."""
    data = image_data(trainer)
    return int(data.in_channels) if data is not None else 3

"""Generic pieces a LightningModule may use, kept out of the template's model so it stays short: the
warmed-up cosine learning-rate schedule and a per-sample mean metric that never waits for the device."""

from __future__ import annotations

import math

import torch
from torchmetrics import MeanMetric


class WarmupCosine:
    """Learning-rate factor per optimizer step: a linear warm-up to 1 over ``warmup_steps``, then
    cosine annealing to 0 at ``total_steps`` (for ``torch.optim.lr_scheduler.LambdaLR``).

    >>> factor = WarmupCosine(warmup_steps=10, total_steps=110)
    >>> [round(factor(step), 3) for step in (0, 9, 10, 60, 110)]
    [0.1, 1.0, 1.0, 0.5, 0.0]
    """

    def __init__(self, warmup_steps: int, total_steps: int) -> None:
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


class SampleMean(MeanMetric):
    """The mean of per-sample values over every batch (and, reduced by torchmetrics, every rank):
    exact whatever the batch and shard sizes, as each sample weighs the same.

    Unlike :class:`torchmetrics.MeanMetric` an update never reads its input on the host: MeanMetric
    checks every update for NaN with a Python ``if``, a device sync per batch. Its
    ``nan_strategy="disable"``, which skips the check, also drops the weights (torchmetrics 1.9), so
    the sum and the count are kept here. A NaN shows up in the mean rather than being left out.

    >>> mean = SampleMean()
    >>> mean.update(torch.tensor([1.0, 2.0]))
    >>> mean.update(torch.tensor([6.0]))
    >>> mean.compute().item()
    3.0
    """

    def update(self, values: torch.Tensor) -> None:  # type: ignore[override]
        # In place: ``self.weight += n`` would also set the attribute again, through nn.Module's
        # __setattr__, about a microsecond each on a CPU, twice per update, every step.
        self.mean_value.add_(values.detach().sum(dtype=self.mean_value.dtype))
        self.weight.add_(values.numel())  # a Python number: no host-to-device copy

    def reset(self) -> None:
        # Ordinary tensors even where an evaluation epoch ends under inference mode: torch refuses to update an
        # inference tensor in place outside that mode, where the next updates may come (a fit after a validate).
        with torch.inference_mode(False):
            super().reset()

"""The work of ``--callbacks.ema=true`` (:mod:`project.toolkit.callbacks.ema`), loaded by a fit that switches it on:
an exponential moving average of the weights, updated on the device with no host read. Lightning's
``EMAWeightAveraging`` reads ``AveragedModel.n_averaged`` on the host twice a step, a wait for the GPU each time."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from torch.optim.swa_utils import get_ema_multi_avg_fn

from project.toolkit.errors import ProjectError
from project.toolkit.interfaces import layout_of

TRAINED = "current_model_state"  # a checkpoint's trained weights, beside the averaged ones (Lightning's key for them)


class AveragedWeights(Callback):
    """After each optimizer step, ``average = decay * average + (1 - decay) * weights`` for every floating-point
    parameter and buffer (BatchNorm statistics included), from the weights the fit starts (or resumes) with. Each
    validation runs on the average (swapped in, then out); a checkpoint holds it as its ``state_dict``, the trained
    weights under ``current_model_state`` for resuming; the module holds it once the fit ends."""

    def __init__(self, decay: float = 0.999) -> None:
        self.update = get_ema_multi_avg_fn(decay)  # torch's foreach lerp, on the device
        self.names: list[str] = []  # the state_dict names of the module's floating-point tensors
        self.weights: list[torch.Tensor] = []  # those tensors, the module's own
        self.other: list[torch.Tensor] = []  # the average; the trained weights while the module holds the average
        self.swapped, self._back, self._step, self._loaded = False, False, 0, {}

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        sharded = isinstance(strategy, DeepSpeedStrategy | FSDPStrategy | ModelParallelStrategy)
        if stage == "fit" and (sharded or layout_of(strategy).sample_copies > 1):
            name = type(strategy).__name__
            raise ProjectError(f"--callbacks.ema=true is not for {name}, whose processes hold parts of the weights")
        if stage == "fit" and any(getattr(c, "save_weights_only", False) for c in trainer.checkpoint_callbacks):
            raise ProjectError("--callbacks.ema=true saves two sets of weights: leave checkpoint.save_weights_only off")

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn == "fit" and TRAINED in checkpoint:  # resuming: the module took the average, train on
            self._loaded = checkpoint["state_dict"]
            pl_module.load_state_dict(checkpoint[TRAINED])

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        state = {name: t for name, t in pl_module.state_dict(keep_vars=True).items() if t.is_floating_point()}
        self.names, self.weights = list(state), list(state.values())
        with torch.no_grad():  # on the module's device, in its memory format
            self.other = [torch.empty_like(t).copy_(self._loaded.get(name, t)) for name, t in state.items()]
        self.swapped, self._loaded, self._step = False, {}, trainer.global_step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if trainer.global_step > self._step:  # after an optimizer step, not each batch when gradients accumulate
            self._step = trainer.global_step
            self.update(self.other, self.weights, None)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._back = bool(self.other) and not self.swapped  # before precise_bn's: it recomputes the average's
        if self._back:
            self._swap()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._back:
            self._swap()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.other and not self.swapped:
            self._swap()

    def _swap(self) -> None:
        with torch.no_grad():
            for i, tensor in enumerate(self.weights):
                kept = tensor.detach().clone()
                tensor.copy_(self.other[i])
                self.other[i] = kept
        self.swapped = not self.swapped

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.other:
            state, other = checkpoint["state_dict"], dict(zip(self.names, self.other, strict=True))
            averaged, trained = (state, {**state, **other}) if self.swapped else ({**state, **other}, state)
            checkpoint["state_dict"], checkpoint[TRAINED] = averaged, trained

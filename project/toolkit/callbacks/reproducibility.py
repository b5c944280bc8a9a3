"""Runs that can be repeated, and resumed, bit for bit: :class:`ReseedEveryEpoch`."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything

from project.toolkit.compat import restart_training_batches
from project.toolkit.log import get_logger

log = get_logger(__name__)


class ReseedEveryEpoch(Callback):
    """A run resumed from any checkpoint, at an epoch boundary or mid-epoch, goes on exactly as the unbroken run:
    every epoch re-seeds Python, NumPy and torch from ``seed + epoch`` (Lightning seeds once per process), so the
    data order and augmentation depend only on (seed, epoch, image index); checkpoints keep the generators' states
    for a mid-epoch resume. Nothing happens in a run that is not seeded (``--seed_everything=null``)."""

    def __init__(self) -> None:
        self._first_epoch_of_process = True
        self._saved_generators: dict[str, Any] | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning calls no on_train_epoch_start for an epoch it resumes in the middle of.
        seed = os.environ.get("PL_GLOBAL_SEED")
        if seed is None or not trainer.fit_loop.restarted_mid_epoch:
            return
        self._first_epoch_of_process = False
        # The batches of this epoch the checkpoint holds (steps are optimizer steps; every epoch has
        # num_training_batches batches): 0 if saved after an epoch's last batch, as Lightning moved on to the next.
        batches = trainer.global_step * trainer.accumulate_grad_batches
        batches_done = batches - trainer.current_epoch * trainer.num_training_batches
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if not hasattr(sampler, "resume_at"):
            log.warning("resumed mid-epoch with a sampler that cannot skip batches: this epoch starts over")
            return
        sampler.resume_at(trainer.current_epoch, batches_done)
        if batches_done == 0:
            _reseed(int(seed), trainer.current_epoch)  # what on_train_epoch_start would have done
        restart_training_batches(trainer)  # its iterator was made before resume_at
        if batches_done > 0 and self._saved_generators is not None:
            _set_generator_states(self._saved_generators)  # as they were after the checkpoint's step

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        seed = os.environ.get("PL_GLOBAL_SEED")
        if seed is None:
            return
        _reseed(int(seed), trainer.current_epoch)
        resumed = self._first_epoch_of_process and trainer.current_epoch > 0
        self._first_epoch_of_process = False
        if resumed:
            restart_training_batches(trainer)  # the sampler already holds this epoch (set_epoch ran)

    def state_dict(self) -> dict[str, Any]:
        return {"generators": _generator_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved_generators = state_dict.get("generators")


def _reseed(seed: int, epoch: int) -> None:
    seed_everything(seed + epoch, workers=True, verbose=False)
    os.environ["PL_GLOBAL_SEED"] = str(seed)  # seed_everything overwrote it; keep the run's base seed


def _generator_states() -> dict[str, Any]:
    """The states of the global generators, in types a ``weights_only`` checkpoint load accepts."""
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gauss)
    states = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_generator_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    kind, keys, position, has_gauss, cached_gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gauss))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])

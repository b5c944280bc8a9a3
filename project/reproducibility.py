"""Runs that can be repeated, and resumed, bit for bit."""

from __future__ import annotations

import os

from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything


class ReseedEveryEpoch(Callback):
    """Make every training epoch start from a state that depends only on ``(seed, epoch)``, so a
    run resumed from a checkpoint continues exactly as the unbroken run would have.

    1. Re-seed Python, NumPy and torch (all devices) from ``seed + epoch``. Augmentation, dropout
       and DataLoader worker seeds draw from these generators; Lightning seeds them once per
       process and does not store them in checkpoints.
    2. On the first epoch after a resume, rebuild the training iterator. Lightning creates it while
       setting up the optimizer (``estimated_stepping_batches``), before the checkpoint restores the
       epoch counter, so it would replay epoch 0's shuffle and augmentation instead of this epoch's.

    Exception: DataLoader workers kept alive across epochs (``persistent_workers``, the default
    when ``num_workers > 0``) keep their own generators, which a resumed run restarts. Does nothing
    when the run is not seeded (``--seed_everything=null``).
    """

    def __init__(self) -> None:
        self._first_epoch_of_process = True

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        seed = os.environ.get("PL_GLOBAL_SEED")
        if seed is None:
            return
        seed_everything(int(seed) + trainer.current_epoch, workers=True, verbose=False)
        os.environ["PL_GLOBAL_SEED"] = seed  # seed_everything overwrote it; keep the run's base seed
        resumed = self._first_epoch_of_process and trainer.current_epoch > 0
        self._first_epoch_of_process = False
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)  # Lightning 2.x internals
        if resumed and fetcher is not None:
            iter(fetcher)  # the sampler already holds this epoch (set_epoch ran before this hook)

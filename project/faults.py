"""Surviving faults: checkpoints that are never half-written, checkpoint files checked before use,
and a run that stops at the first non-finite loss instead of training on garbage."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer

from project.errors import ProjectError


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a checkpoint next to its target under a temporary name, flush it to disk, then rename
    it into place: a crash (``kill -9``, power loss, full disk) mid-write leaves the previous
    ``last.ckpt`` intact instead of a truncated one. The rename is atomic on POSIX file systems."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)


class AtomicCheckpoints(Callback):
    """Installs :class:`AtomicCheckpointIO` on strategies that save one plain torch file.

    Strategies with their own writer (XLA's device-aware one, sharded FSDP directories) keep it.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()


def check_checkpoint_file(path: str | Path, num_classes: int | None = None) -> None:
    """Raise a one-line :class:`ProjectError` naming ``path`` unless it is a loadable Lightning
    checkpoint (a file with a ``state_dict``) or a sharded checkpoint folder, and, given
    ``num_classes``, one of a model with that many classes (another task's classifier head would
    otherwise fail deep inside ``load_state_dict``).

    Cheap: the file is memory-mapped, not read into memory.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / ".metadata").is_file() and not (path / "meta.pt").is_file():
            raise ProjectError(f"--ckpt_path={path}: a folder, but not a sharded checkpoint (no .metadata inside)")
        return
    if not path.is_file():
        raise ProjectError(f"--ckpt_path={path}: no such file; pass a checkpoint file, 'last' or 'best'")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # truncated, garbled, or not a torch file at all
        raise ProjectError(
            f"--ckpt_path={path}: not a readable checkpoint ({type(err).__name__}); it may be truncated "
            "(a crash while saving) or not a checkpoint; use another one, e.g. an epoch*.ckpt beside it"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ProjectError(f"--ckpt_path={path}: a torch file, but not a Lightning checkpoint (no 'state_dict')")
    trained_for = checkpoint.get("hyper_parameters", {}).get("num_classes")
    if num_classes is not None and trained_for is not None and trained_for != num_classes:
        raise ProjectError(
            f"--ckpt_path={path}: a model of {trained_for} classes, but this data has {num_classes}; "
            "use a checkpoint trained on this data"
        )


class FiniteLossGuard(Callback):
    """Stop training at the first NaN or infinite training loss, saying where.

    Checking a loss means reading it on the host, which on an accelerator waits for the device.
    To keep that off the critical path the guard reads the PREVIOUS step's loss, which the device
    has finished by then, so the check costs no stall. Before any checkpoint is written, and at the
    end of training, it checks the latest loss too: nothing is ever saved from a bad step.
    """

    def __init__(self) -> None:
        self._pending: tuple[torch.Tensor, int, int] | None = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._check()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            # global_step already counts this step: it is the step's number, counted from 1
            self._pending = (loss.detach(), trainer.global_step, trainer.current_epoch)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._check()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check()

    def _check(self) -> None:
        if self._pending is None:
            return
        loss, step, epoch = self._pending
        self._pending = None
        value = float(loss)
        if not math.isfinite(value):
            raise ProjectError(
                f"training loss is {value} at step {step} (epoch {epoch}); stopped, nothing saved from it. "
                "Lower --model.lr, check the data, or resume from the last good checkpoint with --ckpt_path"
            )

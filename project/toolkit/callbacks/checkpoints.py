"""Checkpoints that survive faults: never half-written (:class:`AtomicCheckpoints`), saved when the run
is told to stop (SIGTERM, Ctrl-C: :class:`CheckpointOnSignal`), holding the final weights
(:class:`FinalCheckpoint`), checked before use (:func:`check_checkpoint_file`) and found by name
(``--ckpt_path=last|best``: :func:`find_checkpoint`)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.toolkit.checkpoint_io import AtomicCheckpointIO
from project.toolkit.compat import last_global_step_saved
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger
from project.toolkit.strategies.deepspeed import single_device_checkpoint

log = get_logger(__name__)


class AtomicCheckpoints(Callback):
    """Installs :class:`AtomicCheckpointIO` on strategies that save one plain torch file.

    Strategies with their own writer (XLA's device-aware one, sharded FSDP directories) keep it.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()


class CheckpointOnSignal(Callback):
    """Save ``last.ckpt`` when the run is told to stop, so ``fit --ckpt_path=last`` goes on from there.

    SIGTERM is what a preempted cloud VM, ``docker stop``, Kubernetes and SLURM (at the end of a job's
    time, or on ``scancel``) send before they kill. Lightning then finishes the training step under
    way on every rank and raises :class:`SIGTERMException`; this callback saves the checkpoint at that
    step boundary, where the weights, optimizer and loop counters agree. Ctrl-C (SIGINT) is turned into
    the same SIGTERM, so it too stops cleanly between steps; a second Ctrl-C interrupts at once.

    Attributes:
        signum: The signal that stopped the run, or None. The CLI exits with ``128 + signum``, the
            status a shell gives a process killed by that signal, so job schedulers see a stop, not
            a finished job.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous_sigint: Any = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Not earlier: Lightning records the handlers in place when it sets its own (after on_fit_start)
        # and puts those back when it ends, which would leave this one installed.
        self.signum = None
        # Only the main thread can set handlers. A process started with Ctrl-C ignored (`nohup`, `cmd &`
        # in a script) keeps ignoring it, as Python itself does.
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        ):
            self._previous_sigint = signal.signal(signal.SIGINT, self._sigint_to_sigterm)

    def _sigint_to_sigterm(self, signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, self._previous_sigint)  # a second Ctrl-C: KeyboardInterrupt at once
        self.signum = signal.SIGINT
        log.warning("Ctrl-C: finishing this step and saving a checkpoint (Ctrl-C again to stop at once)")
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler takes it from here, on every rank

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore_sigint()  # Lightning calls no teardown hook after an exception
        if not isinstance(exception, SIGTERMException) or not trainer.training:
            return
        self.signum = self.signum or signal.SIGTERM
        checkpoint = trainer.checkpoint_callback
        folder = Path(checkpoint.dirpath) if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath else None
        if folder is None:
            log.warning("Stopped by %s; no ModelCheckpoint folder to save into", signal.Signals(self.signum).name)
            return
        path = folder / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
        trainer.save_checkpoint(path, weights_only=False)  # on every rank: saving is collective under fsdp
        log.warning(
            "Stopped by %s at epoch %d, step %d; saved %s. Resume with the same command and --ckpt_path=last",
            signal.Signals(self.signum).name,
            trainer.current_epoch,
            trainer.global_step,
            path,
        )

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore_sigint()

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None


class FinalCheckpoint(Callback):
    """Make ``last.ckpt`` hold the weights training ended with.

    ModelCheckpoint writes ``last.ckpt`` on its own schedule only: with
    ``--checkpoint.every_n_train_steps=N`` it no longer saves at epoch ends, so a run whose length is
    not a multiple of N would end with a ``last.ckpt`` up to N - 1 steps old, and
    ``test --ckpt_path=last`` would test those older weights.
    """

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        if not isinstance(checkpoint, ModelCheckpoint) or not checkpoint.save_last or not checkpoint.dirpath:
            return
        if last_global_step_saved(checkpoint) == trainer.global_step:
            return  # saved at this step already
        path = Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
        # weights_only as ModelCheckpoint would (Lightning logs a line when it is not given)
        trainer.save_checkpoint(path, weights_only=checkpoint.save_weights_only)
        # ModelCheckpoint's own train-end save of a run that saved nothing before (no validation) then
        # writes this same file, instead of a second one named last-v1.ckpt beside it.
        checkpoint.last_model_path = str(path)


def check_checkpoint_file(path: str | Path, num_classes: int | None = None) -> dict[str, Any] | None:
    """Raise a one-line :class:`ProjectError` naming ``path`` unless it is a loadable Lightning
    checkpoint (a file with a ``state_dict``) or a sharded checkpoint folder, and, given
    ``num_classes``, one of a model with that many classes (another task's classifier head would
    otherwise fail deep inside ``load_state_dict``). Returns the file's checkpoint, for the checks that
    follow; None for a folder.

    Cheap: the file is memory-mapped, not read into memory.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / ".metadata").is_file() and not (path / "meta.pt").is_file():
            raise ProjectError(f"--ckpt_path={path}: a folder, but not a sharded checkpoint (no .metadata inside)")
        return None
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
    return checkpoint


def find_checkpoint(which: str, runs_root: Path, allow_none: bool = False) -> str | None:
    """The ``last.ckpt`` of the newest run under ``runs_root``, or that run's best checkpoint.

    With ``allow_none`` (``fit --ckpt_path=last`` before any run: start from scratch) a missing
    checkpoint returns None; otherwise it is an error.
    """
    runs = sorted(runs_root.glob("version_*/checkpoints/last.ckpt"), key=_version_number)
    if not runs:
        if allow_none:
            log.warning("--ckpt_path=%s: no checkpoint under %s yet; starting from scratch", which, runs_root)
            return None
        raise ProjectError(
            f"--ckpt_path={which}: no run with a checkpoint under {runs_root} "
            "(looked for version_*/checkpoints/last.ckpt); train first, or pass a checkpoint file"
        )
    last = runs[-1]
    if which == "last":
        log.info("--ckpt_path=last: %s", last)
        return str(last)
    state = torch.load(single_device_checkpoint(last), map_location="cpu", weights_only=False).get("callbacks", {})
    best = next((s.get("best_model_path") for k, s in state.items() if k.startswith("ModelCheckpoint")), None)
    if best == "":  # ranked nothing: a run without validation (data.val_size=0) keeps last.ckpt only
        log.warning("--ckpt_path=best: the run of %s ranked no checkpoint (no validation); using its last.ckpt", last)
        return str(last)
    if not best or not Path(best).is_file():
        raise ProjectError(
            f"--ckpt_path=best: the run of {last} recorded no best checkpoint that still exists ({best!r})"
        )
    log.info("--ckpt_path=best: %s", best)
    return best


def _version_number(last_ckpt: Path) -> int:
    """``.../version_12/checkpoints/last.ckpt`` -> 12, so version_10 sorts after version_9."""
    suffix = last_ckpt.parent.parent.name.removeprefix("version_")
    return int(suffix) if suffix.isdigit() else -1

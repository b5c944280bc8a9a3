"""The checkpoint family under one switch (:class:`Checkpoints`), and checkpoint files checked and found by
name (``--ckpt_path=last|best``)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.toolkit.checkpoint_io import AtomicCheckpointIO
from project.toolkit.errors import ProjectError
from project.toolkit.helpers import found, is_remote
from project.toolkit.log import get_logger
from project.toolkit.safe_load import check_sharded_metadata, read_checkpoint
from project.toolkit.strategies.deepspeed import is_deepspeed_checkpoint

__all__ = ["AtomicCheckpointIO", "Checkpoints", "check_checkpoint_file", "find_checkpoint"]

log = get_logger(__name__)


class Checkpoints(ModelCheckpoint):
    """Lightning's ModelCheckpoint (``last.ckpt``, the best ``val/acc``) that also writes atomically, stops
    training on SIGTERM or Ctrl-C (a second Ctrl-C interrupts at once) at the end of a training step that every
    process agrees on and saves ``last.ckpt`` there (the CLI exits 128 + :attr:`signum`), ends with ``last.ckpt``
    holding the final weights, and resumes into a new run folder without Lightning's "dirpath has changed" warning.

    Args:
        atomic: Write checkpoints under a temporary name beside them, then rename.
        save_on_signal: Save ``last.ckpt`` when SIGTERM or Ctrl-C stops training.
        kwargs: Lightning's ModelCheckpoint options (``monitor``, ``save_top_k``, ``every_n_train_steps``, ...).
    """

    def __init__(self, *args: Any, atomic: bool = True, save_on_signal: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.atomic, self.save_on_signal = atomic, save_on_signal
        self.every_steps = kwargs.get("every_n_train_steps") or 0
        self.signum: int | None = None  # the signal that asked training to stop
        self.saved_step: int | None = None  # the global step of the latest save
        self._previous: dict[int, Any] = {}  # the handlers ours replaced
        self._owner = os.getpid()  # DataLoader workers forked from it inherit the handlers, not the duty
        self._group: Any = None  # the process group the stop is agreed in (None: the default one)
        self._flag: torch.Tensor | None = None  # the one-number buffer it is agreed through; None: one process

    @property
    def last_path(self) -> str | None:
        if not self.dirpath:
            return None
        return os.path.join(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")  # a URL stays one

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # Lightning's save is atomic only where the temp folder shares the run's file system (checkpoint_io.py).
        if self.atomic and type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._catch_signals(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._catch_signals(trainer)

    def _catch_signals(self, trainer: Trainer) -> None:
        """Replace Lightning's SIGTERM handler, set after on_fit_start, by one that only notes the signal: Lightning's
        runs a collective inside the handler, which deadlocks the ranks when it lands inside another collective
        (https://github.com/Lightning-AI/pytorch-lightning/issues/20806). The ranks agree in on_train_batch_end."""
        if self._flag is None and dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            # once, on every rank alike: creating a group is collective
            self._group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            self._flag = torch.zeros(1, dtype=torch.int64)
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        self.signum, self._owner = None, os.getpid()
        self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._note_signal)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # `nohup`, `cmd &`: keep ignoring it
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._note_signal)

    def _note_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner:  # a forked DataLoader worker: end as it would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, self._previous[signal.SIGINT])  # a second Ctrl-C: KeyboardInterrupt at once
            log.warning("Ctrl-C: finishing this step and saving a checkpoint (Ctrl-C again to stop at once)")
        else:
            log.warning("Received %s: every process stops at the end of a training step", signal.Signals(signum).name)
        self.signum = self.signum or signum

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args)
        if self.every_steps and self._waits(trainer):
            # Lightning defers every_n_train_steps saves until the monitored metric exists, so a first epoch had
            # none (https://github.com/Lightning-AI/pytorch-lightning/issues/20185): last.ckpt is saved meanwhile.
            trainer.save_checkpoint(self.last_path, weights_only=self.save_weights_only)
            self.last_model_path = str(self.last_path)
        signum = self.signum or 0
        if self._flag is not None:  # a CPU tensor through gloo: no wait for the device
            dist.all_reduce(self._flag.fill_(signum), op=dist.ReduceOp.MAX, group=self._group)
            signum = int(self._flag)
        if signum:
            self.signum = signum
            raise SIGTERMException  # Lightning calls on_exception, which saves, on every rank at this same step

    def _waits(self, trainer: Trainer) -> bool:
        """Whether Lightning holds back this step's save for a monitored metric that no validation has given yet."""
        step = trainer.global_step
        return bool(
            step % self.every_steps == 0
            and self.saved_step != step
            and self.save_last
            and self.dirpath
            and self.monitor is not None
            and self.monitor not in trainer.callback_metrics
            and not trainer.fast_dev_run
            and not trainer.sanity_checking
        )

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self.saved_step = trainer.global_step

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore_signals()  # Lightning calls no teardown hook after an exception
        if not (isinstance(exception, SIGTERMException) and trainer.training):
            super().on_exception(trainer, pl_module, exception)
            return
        self.signum = self.signum or signal.SIGTERM
        name = signal.Signals(self.signum).name
        if not (self.save_on_signal and self.dirpath):
            log.warning("Stopped by %s; no checkpoint saved (checkpoint.save_on_signal is off)", name)
            return
        # On every rank: saving is collective under fsdp.
        OnExceptionCheckpoint(self.dirpath, self.CHECKPOINT_NAME_LAST).on_exception(trainer)
        log.warning(
            "Stopped by %s at epoch %d, step %d; saved %s. Resume with the same command and --ckpt_path=last",
            name,
            trainer.current_epoch,
            trainer.global_step,
            self.last_path,
        )

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # ModelCheckpoint saves last.ckpt on its own schedule: with every_n_train_steps it may be up to N-1 steps
        # old at the end, and test --ckpt_path=last would test those weights.
        if self.save_last and self.dirpath and self.saved_step not in (None, trainer.global_step):
            trainer.save_checkpoint(self.last_path, weights_only=self.save_weights_only)
            self.last_model_path = str(self.last_path)
        super().on_train_end(trainer, pl_module)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore_signals()
        self._group, self._flag = None, None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)
        else:  # resumed into a new run folder: only the best checkpoint's path carries over
            self.best_model_path = state_dict["best_model_path"]

    def _restore_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
        self._previous = {}


def check_checkpoint_file(path: str | Path, trusted: bool = False) -> dict[str, Any] | None:
    """A one-line :class:`ProjectError` naming ``path`` unless it is a loadable Lightning checkpoint (or a
    sharded checkpoint folder) of plain data, or ``trusted``; returns the checkpoint (None for a folder). The file is
    memory-mapped, not read (a remote one, ``s3://``..., is read whole, as Lightning's own load of it does)."""
    path = path if (remote := is_remote(path)) else Path(path)
    if not remote and path.is_dir():
        if not (path / ".metadata").is_file() and not (path / "meta.pt").is_file():
            raise ProjectError(f"--ckpt_path={path}: a folder, but not a sharded checkpoint (no .metadata inside)")
        if not trusted and (path / ".metadata").is_file():
            check_sharded_metadata(path, "--ckpt_path")
        if (path / "meta.pt").is_file():
            read_checkpoint(path / "meta.pt", "--ckpt_path", trusted)
        return None
    if not remote and not path.is_file():
        raise ProjectError(f"--ckpt_path={path}: no such file; pass a checkpoint file, 'last' or 'best'")
    if remote:
        from project.toolkit.remote import read_url  # only for a remote file
    try:
        source = read_url(path, "--ckpt_path") if remote else path
        checkpoint = read_checkpoint(source, "--ckpt_path", trusted, mmap=not remote)
    except ProjectError:
        raise
    except Exception as err:  # truncated, garbled, or not a torch file at all
        raise ProjectError(
            f"--ckpt_path={path}: not a readable checkpoint ({type(err).__name__}); it may be truncated "
            "(a crash while saving) or not a checkpoint; use another one, e.g. an epoch*.ckpt beside it"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ProjectError(f"--ckpt_path={path}: a torch file, but not a Lightning checkpoint (no 'state_dict')")
    return checkpoint


def find_checkpoint(which: str, runs_root: Path | str, allow_none: bool = False, trusted: bool = False) -> str | None:
    """The ``last.ckpt`` of the newest run under ``runs_root``, or that run's best checkpoint (read from ``last.ckpt``,
    as plain data unless ``trusted``); None where there is none and ``allow_none`` (``fit --ckpt_path=last`` before
    any run)."""
    lasts = found(runs_root, "version_*/checkpoints/last.ckpt")  # sorted by number: version_10 after version_9
    runs = sorted(lasts, key=lambda p: int(n) if (n := Path(p).parent.parent.name[8:]).isdigit() else -1)
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
    if is_deepspeed_checkpoint(last):
        raise ProjectError(f"--ckpt_path=best: {last} is a DeepSpeed checkpoint folder; pass the checkpoint you want")
    state = (check_checkpoint_file(last, trusted) or {}).get("callbacks", {})
    best = next((s["best_model_path"] for s in state.values() if isinstance(s, dict) and "best_model_path" in s), None)
    if best == "":  # ranked nothing: a run without validation (data.val_size=0) keeps last.ckpt only
        log.warning("--ckpt_path=best: the run of %s ranked no checkpoint (no validation); using its last.ckpt", last)
        return str(last)
    if not best or not (is_remote(best) or Path(best).is_file()):  # a remote one: checked as it is read
        raise ProjectError(
            f"--ckpt_path=best: the run of {last} recorded no best checkpoint that still exists ({best!r})"
        )
    log.info("--ckpt_path=best: %s", best)
    return best

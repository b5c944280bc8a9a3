"""Surviving faults: checkpoints that are never half-written, checkpoint files checked before use,
a checkpoint saved when the run is told to stop (SIGTERM, Ctrl-C), and a run that stops at the first
non-finite loss instead of training on garbage."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.errors import ProjectError
from project.log import get_logger

log = get_logger(__name__)


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
        trainer.save_checkpoint(path)  # on every rank: saving is collective under fsdp
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
        if getattr(checkpoint, "_last_global_step_saved", None) == trainer.global_step:  # Lightning 2.x
            return  # saved at this step already
        trainer.save_checkpoint(
            Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
        )


class LostRankWatchdog(Callback):
    """Stop a multi-process run within seconds when one of its processes dies, and say which.

    Under ddp/fsdp every step waits for all ranks, so one rank killed (out of memory, a hardware
    fault, ``kill -9``) leaves the others waiting in a collective: on CPU (gloo) they fail at once
    with a bare "Connection reset by peer", on GPUs (NCCL) they may hang until a 10-30 minute timeout.
    For the processes Lightning starts on one machine (``--trainer.devices=N``) a thread watches them:
    the first process (rank 0) watches the ranks it started, and each of those watches rank 0. When
    one is gone, the watcher prints ``error: rank R of N died (...)`` and ends its own machine's
    processes, exiting 1. Every finished epoch's ``last.ckpt`` is intact (saves are atomic), so the
    run resumes with ``--ckpt_path=last``. Under torchrun, SLURM or several machines, the launcher
    reports a failed rank itself; this does nothing there.
    """

    def __init__(self, poll_seconds: float = 1.0) -> None:
        self.poll_seconds = poll_seconds
        self._children: list[subprocess.Popen] = []
        self._parent: tuple[int, int] | None = None  # (pid, global rank) of the process that started this one
        self._rank, self._world = 0, 1
        self._stop = threading.Event()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        launcher = trainer.strategy.launcher
        if trainer.world_size < 2 or not isinstance(launcher, _SubprocessScriptLauncher):
            return
        self._rank, self._world = trainer.global_rank, trainer.world_size
        if trainer.local_rank == 0:
            self._children = list(launcher.procs)
        else:
            self._parent = (os.getppid(), trainer.global_rank - trainer.local_rank)
        self._stop.clear()
        threading.Thread(target=self._watch, name="lost-rank-watchdog", daemon=True).start()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.stop_if_lost()

    def stop_if_lost(self, wait_seconds: float = 0.0) -> None:
        """If a watched process is gone (looking again for up to ``wait_seconds``), say so and exit.
        The CLI calls this when a collective operation fails, to name the rank behind the failure."""
        deadline = time.monotonic() + wait_seconds
        while True:
            lost = self._lost()
            if lost is not None:
                print(
                    f"error: {lost}; stopping rank {self._rank} too. Resume with the same command and --ckpt_path=last",
                    file=sys.stderr,
                    flush=True,
                )
                for child in self._children:
                    child.kill()
                os._exit(1)  # other threads may be blocked in a collective that never returns
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _lost(self) -> str | None:
        for local_rank, child in enumerate(self._children, start=1):
            code = child.poll()
            if code:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
                return f"rank {self._rank + local_rank} of {self._world} died ({how})"
        if self._parent is not None and os.getppid() != self._parent[0]:
            return f"rank {self._parent[1]} of {self._world}, which started this process, died"
        return None


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

    Checking a loss means reading it on the host, and a plain read on a GPU waits for every kernel
    queued so far, this step's too. So on CUDA the guard starts an asynchronous copy of each step's
    loss into pinned host memory and reads it one step later, waiting only for that copy (an event),
    which is done by then: the check costs no stall. Before any checkpoint is written, and at the
    end of training, it checks the latest loss too: nothing is ever saved from a bad step.
    """

    def __init__(self) -> None:
        self._pending: tuple[torch.Tensor, torch.cuda.Event | None, int, int] | None = None
        self._host: torch.Tensor | None = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._check()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            copied = None
            loss = loss.detach()
            if loss.is_cuda:
                # one pinned buffer for the whole run: _check above has read (and waited for) its last copy
                if self._host is None or self._host.shape != loss.shape or self._host.dtype != loss.dtype:
                    self._host = torch.empty(loss.shape, dtype=loss.dtype, pin_memory=True)
                host = self._host
                host.copy_(loss, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record()
                loss = host
            # global_step already counts this step: it is the step's number, counted from 1
            self._pending = (loss, copied, trainer.global_step, trainer.current_epoch)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._check()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check()

    def _check(self) -> None:
        if self._pending is None:
            return
        loss, copied, step, epoch = self._pending
        self._pending = None
        if copied is not None:
            copied.synchronize()
        value = float(loss)
        if not math.isfinite(value):
            raise ProjectError(
                f"training loss is {value} at step {step} (epoch {epoch}); stopped, nothing saved from it. "
                "Lower --model.lr, check the data, or resume from the last good checkpoint with --ckpt_path"
            )

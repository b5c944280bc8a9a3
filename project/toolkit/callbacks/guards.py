"""Stop a run that can no longer do useful work, saying why: a non-finite loss or a dead rank (:class:`Guards`),
memory running out (:func:`out_of_memory_message`, the line the CLI prints instead of the traceback)."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from project.toolkit.callbacks.checkpoints import Checkpoints
from project.toolkit.dotted import section_args
from project.toolkit.errors import ProjectError
from project.toolkit.helpers import human_bytes, shown_path
from project.toolkit.log import get_logger
from project.toolkit.training import logging_step

log = get_logger(__name__)

# What torch says when an allocation fails: on the host (its CPU allocator), on a GPU, and when the system
# killed a DataLoader worker (the kernel's out-of-memory killer, most often).
_HOST_OOM = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes")
_DEVICE_OOM = re.compile(r"(CUDA|MPS|XPU|HIP)[^.]*out of memory\.? Tried to allocate ([\d.]+ [KMGT]?i?B)")
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid\(?s?\)? [^)]*\) is killed by signal: Killed")


def out_of_memory_message(error: BaseException, data_config: Any = None) -> str | None:
    """One line for an out-of-memory ``error`` (where, how much, what to lower), or None for any other error."""
    text = str(error)
    args = section_args(data_config) or {}
    now = {key: f" (now {args.get(key)})" if args.get(key) is not None else "" for key in ("batch_size", "image_size")}
    lower = f"lower --data.batch_size{now['batch_size']} or --data.image_size{now['image_size']}"
    if match := _HOST_OOM.search(text):
        return f"out of host memory: the run tried to allocate {human_bytes(int(match.group(1)))} more; {lower}"
    if match := _DEVICE_OOM.search(text):
        return (
            f"out of {match.group(1)} device memory: the run tried to allocate {match.group(2)} more; {lower}, "
            "or use a lower --trainer.precision (16-mixed, bf16-mixed) or a sharding strategy (fsdp)"
        )
    if _WORKER_KILLED.search(text):
        return (
            f"a DataLoader worker was killed by the system, most likely for lack of host memory; {lower}, or lower "
            "--data.num_workers"
        )
    return None


class Guards(Callback):
    """Stops training at the first non-finite loss, and every process of the run within seconds of one dying (they
    would wait on it in a collective). The losses are read on the host together where the loggers write
    (:func:`~project.toolkit.training.logging_step`), at an epoch's end and before any save: a step never waits.

    Args:
        finite_loss: Stop at the first non-finite training loss.
        lost_rank: Stop every process when one of the run's processes dies.
        poll_seconds: How often the lost-rank watcher looks.
    """

    MAX_PENDING = 1000  # losses held at most between two reads (where the loggers write seldom or never)

    def __init__(self, finite_loss: bool = True, lost_rank: bool = True, poll_seconds: float = 1.0) -> None:
        self.finite_loss, self.lost_rank, self.poll_seconds = finite_loss, lost_rank, poll_seconds
        self._pending: list[tuple[torch.Tensor, int, int]] = []  # (loss, step, epoch) not read yet
        self._children: list[subprocess.Popen] = []
        self._parent: tuple[int, int] | None = None  # (pid, global rank) of the process that started this one
        self._rank, self._world = 0, 1
        self._checkpoint: Callback | None = None
        self._stop = threading.Event()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        procs = getattr(trainer.strategy.launcher, "procs", None)  # Lightning's subprocess launcher's children
        if not self.lost_rank or trainer.world_size < 2 or procs is None:
            return
        self._rank, self._world = trainer.global_rank, trainer.world_size
        self._checkpoint = trainer.checkpoint_callback
        if trainer.local_rank == 0:
            self._children = list(procs)
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
        """If a watched process is gone (within ``wait_seconds``), say so and exit; also run when a collective fails."""
        deadline = time.monotonic() + wait_seconds
        while True:
            lost = self._lost()
            if lost is not None:
                print(f"error: {lost}; stopping rank {self._rank} too. {self._saved()}", file=sys.stderr, flush=True)
                for child in self._children:
                    child.kill()
                os._exit(1)  # other threads may be blocked in a collective that never returns
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _saved(self) -> str:
        """What the run saved so far and how to go on from it."""
        checkpoint = self._checkpoint
        if not isinstance(checkpoint, ModelCheckpoint) or not checkpoint.dirpath:
            return "No checkpoint is kept (checkpointing is off): run the same command again to start over"
        last = Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
        if not last.is_file():
            return "Nothing was saved yet: run the same command again to start over"
        step = checkpoint.saved_step if isinstance(checkpoint, Checkpoints) else None
        at = f" (step {step})" if step is not None else ""
        return f"Saved: {shown_path(last)}{at}; resume with the same command and --ckpt_path=last"

    def _lost(self) -> str | None:
        for local_rank, child in enumerate(self._children, start=1):
            code = child.poll()
            if code:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
                return f"rank {self._rank + local_rank} of {self._world} died ({how})"
        if self._parent is not None and os.getppid() != self._parent[0]:
            return f"rank {self._parent[1]} of {self._world}, which started this process, died"
        return None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not self.finite_loss or not isinstance(loss, torch.Tensor):
            return
        # global_step already counts this step: it is the step's number, counted from 1
        self._pending.append((loss.detach(), trainer.global_step, trainer.current_epoch))
        if logging_step(trainer.global_step, trainer) or len(self._pending) >= self.MAX_PENDING:
            self._check()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check()

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._check()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check()

    def _check(self) -> None:
        """Read every pending loss at once (one wait for the device) and stop at the first that is not finite."""
        if not self._pending:
            return
        values = torch.stack([loss.reshape(()) for loss, _, _ in self._pending]).float().tolist()
        pending, self._pending = self._pending, []
        for value, (_, step, epoch) in zip(values, pending, strict=True):
            if not math.isfinite(value):
                raise ProjectError(
                    f"training loss is {value} at step {step} (epoch {epoch}); stopped, nothing saved from it. "
                    "Lower --model.lr, check the data, or resume from the last good checkpoint with --ckpt_path"
                )

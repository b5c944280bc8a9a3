"""Stop a run that can no longer do useful work, saying why: a non-finite loss or a dead rank (:class:`Guards`),
memory running out (:func:`out_of_memory_message`, the line the CLI prints instead of the traceback)."""

from __future__ import annotations

import math
import os
import re
import select
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
# How long a process on another machine may go unheard once there is cause to suspect it: a collective failed, or
# SIGTERM or Ctrl-C came (its stop must end within SLURM's default KillWait of 30 s, a lost machine or not).
SUSPECT_AFTER, SIGNALLED_AFTER = 5.0, 10.0
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
    """Stops training at the first non-finite loss, and every process of the run (fit, validate, test or predict)
    within seconds of one dying (they would wait on it in a collective). The losses are read on the host together
    where the loggers write (:func:`~project.toolkit.training.logging_step`), at an epoch's end and before any save:
    a step never waits.

    Args:
        finite_loss: Stop at the first non-finite training loss.
        lost_rank: Stop every process when one of the run's processes dies, or, in a run on several machines, goes
            unheard (its machine or the network to it lost).
        poll_seconds: How often the lost-rank watcher looks.
        lost_after: Seconds a process of a run on several machines may go unheard before every process stops; 10 s
            once a SIGTERM or Ctrl-C came (a stop is being agreed), 5 s once a collective failed.
    """

    MAX_PENDING = 1000  # losses held at most between two reads (where the loggers write seldom or never)

    def __init__(
        self, finite_loss: bool = True, lost_rank: bool = True, poll_seconds: float = 1.0, lost_after: float = 60.0
    ) -> None:
        if lost_after <= 0:
            raise ProjectError(f"--guards.lost_after={lost_after}: must be a number of seconds above 0")
        self.finite_loss, self.lost_rank, self.poll_seconds = finite_loss, lost_rank, poll_seconds
        self.lost_after = lost_after
        self._pending: list[tuple[torch.Tensor, int, int]] = []  # (loss, step, epoch) not read yet
        self._children: list[subprocess.Popen] = []
        self._parent: tuple[int, int] | None = None  # (pid, global rank) of the process that started this one
        self._rank, self._world = 0, 1
        self._checkpoint: Callback | None = None
        self._stop = threading.Event()
        self._heartbeats: Any = None  # Heartbeats, in a run on several machines
        self._lock = threading.Lock()  # one look at a time: the watcher's, or the main thread's after a failure
        self._signals: tuple[int, int] | None = None  # a pipe signals are written to, read by the watcher
        self._signalled = False
        self._fitting = True  # validate, test and predict save nothing to resume from

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._fitting = stage == "fit"
        procs = getattr(trainer.strategy.launcher, "procs", None)  # Lightning's subprocess launcher's children
        several_machines = trainer.num_nodes > 1
        if not self.lost_rank or trainer.world_size < 2 or (procs is None and not several_machines):
            return
        self._rank, self._world = trainer.global_rank, trainer.world_size
        self._checkpoint = trainer.checkpoint_callback
        if procs is not None and trainer.local_rank == 0:
            self._children = list(procs)
        elif procs is not None:
            self._parent = (os.getppid(), trainer.global_rank - trainer.local_rank)
        if several_machines:
            from project.toolkit.callbacks.heartbeats import Heartbeats  # loaded by runs on several machines only

            heartbeats = Heartbeats(trainer.global_rank, trainer.world_size, trainer.node_rank, self.lost_after)
            if heartbeats.usable:
                self._heartbeats, self._signalled = heartbeats, False
                heartbeats.start()
                self._note_signals()
            else:
                log.warning("no MASTER_ADDR and MASTER_PORT: a lost machine will not be noticed")
        self._stop.clear()
        threading.Thread(target=self._watch, name="lost-rank-watchdog", daemon=True).start()

    def _note_signals(self) -> None:
        """Have SIGTERM and Ctrl-C also written to a pipe the watcher reads: while the main thread waits in a
        collective on a lost machine, Python's handlers (which agree on a stop, through a collective) never run."""
        reader, writer = os.pipe()
        os.set_blocking(writer, False)
        try:
            previous = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
        except ValueError:  # not the main thread: a signal is then seen after lost_after, like any other loss
            os.close(reader), os.close(writer)
            return
        if previous != -1:  # someone else's (an event loop's): theirs stays
            signal.set_wakeup_fd(previous)
            os.close(reader), os.close(writer)
            return
        self._signals = (reader, writer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._signals is not None:  # before the watcher may close the pipe
            signal.set_wakeup_fd(-1)
            self._signals = None
        self._stop.set()
        with self._lock:  # after the watcher's last look, which would beat again
            heartbeats, self._heartbeats = self._heartbeats, None
            if heartbeats is not None:
                heartbeats.beat(last=True)

    def _watch(self) -> None:
        signals = self._signals
        while not self._stop.is_set():
            if signals is None:
                self._stop.wait(self.poll_seconds)
            elif select.select([signals[0]], [], [], self.poll_seconds)[0]:
                received = os.read(signals[0], 64)
                self._signalled = self._signalled or bool({signal.SIGTERM, signal.SIGINT} & set(received))
            if not self._stop.is_set():
                self.stop_if_lost()
        if signals is not None:
            os.close(signals[0]), os.close(signals[1])

    def stop_if_lost(self, wait_seconds: float = 0.0) -> None:
        """If a watched process is gone (within ``wait_seconds``), say so and exit; also run when a collective fails."""
        if wait_seconds and self._heartbeats is not None:  # time for a peer's silence to show
            wait_seconds = max(wait_seconds, SUSPECT_AFTER + 2 * self.poll_seconds)
        deadline = time.monotonic() + wait_seconds
        while True:
            with self._lock:
                lost = self._lost(suspect=wait_seconds > 0)
            if lost is not None:
                print(f"error: {lost}; stopping rank {self._rank} too. {self._saved()}", file=sys.stderr, flush=True)
                for child in self._children:
                    child.kill()
                os._exit(1)  # other threads may be blocked in a collective that never returns
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1 if self._heartbeats is None else self.poll_seconds)

    def _saved(self) -> str:
        """What the run saved so far and how to go on from it."""
        if not self._fitting:
            return "Nothing to resume: run the same command again"
        checkpoint = self._checkpoint
        if not isinstance(checkpoint, ModelCheckpoint) or not checkpoint.dirpath:
            return "No checkpoint is kept (checkpointing is off): run the same command again to start over"
        last = Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
        if not last.is_file():
            return "Nothing was saved yet: run the same command again to start over"
        step = checkpoint.saved_step if isinstance(checkpoint, Checkpoints) else None
        at = f" (step {step})" if step is not None else ""
        return f"Saved: {shown_path(last)}{at}; resume with the same command and --ckpt_path=last"

    def _lost(self, suspect: bool = False) -> str | None:
        for local_rank, child in enumerate(self._children, start=1):
            code = child.poll()
            if code:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
                return f"rank {self._rank + local_rank} of {self._world} died ({how})"
        if self._parent is not None and os.getppid() != self._parent[0]:
            return f"rank {self._parent[1]} of {self._world}, which started this process, died"
        if self._heartbeats is not None:
            within = SUSPECT_AFTER if suspect else SIGNALLED_AFTER if self._signalled else self.lost_after
            return self._heartbeats.lost(min(within, self.lost_after))
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

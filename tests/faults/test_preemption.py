"""A SIGTERM (a preemption notice) stops a 2-process ddp or fsdp run wherever it lands: inside a training step,
in validation, while a checkpoint is written, at an epoch's start or end. Every process holds at that place
until the signal has been sent to the launcher (rank 0), so the place is chosen, not a matter of timing; the
run must then exit 143 within seconds, every rank at the same step, with a whole ``last.ckpt``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

STOP_WITHIN = 10.0  # seconds from the signal to the launcher's exit

# Where the signal lands: the hook that holds, and on which call (epoch 0's validation, not the sanity check).
PLACES = {
    "mid-step": "on_after_backward",
    "validation": "on_validation_batch_start",
    "checkpoint": "on_save_checkpoint",
    "epoch-start": "on_train_epoch_start",
    "epoch-end": "on_train_epoch_end",
}


class HoldAt(Callback):
    """At ``place`` (a key of :data:`PLACES`), once, every rank writes ``held-rank<N>`` into ``folder`` and waits
    for the file ``sent``; on the exception that stops it, it writes the step it stopped at to ``stopped-rank<N>``."""

    def __init__(self, place: str, folder: str) -> None:
        self.hook, self.folder, self.held = PLACES[place], Path(folder), False
        first_epoch = 1 if place == "epoch-start" else 0  # epoch 0 starts before anything could be sent
        self.when = {"mid-step": lambda t: t.global_step == 3}.get(place, lambda t: t.current_epoch == first_epoch)

    def _hold(self, trainer: Trainer, hook: str) -> None:
        if hook != self.hook or self.held or trainer.sanity_checking or not self.when(trainer):
            return
        self.held = True
        (self.folder / f"held-rank{trainer.global_rank}").touch()
        deadline = time.monotonic() + 60
        while not (self.folder / "sent").exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._hold(trainer, "on_after_backward")

    def on_validation_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self._hold(trainer, "on_validation_batch_start")

    def on_save_checkpoint(self, trainer: Trainer, *args: Any) -> None:
        self._hold(trainer, "on_save_checkpoint")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._hold(trainer, "on_train_epoch_start")

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._hold(trainer, "on_train_epoch_end")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        (self.folder / f"stopped-rank{trainer.global_rank}").write_text(str(trainer.global_step))


def preempted_run(tmp_path: Path, strategy: str, place: str) -> tuple[int, float, str]:
    """A 2-process fit held at ``place``, SIGTERM sent to its launcher; its exit status, the seconds from the
    signal to the exit, and its stderr."""
    marks = tmp_path / "marks"
    marks.mkdir()
    command = [
        sys.executable, "-m", "project", "fit", "--data=tests.support.fixtures.ColourImages", "--data.image_size=16",
        "--data.batch_size=20", "--data.val_size=40", "--data.num_workers=0",
        "--model.arch=tests.support.user_nets.sequential_convnet", f"--trainer.strategy={strategy}",
        "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.max_epochs=3",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.callbacks+={__name__}.HoldAt", f"--trainer.callbacks.place={place}",
        f"--trainer.callbacks.folder={marks}",
    ]  # fmt: skip
    with subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as launcher:
        try:
            deadline = time.monotonic() + 240
            while not (marks / "held-rank0").exists():
                assert launcher.poll() is None and time.monotonic() < deadline, "never reached " + place
                time.sleep(0.05)
            os.kill(launcher.pid, signal.SIGTERM)  # to rank 0 only, as a scheduler signals the job's main process
            sent = time.monotonic()
            (marks / "sent").touch()
            try:
                _, err = launcher.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                _, err = launcher.communicate()
                pytest.fail(f"{strategy} held at {place}: still running 60 s after SIGTERM (hung)\n{err[-3000:]}")
            return launcher.returncode, time.monotonic() - sent, err
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sigterm_stops_every_rank_at_one_step_with_a_whole_last_checkpoint(
    tmp_path: Path, strategy: str, place: str
) -> None:
    status, seconds, err = preempted_run(tmp_path, strategy, place)
    assert status == 128 + signal.SIGTERM, err[-3000:]
    assert seconds < STOP_WITHIN, f"{seconds:.1f} s from the signal to the exit"
    stopped = {path.name: int(path.read_text()) for path in (tmp_path / "marks").glob("stopped-rank*")}
    assert set(stopped) == {"stopped-rank0", "stopped-rank1"} and len(set(stopped.values())) == 1, stopped
    checkpoint = next((tmp_path / "lightning_logs").glob("version_*/checkpoints/last.ckpt"))
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert saved["global_step"] == stopped["stopped-rank0"], (saved["global_step"], stopped)
    assert "Traceback" not in err and f"Stopped by SIGTERM at epoch {saved['epoch']}" in err

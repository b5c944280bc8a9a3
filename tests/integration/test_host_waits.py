"""A steady training step never waits for the device: with every default callback on, the progress bar included, no
host read of a tensor's value, no copy to the host and no wait of the timing clock between the steps where the
loggers write. On a GPU each of those would stall the host until the queued kernels ran (docs/performance.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils._python_dispatch import TorchDispatchMode

from project.__main__ import main
from project.toolkit.callbacks.group import find_callback
from project.toolkit.callbacks.guards import Guards
from project.toolkit.timing.callback import TimingCallback
from project.toolkit.timing.clocks import HostClock
from tests.integration.test_performance import HostReads

FIRST, LAST = 10, 40  # the steps watched, counted from 1; the loggers write at step 50

READ_OP = torch.ops.aten._local_scalar_dense.default  # what .item(), float() and bool() of a tensor run


class OpsSeen(TorchDispatchMode):
    """Notes every aten op that reads a value on the host (``.item()``, ``float()``, ``bool()`` of a tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is READ_OP:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class WatchSteps(Callback):
    """Watches steps ``FIRST`` to ``LAST`` whole: from the start of the first to the start of the one after the last
    (each step's batch transfer runs before its start hook, so the window holds the watched steps' own)."""

    watching = False  # class-wide: the counting clock of the test below reads it

    def __init__(self) -> None:
        self.functions, self.ops = HostReads(), OpsSeen()
        self.watched: list[int] = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step + 1  # the step about to run
        if step == FIRST:
            self.functions.__enter__()
            self.ops.__enter__()
            WatchSteps.watching = True
        if step == LAST + 1:
            WatchSteps.watching = False
            self.ops.__exit__(None, None, None)
            self.functions.__exit__(None, None, None)
        if FIRST <= step <= LAST:
            self.watched.append(step)


def test_steady_steps_read_nothing_on_the_host_and_wait_for_nothing(tiny_args: list[str], tmp_path: Path) -> None:
    waits: list[bool] = []  # whether the steps were watched, at each wait of the timing clock
    shown = ["--trainer.enable_progress_bar=true", "--trainer.enable_model_summary=true"]  # tiny_args hide them
    steps = ["--data.on_device=true", "--data.batch_size=4", "--data.val_size=20", "--model.lr=0.01"]
    steps += ["--trainer.max_epochs=1"]
    steps += ["--trainer.log_every_n_steps=50"]
    watch = [f"--trainer.callbacks+={__name__}.WatchSteps", f"--trainer.limit_train_batches={LAST + 5}"]
    original = TimingCallback.setup

    def counting_clock(self: TimingCallback, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.make_clock = lambda device, sync: HostClock(lambda: waits.append(WatchSteps.watching))
        original(self, trainer, pl_module, stage)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TimingCallback, "setup", counting_clock)  # the clock of a device that runs asynchronously
        cli = main(["fit", *tiny_args, *shown, *steps, *watch])
    watcher = next(c for c in cli.trainer.callbacks if isinstance(c, WatchSteps))
    assert watcher.watched == list(range(FIRST, LAST + 1))
    assert find_callback(cli.trainer, Guards) is not None  # every default callback ran
    assert watcher.functions.calls == [] and watcher.ops.seen == []
    assert waits and not any(waits)  # the clock waited, outside the watched steps only

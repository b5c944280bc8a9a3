"""SkipIdleHooks: Lightning no longer dispatches the per-batch hooks a callback leaves as Callback's no-op,
still calls every hook with work, and the callbacks get their hooks back when the run ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.profilers import Profiler

from project.toolkit.callbacks.idle_hooks import PER_BATCH_HOOKS, SkipIdleHooks, idle_hooks
from tests.conftest import quiet_trainer


class Recording(Profiler):
    """Every action Lightning profiles: one per hook it dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: list[str] = []

    def start(self, action_name: str) -> None:
        self.actions.append(action_name)

    def stop(self, action_name: str) -> None:
        pass

    def summary(self) -> str:
        return ""


class Idle(Callback):
    """Overrides no per-batch hook."""


class Busy(Callback):
    """Counts the training and test batches it sees."""

    def __init__(self) -> None:
        self.batches = {"train": 0, "test": 0}

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches["train"] += 1

    def on_test_batch_end(self, *args: Any) -> None:
        self.batches["test"] += 1


def run(callbacks: list[Callback], tmp_path: Path, model: BoringModel | None = None) -> Recording:
    profiler = Recording()
    limits = dict(limit_train_batches=3, limit_val_batches=1, limit_test_batches=2)
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=callbacks, profiler=profiler, **limits)
    model = model or BoringModel()
    trainer.fit(model)
    trainer.test(model, verbose=False)
    return profiler


def dispatched(profiler: Recording, callback: Callback, hook: str) -> int:
    return profiler.actions.count(f"[Callback]{callback.state_key}.{hook}")


def test_idle_hooks_are_not_dispatched_and_busy_ones_are(tmp_path: Path) -> None:
    idle, busy = Idle(), Busy()
    profiler = run([SkipIdleHooks(), idle, busy], tmp_path)
    assert busy.batches == {"train": 3, "test": 2}
    assert dispatched(profiler, busy, "on_train_batch_end") == 3
    assert dispatched(profiler, busy, "on_test_batch_end") == 2
    for hook in PER_BATCH_HOOKS:
        assert dispatched(profiler, idle, hook) == 0, hook
    assert dispatched(profiler, busy, "on_train_batch_start") == 0
    # the epoch hooks, not per batch, are dispatched as before
    assert dispatched(profiler, idle, "on_train_epoch_start") == 1


def test_without_it_lightning_dispatches_every_hook(tmp_path: Path) -> None:
    idle = Idle()
    profiler = run([idle], tmp_path)
    assert dispatched(profiler, idle, "on_train_batch_start") == 3
    assert dispatched(profiler, idle, "on_test_batch_end") == 2


def test_the_callbacks_get_their_hooks_back_after_the_run(tmp_path: Path) -> None:
    idle = Idle()
    run([SkipIdleHooks(), idle], tmp_path)
    assert not any(hook in vars(idle) for hook in PER_BATCH_HOOKS)
    assert all(callable(getattr(idle, hook)) for hook in PER_BATCH_HOOKS)


def test_a_hook_set_on_the_callback_itself_is_kept(tmp_path: Path) -> None:
    seen: list[int] = []
    own = Idle()
    own.on_train_batch_end = lambda trainer, module, outputs, batch, batch_idx: seen.append(batch_idx)
    assert "on_train_batch_end" not in idle_hooks(own)
    run([SkipIdleHooks(), own], tmp_path)
    assert seen == [0, 1, 2]


class SetsItsHookLater(Callback):
    """Gives itself a batch hook when the fit starts, after SkipIdleHooks has looked."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.on_train_batch_end = lambda trainer, module, outputs, batch, batch_idx: self.seen.append(batch_idx)


def test_a_hook_a_callback_sets_itself_during_the_run_runs_and_is_kept(tmp_path: Path) -> None:
    later = SetsItsHookLater()
    run([SkipIdleHooks(), later], tmp_path)
    assert later.seen == [0, 1, 2]
    assert callable(vars(later)["on_train_batch_end"])  # the end of the run left it alone


class Failing(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == 1:
            raise ValueError("stop here")
        return super().training_step(batch, batch_idx)


def test_the_hooks_come_back_after_an_exception(tmp_path: Path) -> None:
    idle = Idle()
    with pytest.raises(ValueError, match="stop here"):
        run([SkipIdleHooks(), idle], tmp_path, model=Failing())
    assert not any(hook in vars(idle) for hook in PER_BATCH_HOOKS)

"""The step anatomy (project/toolkit/timing/anatomy.py): the bookkeeping that splits a step into its parts,
the window's place, and that nothing more is marked or waited for outside it. (A 2-process ddp run whose ranks'
parts add up to their measured step: tests/integration/test_anatomy_ddp.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, TensorDataset

from project.toolkit.timing.anatomy import AnatomyWindow, StepTimes, covered, split_step
from project.toolkit.timing.callback import TimingCallback
from project.toolkit.timing.clocks import HostClock
from tests.conftest import quiet_trainer
from tests.support.fake_device import FakeAsyncDevice

# --------------------------------------------------------------------------- bookkeeping


def test_a_steps_parts_add_up_with_communication_and_bubble_taken_out_where_they_fall() -> None:
    # a pipeline step: data 0-1, the schedule 1.5-6.5 computing 2-3 and 4-5, a broadcast 6.6-7, the optimizer 7-9
    step = StepTimes(previous_end=0.0, start=1.0, end=10.0, optimizer_start=7.0, optimizer_end=9.0)
    parts = split_step(step, communication=[(6.6, 7.0)], schedule=[(1.5, 6.5)], stage_compute=[(2.0, 3.0), (4.0, 5.0)])
    assert parts["bubble"] == pytest.approx(3.0)  # the schedule's 5 s less its 2 s of compute
    assert parts["communication"] == pytest.approx(0.4)
    assert parts["compute"] == pytest.approx(6.0 - 0.4 - 3.0)  # start to the optimizer, less both
    assert (parts["data_wait"], parts["optimizer"], parts["rest"]) == (1.0, 2.0, 1.0)
    assert parts["forward"] is None and parts["backward"] is None  # the schedule runs both
    total = sum(parts[k] for k in ("data_wait", "compute", "communication", "optimizer", "bubble", "rest"))
    assert total == pytest.approx(step.end - step.previous_end)


def test_communication_is_counted_once_and_in_the_part_it_falls_in() -> None:
    # ddp: a buffer broadcast in the forward (1.5-2) and the end-of-backward wait (5-6), overlapping a
    # second record of the same wait (5.5-6): counted once, and out of forward and backward respectively
    step = StepTimes(0.0, 1.0, 8.0, backward_start=3.0, backward_end=6.0, optimizer_start=6.0, optimizer_end=7.0)
    parts = split_step(step, communication=[(1.5, 2.0), (5.0, 6.0), (5.5, 6.0)])
    assert parts["communication"] == pytest.approx(1.5)
    assert (parts["forward"], parts["backward"]) == (pytest.approx(1.5), pytest.approx(2.0))
    assert parts["compute"] == pytest.approx(3.5) and parts["bubble"] is None
    assert covered([(0, 1), (3, 4)], 0.5, 3.5) == pytest.approx(1.0)


def test_a_step_without_optimizer_or_backward_marks_ends_its_compute_at_the_next_mark_it_has() -> None:
    accumulating = split_step(StepTimes(0.0, 1.0, 5.0, backward_start=2.0, backward_end=4.0))
    assert (accumulating["compute"], accumulating["optimizer"], accumulating["rest"]) == (3.0, 0.0, 1.0)
    bare = split_step(StepTimes(0.0, 1.0, 5.0))
    assert (bare["compute"], bare["optimizer"], bare["rest"]) == (4.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("steps", "warmup", "epoch_batches", "expected"),
    [
        (5, 3, [20], (0, 3, 7)),  # after the warm-up, in the first epoch
        (5, 0, [20], (0, 1, 5)),  # never an epoch's first batch (its wait starts the loader)
        (5, 3, [4, 4], (1, 1, 3)),  # short epochs: the next epoch, every batch but its first
        (2, 6, [4, 4, 4], (1, 2, 3)),  # the warm-up reaches into the second epoch
        (0, 3, [20], (None, None, None)),  # off
    ],
)
def test_the_window_is_placed_after_the_warm_up_inside_one_epoch(
    steps: int, warmup: int, epoch_batches: list[int], expected: tuple
) -> None:
    window = AnatomyWindow(HostClock(), steps, warmup)
    for epoch, batches in enumerate(epoch_batches):
        window.place(epoch, batches)
        if window.first_batch is not None:
            break
        window.batches_done += batches
    assert (window.epoch, window.first_batch, window.last_batch) == expected


# --------------------------------------------------------------------------- through the callback


class Linear(LightningModule):
    """A linear model trained with automatic optimization: Lightning passes every hook the window marks."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_linear(tmp_path: Path, batches: int, anatomy_steps: int) -> tuple[FakeAsyncDevice, dict]:
    device = FakeAsyncDevice()
    callback = TimingCallback(warmup_iterations=1, anatomy_steps=anatomy_steps)
    callback.make_clock = lambda torch_device, sync_every_step: device
    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_train_batches=batches, callbacks=[callback])
    data = TensorDataset(torch.randn(8 * batches, 4))
    trainer.fit(Linear(), DataLoader(data, batch_size=8))
    return device, callback.report


def test_the_window_alone_marks_more_and_waits_twice_whatever_the_number_of_batches(tmp_path: Path) -> None:
    counts = {}
    for batches in (4, 8):
        off, _ = fit_linear(tmp_path / f"off{batches}", batches, anatomy_steps=0)
        on, report = fit_linear(tmp_path / f"on{batches}", batches, anatomy_steps=2)
        counts[batches] = (on.waits - off.waits, on.marks - off.marks)
        anatomy = report["step_anatomy"]
        assert (anatomy["steps"], anatomy["epoch"], anatomy["first_batch"]) == (2, 0, 1)
        # Each of the window's marks is one fake-device mark apart, 10 ms (the timing callback's own start
        # and end marks in between): data 2, forward 1, backward 2 (up to the optimizer's start),
        # optimizer 1, rest 2 marks.
        [rank] = anatomy["ranks"]
        expected = {"data_wait": 0.02, "forward": 0.01, "backward": 0.02, "compute": 0.03, "optimizer": 0.01}
        assert {k: rank[k] for k in expected} == pytest.approx(expected)
        assert rank["rest"] == pytest.approx(0.02) and rank["communication"] == 0.0 and rank["bubble"] is None
        assert rank["parts_sum_seconds"] == pytest.approx(0.08)
    # the window's opening and closing waits, and its marks (one to start, 6 per step), whatever the epochs' length
    assert counts[4] == counts[8] == (2, 1 + 2 * 6)

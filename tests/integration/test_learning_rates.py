"""The learning rate of every param group, from Lightning's LearningRateMonitor, which the trainer commands add where
a run has a logger: ``train/lr`` for one group, ``train/lr/<group>`` for several, each on the axis of the loss, at the
step that trained with it; a run without a logger runs without the monitor."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor

from project.__main__ import main
from project.toolkit.callbacks.group import find_callback
from tests.integration.test_views import read_run

CSV = Path(__file__).resolve().parents[2] / "configs" / "logger" / "csv.yaml"
STEPS = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1"]


class TwoGroupSGD(torch.optim.SGD):
    """SGD with the network's last two tensors (its classifier's weight and bias) in a group of their own, named
    ``head``, at ten times the learning rate of the rest (``body``)."""

    def __init__(self, params: Any, lr: float = 0.01) -> None:
        params = list(params)
        groups = [{"params": params[:-2], "name": "body"}, {"params": params[-2:], "lr": 10 * lr, "name": "head"}]
        super().__init__(groups, lr=lr)


def logged(run: Path) -> tuple[list[str], dict[str, dict[int, float]]]:
    """The columns of ``run``'s metrics.csv, and each column's values by step."""
    with open(run / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    columns = list(reader.fieldnames or [])
    values = {key: {int(row["step"]): float(row[key]) for row in rows if row.get(key)} for key in columns}
    return columns, values


def test_one_param_group_logs_train_lr_at_the_step_that_used_it(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", f"--config={CSV}", *tiny_args, *STEPS])  # log_every_n_steps=1; a warm-up of 3 steps (1 epoch)
    run = tmp_path / "lightning_logs" / "version_0"
    columns, values = logged(run)
    assert [column for column in columns if "lr" in column] == ["train/lr"]  # not Lightning's lr-SGD
    lr = values["train/lr"]
    assert set(lr) == set(values["train/loss_step"]) == {0, 1, 2}  # one x axis with the loss
    assert lr[0] == pytest.approx(lr[2] / 3) and lr[1] == pytest.approx(2 * lr[2] / 3)  # warm-up steps 1, 2, 3 of 3
    assert "train/lr" in read_run(run).Tags()["scalars"]  # TensorBoard, beside the CSV


def test_several_param_groups_log_one_learning_rate_each(tiny_args: list[str], tmp_path: Path) -> None:
    optimizer = [f"--model.optimizer={__name__}.TwoGroupSGD", "--model.optimizer.lr=0.01"]
    main(["fit", f"--config={CSV}", *tiny_args, *STEPS, *optimizer])
    columns, values = logged(tmp_path / "lightning_logs" / "version_0")
    assert sorted(column for column in columns if "lr" in column) == ["train/lr/body", "train/lr/head"]
    body, head = values["train/lr/body"], values["train/lr/head"]
    assert set(body) == set(head) == {0, 1, 2}
    assert all(head[step] == pytest.approx(10 * body[step]) for step in body) and body[2] == pytest.approx(0.01)


def test_a_run_without_a_logger_runs_without_the_monitor(tiny_args: list[str], tmp_path: Path) -> None:
    cli = main(["fit", *tiny_args, *STEPS, "--trainer.logger=false"])  # the monitor refuses a run with no logger
    assert cli.trainer.global_step == 3 and find_callback(cli.trainer, LearningRateMonitor) is None
    cli = main(["fit", *tiny_args, *STEPS])
    assert isinstance(find_callback(cli.trainer, LearningRateMonitor), LearningRateMonitor)

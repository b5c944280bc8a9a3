"""Accuracy beside the timings: the best and last ``val/acc`` of a fit, the test's, and the time from the fit's start
to each target accuracy (``--timing.target_acc``), in ``timing.json`` and the printed table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from project.__main__ import main
from project.toolkit.callbacks.group import each_callback
from project.toolkit.timing.callback import TimingCallback

VAL_ACC = (0.2, 0.6, 0.4)  # what the model below "reaches" after each epoch
VAL_S = 0.1


class KnownAccuracy(LightningModule):
    """Logs ``val/acc`` from :data:`VAL_ACC` (a validation taking ``VAL_S``) and a test accuracy of 0.55."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        time.sleep(0.01)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        time.sleep(VAL_S)

    def on_validation_epoch_end(self) -> None:
        self.log("val/acc", VAL_ACC[self.current_epoch])

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        pass

    def on_test_epoch_end(self) -> None:
        self.log("test/acc", 0.55)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)


def test_the_fit_reports_its_best_and_last_accuracy_and_the_time_to_each_target(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    callback = TimingCallback(warmup_iterations=0, anatomy_steps=0, target_acc=[0.7, 0.5])
    trainer = Trainer(
        accelerator="cpu", max_epochs=len(VAL_ACC), limit_val_batches=1, num_sanity_val_steps=0,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        logger=TensorBoardLogger(tmp_path, name="", version=0), callbacks=[callback], default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(KnownAccuracy(), loader(), loader())
    report = json.loads((tmp_path / "version_0" / "timing.json").read_text())
    assert (report["best_val_acc"], report["best_val_acc_epoch"], report["last_val_acc"]) == (0.6, 1, 0.4)
    assert report["target_acc"] == [0.5, 0.7] and report["seconds_to_target_acc"]["0.7"] is None
    # the end of epoch 1's validation: after the first two epochs with their validations, before the fit's end
    reached, (first, second, _) = report["seconds_to_target_acc"]["0.5"], report["epochs"]
    assert first["seconds"] + second["seconds"] + 2 * VAL_S <= reached < report["fit_seconds"] - first["seconds"] / 2
    table = capsys.readouterr().out
    assert "val accuracy         best 0.600 (epoch 1), last 0.400" in table
    assert f"time to accuracy     0.5: {reached:.2f} s, 0.7: not reached" in table

    trainer.test(KnownAccuracy(), loader())
    assert json.loads((tmp_path / "version_0" / "timing.json").read_text())["test_acc"] == 0.55
    assert "  accuracy           0.550" in capsys.readouterr().out


def test_targets_come_from_the_command_line_and_the_test_adds_its_accuracy(
    tiny_args: list[str], tmp_path: Path
) -> None:
    same_run = [
        "--trainer.logger.class_path=lightning.pytorch.loggers.TensorBoardLogger",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.logger.init_args.version=0",
    ]
    fit = ["fit", *tiny_args, *same_run, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]
    main([*fit, "--timing.target_acc=[0.01]", "--timing.target_acc+=1.0"])
    main(["test", *tiny_args, *same_run, "--ckpt_path=last"])
    report = json.loads((tmp_path / "lightning_logs" / "version_0" / "timing.json").read_text())
    assert report["target_acc"] == [0.01, 1.0] and 0 <= report["last_val_acc"] == report["best_val_acc"] <= 1
    assert 0 < report["seconds_to_target_acc"]["0.01"] < report["fit_seconds"]
    assert 0 <= report["test_acc"] <= 1


@pytest.mark.parametrize("targets", ["[0.5,1.5]", "[0]"])
def test_a_target_outside_0_to_1_is_one_line(tiny_args: list[str], capsys, targets: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args, f"--timing.target_acc={targets}"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: timing.target_acc=")


def test_the_stripes_set_is_learned_on_a_cpu_in_a_few_epochs(tmp_path: Path) -> None:
    # what the cpu-learn bench preset compares the strategies on: chance is 0.1; 8 epochs reach about 0.8
    args = ["fit", "--data=project.data.stripes.StripesDataModule", "--model.arch=project.data.stripes.small_convnet"]
    args += ["--data.batch_size=64", "--data.num_workers=0", "--model.lr=0.05", "--trainer.accelerator=cpu"]
    args += ["--trainer.max_epochs=3", "--trainer.enable_progress_bar=false", "--trainer.logger=false"]
    cli = main([*args, f"--trainer.default_root_dir={tmp_path}", "--timing.target_acc=[0.3]"])
    report = next(c for c in each_callback(cli.trainer) if isinstance(c, TimingCallback)).report
    assert report["best_val_acc"] > 0.3 and report["seconds_to_target_acc"]["0.3"] is not None

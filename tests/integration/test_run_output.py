"""What a run shows and where it writes: the run folder without a logger, evaluations written into
their fit's folder, the progress bar's values, the end-of-run summary, the warnings left out, the
CPU time estimate and training without validation (``--data.val_size=0``)."""

from __future__ import annotations

import json
import logging
import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer

from project.__main__ import main
from project.toolkit.callbacks import progress
from project.toolkit.log import LITLOGGER_TIP, silence_known_noise
from project.toolkit.timing.report import estimate_line
from tests.support.runs import Records

SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]
# Lightning's messages that are noise for this template (project/toolkit/log.py and friends)
NOISE = ("LeafSpec", "dirpath has changed", "`weights_only` was not set", "requires_grad=True to a scalar")


@pytest.fixture
def lightning_messages():
    """Messages logged by Lightning and warnings issued, during the test: (log messages, warnings)."""
    handler = Records()
    logger = logging.getLogger("lightning.pytorch")
    logger.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # pyproject's filters hide some of the noise this file checks
        yield handler.messages, caught
    logger.removeHandler(handler)


def noise_in(messages: list[str], caught: list[warnings.WarningMessage]) -> list[str]:
    texts = messages + [str(w.message) for w in caught]
    return [t for t in texts if any(n in t for n in NOISE) or t.startswith(LITLOGGER_TIP)]


def test_without_a_logger_each_run_gets_its_own_folder_under_the_root(
    tiny_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "source_tree"
    work.mkdir()
    monkeypatch.chdir(work)
    for _ in range(2):
        main(["fit", *tiny_args, *SHORT, "--trainer.logger=false"])
    runs = tmp_path / "lightning_logs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lightning_logs", "source_tree"]
    assert not list(work.iterdir())  # nothing in the working directory
    for version in ("version_0", "version_1"):
        assert (runs / version / "config.yaml").is_file()
        names = sorted(p.name for p in (runs / version / "checkpoints").iterdir())
        assert names[-1] == "last.ckpt" and len(names) == 2  # the best and last: no last-v1.ckpt
    # an evaluation of the newest run writes into its folder, under a config name of its own
    main(["test", *tiny_args, "--trainer.logger=false", "--ckpt_path=last"])
    assert sorted(p.name for p in runs.iterdir()) == ["version_0", "version_1"]
    assert (runs / "version_1" / "config-test.yaml").is_file()


def test_test_and_predict_of_a_fit_write_into_its_folder_and_the_summary_says_where(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, lightning_messages
) -> None:
    main(["fit", *tiny_args, *SHORT])
    run = tmp_path / "lightning_logs" / "version_0"
    out = capsys.readouterr().out
    best = next((run / "checkpoints").glob("epoch*.ckpt"))
    assert f"fit done; run folder: {run}" in out
    assert re.search(rf"best checkpoint: +{re.escape(str(best))} \(val/acc 0\.\d{{4}}\)", out)
    assert re.search(rf"last checkpoint: +{re.escape(str(run / 'checkpoints' / 'last.ckpt'))} \(val/acc", out)
    assert f"timing.json:      {run / 'timing.json'}" in out
    assert re.search(r"final metrics \(epoch means\): +train/loss \S+  train/acc \S+  val/loss \S+  val/acc \S+", out)
    assert f"tensorboard --logdir {run.parent}" in out

    main(["test", *tiny_args, "--ckpt_path=best"])
    out = capsys.readouterr().out
    assert f"test done; run folder: {run}" in out and f"checkpoint used:  {best}" in out
    assert re.search(r"final metrics \(epoch means\): +test/loss \S+  test/acc \S+", out)
    main(["predict", *tiny_args, "--ckpt_path=last"])
    assert f"predictions.csv:  {run / 'predictions.csv'}" in capsys.readouterr().out

    assert [p.name for p in run.parent.iterdir()] == ["version_0"]  # no version_1, version_2
    assert {"config.yaml", "config-test.yaml", "config-predict.yaml", "predictions.csv"} <= {
        p.name for p in run.iterdir()
    }
    timing = json.loads((run / "timing.json").read_text())
    assert {"train_samples_per_second", "test_samples_per_second", "predict_samples_per_second"} <= timing.keys()
    assert len(list(run.glob("events.out.tfevents.*"))) == 3  # TensorBoard shows one run, test included
    assert noise_in(*lightning_messages) == []
    # with another setup (here the batch size), the timing is not the fit's: a folder of its own
    main(["test", *tiny_args, "--data.batch_size=30", "--ckpt_path=last"])
    assert (run.parent / "version_1" / "config.yaml").is_file()


def test_no_validation_with_val_size_0_and_best_falls_back_to_last(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    estimate = ["--timing.cpu_estimate_min_minutes=0", "--timing.cpu_estimate_iterations=1"]  # say it for any fit
    cli = main(["fit", *tiny_args, *SHORT, "--data.val_size=0", *estimate])
    assert len(cli.datamodule._datasets["train"]) == 200  # every image
    assert not any(key.startswith("val/") for key in cli.trainer.callback_metrics)
    checkpoints = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    assert [p.name for p in checkpoints.iterdir()] == ["last.ckpt"]
    captured = capsys.readouterr()
    assert "data.val_size=0: training on every image, no validation" in captured.err
    estimates = [line for line in captured.err.splitlines() if line.startswith("This fit will take about")]
    assert len(estimates) == 1 and "--data.image_size" not in estimates[0] and "a GPU" in estimates[0]
    assert "also --ckpt_path=best (no validation ranked the checkpoints)" in captured.out

    tested = main(["test", *tiny_args, "--data.val_size=0", "--ckpt_path=best"])
    assert tested.trainer.ckpt_path == str(checkpoints / "last.ckpt")
    notes = [line for line in capsys.readouterr().err.splitlines() if "--ckpt_path=best" in line]
    assert notes == [f"--ckpt_path=best: the run of {checkpoints / 'last.ckpt'} ranked no checkpoint "
                     "(no validation); using its last.ckpt"]  # fmt: skip


def test_fast_dev_run_writes_nothing_and_says_so_and_its_bar_shows_the_loss(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, lightning_messages
) -> None:
    cli = main(["fit", *tiny_args, "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=true"])
    assert not list(tmp_path.rglob("*.ckpt"))
    assert "fit done (fast_dev_run: a smoke run, nothing written)" in capsys.readouterr().out
    assert noise_in(*lightning_messages) == []
    bar = cli.trainer.progress_bar_callback
    rich = progress.rich_installed()  # the `progress` extra (in `dev` too) installs rich
    assert type(bar) is (progress.RichTrainingBar if rich else progress.TQDMTrainingBar)
    shown = bar.get_metrics(cli.trainer, cli.model)
    assert "v_num" not in shown and re.fullmatch(r"\d+\.\d{3}", shown["loss"]) and float(shown["lr"]) > 0


class _LightningBar:
    """The two methods of a Lightning progress bar that the template's bar builds on."""

    total_train_batches = 2

    def on_train_batch_end(self, *args: object) -> None:
        pass

    def get_metrics(self, trainer: object, pl_module: object) -> dict[str, object]:
        return {"v_num": 3, "val/acc": 0.5}


def test_the_bar_shows_the_latest_loss_and_lr_and_drops_v_num() -> None:
    class Bar(progress.LossOnBar, _LightningBar):
        pass

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.05)
    trainer = SimpleNamespace(state=SimpleNamespace(fn="fit"), optimizers=[optimizer], log_every_n_steps=50)
    trainer.fast_dev_run, bar = False, Bar()
    assert bar.get_metrics(trainer, None) == {"lr": "0.05", "val/acc": 0.5}  # no step yet: no loss
    for step, loss in enumerate([2.0, 1.23456]):
        trainer.global_step = step + 1
        bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, None, step)
    assert bar.get_metrics(trainer, None) == {"loss": "1.235", "lr": "0.05", "val/acc": 0.5}  # the epoch's last


def test_lightnings_advertisement_is_dropped_and_its_information_kept() -> None:
    silence_known_noise()
    handler = Records()
    logging.getLogger("lightning.pytorch").addHandler(handler)
    try:
        Trainer(accelerator="cpu", logger=True, enable_progress_bar=False, enable_model_summary=False)
    finally:
        logging.getLogger("lightning.pytorch").removeHandler(handler)
    assert any(m.startswith("GPU available") for m in handler.messages)
    assert not any(m.startswith(LITLOGGER_TIP) for m in handler.messages)


def _planned(image_size: int, total_steps: float = 1760) -> SimpleNamespace:
    """What estimate_line reads of a Trainer: the default job's 176 steps x 10 epochs, 20 val batches."""
    datamodule = SimpleNamespace(hparams={"image_size": image_size})
    return SimpleNamespace(
        estimated_stepping_batches=total_steps,
        num_training_batches=176,
        accumulate_grad_batches=1,
        num_val_batches=[20],
        enable_validation=True,
        datamodule=datamodule,
    )


def test_the_cpu_estimate_names_the_time_and_the_faster_choices() -> None:
    line = estimate_line(_planned(112), seconds_per_step=3.0, min_minutes=10)
    # 1760 steps + 10 x 20 validation batches at a third of a step each: 5480 s
    assert line is not None and line.startswith("This fit will take about 1 h 31 min on this CPU (3.00 s per step")
    assert "--data.image_size=32 (12x fewer pixels per image) or a GPU (--trainer.accelerator=gpu)" in line
    assert estimate_line(_planned(112), seconds_per_step=0.1, min_minutes=10) is None  # 3 minutes: not worth a line
    assert estimate_line(_planned(112, total_steps=float("inf")), seconds_per_step=3.0, min_minutes=10) is None

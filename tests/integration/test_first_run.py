"""What a new user hit on a first run, each fixed: no training loss on the progress bar in a first epoch shorter
than the logging interval, a mistyped strategy, an abbreviated option taken silently, an empty run folder left by
a failed start, and Lightning's "dirpath has changed" on a resume. (Ctrl-C reported as SIGTERM:
tests/faults/test_faults.py.)"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from project.__main__ import main

SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=3"]


def test_the_bar_shows_the_loss_in_a_first_epoch_shorter_than_the_logging_interval(tiny_args: list[str]) -> None:
    shown = ["--trainer.enable_progress_bar=true", "--trainer.log_every_n_steps=50"]  # 3 steps < 50
    cli = main(["fit", *tiny_args, *shown, *SHORT])
    values = cli.trainer.progress_bar_callback.get_metrics(cli.trainer, cli.model)
    training = {key: value for key, value in values.items() if "loss" in key and not key.startswith("val")}
    assert list(training) == ["loss"] and re.fullmatch(r"\d+\.\d{3}", training["loss"])


def one_error_line(args: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err and "Traceback" not in err, err
    return err


def test_a_mistyped_strategy_gets_the_nearest_name_and_the_templates_own(
    tiny_args: list[str], capsys: pytest.CaptureFixture
) -> None:
    err = one_error_line(["fit", *tiny_args, "--trainer.strategy=dpp"], capsys)
    assert "trainer.strategy='dpp' is not a strategy; did you mean dp or ddp?" in err
    assert "dp_balanced, ddp, ddp_static, fsdp, pipeline" in err and "find_unused" not in err and len(err) < 400


def test_an_abbreviated_option_is_refused_with_the_full_name(
    tiny_args: list[str], capsys: pytest.CaptureFixture
) -> None:
    err = one_error_line(["fit", *tiny_args, "--trainer.max_epoch=1"], capsys)
    assert "--trainer.max_epoch=1" in err and "did you mean --trainer.max_epochs?" in err


def test_a_run_that_fails_before_its_first_step_leaves_no_run_folder(tiny_args: list[str], tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="7"):  # the Linear's 7 inputs, which the images do not have
        main(["fit", *tiny_args, *SHORT, "--model.arch=tests.support.user_nets.mismatched_net"])
    assert list((tmp_path / "lightning_logs").glob("version_*")) == []


def test_resuming_in_a_new_run_folder_says_nothing_of_a_changed_folder(tiny_args: list[str]) -> None:
    first = main(["fit", *tiny_args, *SHORT])
    best = first.trainer.checkpoint_callback.best_model_path
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = main(
            ["fit", *tiny_args, "--trainer.max_epochs=2", "--trainer.limit_train_batches=3", "--ckpt_path=last"]
        )
    assert [str(w.message) for w in caught if "dirpath has changed" in str(w.message)] == []
    assert Path(resumed.trainer.log_dir).name == "version_1" and resumed.trainer.global_step == 6
    assert resumed.trainer.checkpoint_callback.best_model_path in (
        best,
        resumed.trainer.checkpoint_callback.best_model_path,
    )

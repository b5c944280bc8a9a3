"""``python -m project`` end to end: fit, test from the checkpoints, resume, configs, errors."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Callback, LightningModule, Trainer

from project.__main__ import main
from project.data import CIFAR10DataModule
from project.model import ImageClassifier
from project.toolkit.callbacks.group import each_callback
from project.toolkit.callbacks.progress import RichTrainingBar, rich_installed
from tests.support.fixtures import ColourImages

REPO = Path(__file__).resolve().parents[2]


def run_dir(root: Path, version: int = 0) -> Path:
    return root / "lightning_logs" / f"version_{version}"


def test_fit_then_test_from_last_and_best_in_new_processes(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", *tiny_args, "--trainer.max_epochs=2"])
    run = run_dir(tmp_path)
    assert (run / "config.yaml").is_file()
    assert list(run.glob("events.out.tfevents.*"))
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "last.ckpt" in checkpoints and any(name.startswith("epoch") for name in checkpoints)

    tested = main(["test", *tiny_args, "--ckpt_path=last"])
    metrics = tested.trainer.callback_metrics
    assert {"test/loss", "test/acc"} <= metrics.keys()

    # the reported accuracy is that of the checkpoint on the whole test set, at the trained size
    model = ImageClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt").eval()
    dm = ColourImages(image_size=32, batch_size=20, val_size=40)
    dm.setup("test")
    with torch.inference_mode():
        pairs = [(model(x).argmax(1), y) for x, y in dm.test_dataloader()]
    correct = sum(int((p == y).sum()) for p, y in pairs)
    assert metrics["test/acc"].item() == pytest.approx(correct / len(dm._datasets["test"]))

    best = main(["test", *tiny_args, "--ckpt_path=best"])
    assert best.trainer.ckpt_path.startswith(str(run / "checkpoints" / "epoch"))


def test_num_classes_is_linked_from_the_data_module(tiny_args: list[str]) -> None:
    cli = main(["validate", *tiny_args, "--trainer.limit_val_batches=1"])
    assert cli.model.hparams.num_classes == cli.datamodule.num_classes == 10
    with pytest.raises(SystemExit):  # it is not an option of its own: it cannot disagree
        main(["fit", *tiny_args, "--model.num_classes=5"])


def parsed_config(capsys: pytest.CaptureFixture, *args: str) -> dict:
    with pytest.raises(SystemExit):
        main(["fit", *args, "--print_config"])
    return yaml.safe_load(capsys.readouterr().out)


def test_default_yaml_equals_the_code_defaults(capsys: pytest.CaptureFixture) -> None:
    from_code = parsed_config(capsys)
    from_file = parsed_config(capsys, f"--config={REPO / 'configs' / 'default.yaml'}")
    from_file.pop("config", None)
    assert from_file == from_code
    assert from_code["model"]["arch"] == "mobilenet_v2" and from_code["data"]["init_args"]["image_size"] is None
    assert CIFAR10DataModule(synthetic=True).hparams.image_size == 112  # the default job's size
    assert from_code["data"]["init_args"]["batch_size"] == 256 and from_code["trainer"]["max_epochs"] == 10


@pytest.mark.parametrize("arch", ["mobilenet_v2", "resnet50"])
def test_model_configs_compose(capsys: pytest.CaptureFixture, arch: str) -> None:
    config = parsed_config(
        capsys,
        f"--config={REPO / 'configs' / 'default.yaml'}",
        f"--model={REPO / 'configs' / 'model' / f'{arch}.yaml'}",
    )
    assert config["model"]["arch"] == arch


class EpochRecorder(Callback):
    """Records which epochs a run trains; with ``crash=True`` it stands in for a machine dying
    in the middle of the second epoch."""

    def __init__(self, crash: bool = False) -> None:
        self.crash, self.epochs = crash, []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.epochs.append(trainer.current_epoch)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        if self.crash and trainer.current_epoch == 1 and batch_idx == 2:
            raise RuntimeError("simulated crash")


def final_weights(root: Path, version: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(run_dir(root, version) / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]


def test_resumed_run_ends_with_the_weights_of_an_unbroken_one(tmp_path: Path) -> None:
    common = [
        "--data.synthetic=true",
        "--data.synthetic_size=100",
        "--data.val_size=20",
        "--data.image_size=32",
        "--data.batch_size=20",
        "--data.num_workers=0",
        "--trainer.max_epochs=3",
        "--trainer.deterministic=true",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
    ]
    main(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'unbroken'}"])
    broken = tmp_path / "broken"
    crash = [f"--trainer.callbacks+={__name__}.EpochRecorder", "--trainer.callbacks.crash=true"]
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["fit", *common, f"--trainer.default_root_dir={broken}", *crash])
    record = [f"--trainer.callbacks+={__name__}.EpochRecorder"]
    resumed = main(["fit", *common, f"--trainer.default_root_dir={broken}", "--ckpt_path=last", *record])
    recorder = next(c for c in resumed.trainer.callbacks if isinstance(c, EpochRecorder))
    assert recorder.epochs == [1, 2]  # it went on from the checkpoint rather than starting over
    expected, actual = final_weights(tmp_path / "unbroken"), final_weights(broken, 1)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_learns_the_generated_data(tiny_args: list[str]) -> None:
    # lr scaled down with the batch (0.1 at 256 -> ~0.01 at 20), as the linear scaling rule says
    cli = main(["fit", *tiny_args, "--trainer.max_epochs=8", "--model.lr=0.02"])
    assert cli.trainer.callback_metrics["val/acc"].item() > 0.5  # chance is 0.1


def run_module(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "project", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_fast_dev_run_works_offline_with_synthetic_data(tmp_path: Path) -> None:
    result = run_module("fit", "--data.synthetic=true", "--trainer.fast_dev_run=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "max_steps=1` reached" in result.stderr + result.stdout


def test_offline_fit_without_data_fails_fast_with_one_line(tmp_path: Path) -> None:
    result = run_module("fit", f"--data.data_dir={tmp_path / 'data'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: CIFAR-10 not found in")
    assert "--data.data_dir" in last_line and "--data.synthetic=true" in last_line
    assert not (tmp_path / "lightning_logs").exists() and not (tmp_path / "data").exists()


def test_test_from_last_without_any_run_is_an_error(tiny_args: list[str], tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["test", *tiny_args, "--ckpt_path=last"])
    assert f"no run with a checkpoint under {tmp_path / 'lightning_logs'}" in capsys.readouterr().err


def test_last_is_found_under_a_configured_logger(tiny_args: list[str], tmp_path: Path) -> None:
    logger = [
        "--trainer.logger.class_path=lightning.pytorch.loggers.TensorBoardLogger",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'elsewhere'}",
        "--trainer.logger.init_args.name=my_runs",
    ]
    main(["fit", *tiny_args, *logger, "--trainer.max_epochs=1"])
    tested = main(["test", *tiny_args, *logger, "--ckpt_path=last"])
    assert "test/acc" in tested.trainer.callback_metrics
    assert (tmp_path / "elsewhere" / "my_runs" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize(("options", "benchmark"), [([], True), (["--trainer.deterministic=true"], False)])
def test_cudnn_autotuning_is_on_unless_deterministic(
    tiny_args: list[str], monkeypatch: pytest.MonkeyPatch, options: list[str], benchmark: bool
) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not benchmark)  # restored after the test
    main(["validate", *tiny_args, *options, "--trainer.limit_val_batches=1"])
    assert torch.backends.cudnn.benchmark is benchmark


def test_each_command_holds_the_default_callbacks_with_work_in_it(tiny_args: list[str], tmp_path: Path) -> None:
    """Every default callback is on (but those OFF_BY_DEFAULT), in the commands it has work in (WORKS_IN), and in no
    other; Lightning misses no callback whose state the checkpoint holds."""
    from project.toolkit.callbacks import DEFAULT_CALLBACKS, OFF_BY_DEFAULT, WORKS_IN

    shown = ["--trainer.enable_progress_bar=true", "--trainer.enable_model_summary=true"]  # tiny_args hide them
    fit = main(["fit", *tiny_args, *shown, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"])
    last = Path(fit.trainer.log_dir) / "checkpoints" / "last.ckpt"
    for command in ("fit", "validate", "test", "predict"):
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            cli = fit if command == "fit" else main([command, *tiny_args, *shown, f"--ckpt_path={last}"])
        assert not [w for w in warned if "callbacks used to create the checkpoint" in str(w.message)], command
        held = list(each_callback(cli.trainer))
        for name, kind in DEFAULT_CALLBACKS.items():
            works = command in WORKS_IN.get(name, {command}) and name not in OFF_BY_DEFAULT
            assert any(isinstance(c, kind) for c in held) == works, (command, name)


def test_each_default_callback_can_be_switched_off(tiny_args: list[str], tmp_path: Path) -> None:
    from project.toolkit.timing.callback import TimingCallback

    off = main(
        ["fit", *tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--callbacks.timing=false"]
    )
    assert TimingCallback not in {type(c) for c in each_callback(off.trainer)}
    assert not (Path(off.trainer.log_dir) / "timing.json").exists()


@pytest.mark.parametrize("option", ["--trainer.enable_checkpointing=false", "--callbacks.checkpoint=false"])
def test_checkpointing_can_be_switched_off(tiny_args: list[str], tmp_path: Path, option: str) -> None:
    cli = main(["fit", *tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", option])
    assert cli.trainer.checkpoint_callback is None
    assert not list(tmp_path.rglob("*.ckpt"))


def test_default_yaml_lists_the_default_callbacks(capsys: pytest.CaptureFixture) -> None:
    from project.toolkit.callbacks import DEFAULT_CALLBACKS, OFF_BY_DEFAULT

    listed = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())["callbacks"]
    assert listed == {name: name not in OFF_BY_DEFAULT for name in DEFAULT_CALLBACKS}


@pytest.mark.skipif(not rich_installed(), reason="the rich bar needs rich (the progress extra, installed by dev)")
@pytest.mark.parametrize(("options", "redraws_per_second"), [([], 10), (["--progress_bar.refresh_rate=3"], 3)])
def test_rich_bar_redraws_ten_times_a_second_unless_told(
    tiny_args: list[str], options: list[str], redraws_per_second: int
) -> None:
    # Lightning's 100 redraws a second cost its drawing thread about 1.5 % of a core.
    shown = ["--trainer.enable_progress_bar=true"]  # tiny_args hide the bar
    cli = main(["fit", *tiny_args, *shown, *options, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"])
    (bar,) = [c for c in cli.trainer.callbacks if isinstance(c, RichTrainingBar)]
    assert bar.refresh_rate == redraws_per_second

"""``--callbacks.ema=true``: validation runs on the exponential moving average of the weights (checked against its
formula, step by step), checkpoints hold it (so test, predict and export use it) beside the trained weights, a resumed
fit ends as an unbroken one, a step reads nothing on the host, and a strategy that shards the weights is refused."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import ModelParallelStrategy

from project.__main__ import main
from project.toolkit.callbacks.averaged_weights import TRAINED, AveragedWeights
from project.toolkit.errors import ProjectError
from project.toolkit.interfaces import StrategyLayout
from tests.integration.test_strategies import last_checkpoint
from tests.support.runs import one_error_line

SMALL = ["--model.arch=tests.support.user_nets.sequential_convnet", "--trainer.limit_train_batches=3"]
SMALL += ["--trainer.deterministic=true"]
SEEN = f"--trainer.callbacks+={__name__}.WeightsSeen"
STOP = "--trainer.callbacks+=tests.integration.test_strategies.StopAfterFirstEpoch"


def floats(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in module.state_dict().items() if t.is_floating_point()}


class WeightsSeen(Callback):
    """The module's floating-point state as training starts and after each step; at each validation of the fit, the
    steps taken, the state it validates and its val/loss."""

    def __init__(self) -> None:
        self.start: dict[str, torch.Tensor] = {}
        self.steps: list[dict[str, torch.Tensor]] = []
        self.validations: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.val_losses: list[float] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.start = floats(pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.steps.append(floats(pl_module))

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.validations.append((len(self.steps), floats(pl_module)))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.val_losses.append(float(trainer.callback_metrics["val/loss"]))


def seen(cli: Any) -> WeightsSeen:
    return next(c for c in cli.trainer.callbacks if isinstance(c, WeightsSeen))


def averages(start: dict, steps: list[dict], decay: float) -> list[dict[str, torch.Tensor]]:
    """The average after 0, 1, 2, ... steps: ``average = decay * average + (1 - decay) * weights``."""
    average, out = start, [start]
    for weights in steps:
        average = {name: decay * average[name] + (1 - decay) * weights[name] for name in average}
        out.append(average)
    return out


def assert_same(actual: dict, expected: dict, exact: bool = False) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-5, "atol": 1e-6}
        torch.testing.assert_close(actual[name], expected[name], **tolerance, msg=name)


@pytest.mark.parametrize("strategy", ["auto", "dp"])
@pytest.mark.parametrize("decay", [0.5, 1.0])
def test_validation_and_checkpoints_hold_the_average_of_its_formula(
    tiny_args: list[str], tmp_path: Path, strategy: str, decay: float
) -> None:
    ema = ["--callbacks.ema=true", f"--ema.decay={decay}", "--callbacks.precise_bn=false"]  # statistics averaged
    cli = main(["fit", *tiny_args, *SMALL, *ema, SEEN, "--trainer.max_epochs=2", f"--trainer.strategy={strategy}"])
    record = seen(cli)
    expected = averages(record.start, record.steps, decay)
    assert [steps for steps, _ in record.validations] == [3, 6]
    for steps, state in record.validations:
        assert_same(state, expected[steps])
    checkpoint = last_checkpoint(tmp_path)
    assert_same({k: v for k, v in checkpoint["state_dict"].items() if v.is_floating_point()}, expected[-1])
    assert_same({k: v for k, v in checkpoint[TRAINED].items() if v.is_floating_point()}, record.steps[-1], exact=True)
    assert_same(floats(cli.trainer.lightning_module), expected[-1])  # the module ends with the average


def test_decay_0_validates_and_saves_what_a_run_without_it_does(tiny_args: list[str], tmp_path: Path) -> None:
    # precise_bn on (auto, 3 batches an epoch): it recomputes the statistics of the weights validated
    runs = {}
    for name, ema in (("off", []), ("ema", ["--callbacks.ema=true", "--ema.decay=0"])):
        root = f"--trainer.default_root_dir={tmp_path / name}"
        runs[name] = seen(main(["fit", *tiny_args, *SMALL, *ema, SEEN, "--trainer.max_epochs=2", root]))
    assert len(runs["off"].val_losses) == 2 and runs["ema"].val_losses == runs["off"].val_losses
    on, off = last_checkpoint(tmp_path / "ema"), last_checkpoint(tmp_path / "off")
    assert_same(on["state_dict"], off["state_dict"], exact=True)
    assert TRAINED in on and TRAINED not in off


def test_a_resumed_fit_ends_as_an_unbroken_one(tiny_args: list[str], tmp_path: Path) -> None:
    common = [*tiny_args, *SMALL, "--callbacks.ema=true", "--ema.decay=0.5", "--trainer.max_epochs=2"]
    main(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'unbroken'}"])
    broken = [*common, f"--trainer.default_root_dir={tmp_path / 'broken'}"]
    main(["fit", *broken, STOP])
    main(["fit", *broken, "--ckpt_path=last"])
    unbroken, resumed = last_checkpoint(tmp_path / "unbroken"), last_checkpoint(tmp_path / "broken", version=1)
    assert unbroken["global_step"] == resumed["global_step"] == 6
    for key in ("state_dict", TRAINED):
        assert_same(resumed[key], unbroken[key], exact=True)


def test_test_predict_and_export_use_the_average(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", *tiny_args, *SMALL, "--callbacks.ema=true", "--ema.decay=0.5", "--trainer.max_epochs=1"])
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    averaged, trained = checkpoint["state_dict"], checkpoint[TRAINED]
    assert any(not torch.equal(averaged[name], trained[name]) for name in averaged)
    for command in ("test", "predict"):
        cli = main([command, *tiny_args, f"--ckpt_path={last}"])
        assert_same(cli.trainer.lightning_module.state_dict(), averaged, exact=True)
    main(["export", f"--ckpt_path={last}", "--format=pt2", f"--out={tmp_path / 'm.pt2'}"])
    exported = torch.export.load(tmp_path / "m.pt2").state_dict
    for name, value in averaged.items():
        if f"model.{name}" in exported:
            torch.testing.assert_close(exported[f"model.{name}"], value, rtol=0, atol=0, msg=name)
    assert sum(f"model.{name}" in exported for name in averaged) >= 10


@pytest.mark.parametrize(
    ("callback", "reads"),
    [("--callbacks.ema=true", False), ("--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", True)],
    ids=["template", "lightning"],
)
def test_the_average_is_updated_with_no_host_read(tiny_args: list[str], callback: str, reads: bool) -> None:
    """On a GPU each read is a wait for the device: Lightning's EMAWeightAveraging reads ``n_averaged`` each step."""
    from tests.integration.test_host_waits import LAST, WatchSteps

    steps = ["--data.on_device=true", "--data.batch_size=4", "--data.val_size=20", "--trainer.max_epochs=1"]
    watch = [f"--trainer.callbacks+={WatchSteps.__module__}.WatchSteps", f"--trainer.limit_train_batches={LAST + 5}"]
    cli = main(["fit", *tiny_args, SMALL[0], *steps, "--trainer.log_every_n_steps=50", *watch, callback])
    watcher = next(c for c in cli.trainer.callbacks if isinstance(c, WatchSteps))
    read = watcher.functions.calls + watcher.ops.seen  # float(), .item(), bool() of a tensor
    assert bool(read) is reads, read


def test_a_strategy_sharding_the_weights_is_refused() -> None:
    module = torch.nn.Linear(2, 2)
    pipeline = SimpleNamespace(layout=lambda: StrategyLayout(sample_copies=2))
    for strategy in (ModelParallelStrategy(), pipeline):
        trainer = SimpleNamespace(strategy=strategy, checkpoint_callbacks=[])
        with pytest.raises(ProjectError, match=r"^--callbacks.ema=true is not for \w+, whose processes hold parts"):
            AveragedWeights().setup(trainer, module, "fit")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--ema.decay=1.5"], "error: ema.decay=1.5 is not allowed: it must be a number from 0 to 1"),
        (["--checkpoint.save_weights_only=true"], "error: --callbacks.ema=true saves two sets of weights: leave "),
    ],
)
def test_bad_settings_are_one_line(
    tiny_args: list[str], capsys: pytest.CaptureFixture, options: list[str], line: str
) -> None:
    fit = [*tiny_args, *SMALL, "--callbacks.ema=true", "--trainer.max_epochs=1", *options]
    assert one_error_line("fit", fit, capsys).startswith(line)


@pytest.mark.slow
def test_ddp_resumes_as_an_unbroken_run(tiny_args: list[str], tmp_path: Path) -> None:
    from tests.integration.test_strategy_runs import run_project

    common = [*tiny_args, *SMALL, "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.max_epochs=2"]
    common += ["--callbacks.ema=true", "--ema.decay=0.5"]
    run_project("fit", *common, f"--trainer.default_root_dir={tmp_path / 'unbroken'}", cwd=tmp_path)
    broken = [*common, f"--trainer.default_root_dir={tmp_path / 'broken'}"]
    run_project("fit", *broken, STOP, cwd=tmp_path)
    run_project("fit", *broken, "--ckpt_path=last", cwd=tmp_path)
    unbroken, resumed = last_checkpoint(tmp_path / "unbroken"), last_checkpoint(tmp_path / "broken", version=1)
    assert unbroken["global_step"] == resumed["global_step"] == 6
    for key in ("state_dict", TRAINED):
        assert_same(resumed[key], unbroken[key])
    assert any(not torch.equal(resumed["state_dict"][k], resumed[TRAINED][k]) for k in resumed["state_dict"])


@pytest.mark.slow
def test_fsdp_is_refused_in_one_line_leaving_no_run_folder(tiny_args: list[str], tmp_path: Path) -> None:
    from tests.integration.test_strategy_runs import run_project

    fsdp = ["--trainer.strategy=fsdp", "--trainer.devices=2", "--callbacks.ema=true", "--trainer.max_epochs=1"]
    err = run_project("fit", *tiny_args, SMALL[0], *fsdp, cwd=tmp_path, expect=2)
    line = "error: --callbacks.ema=true is not for FullyShardedStrategy, whose processes hold parts of the weights"
    assert [text for text in err.splitlines() if text.startswith("error:")] == [line], err[-2000:]
    assert not (tmp_path / "lightning_logs").exists()

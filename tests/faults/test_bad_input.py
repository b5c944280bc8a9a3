"""Bad input across the CLI and configs: each case exits with status 2 and ONE line on stderr that
names the bad value and what is allowed, with no traceback and no usage dump, and leaves no run
folder behind."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from project.__main__ import main
from project.model import ImageClassifier
from tests.support.runs import one_error_line

REPO = Path(__file__).resolve().parents[2]


def other_task_checkpoint(tmp: Path) -> str:
    """A real checkpoint of a 5-class model: another task's classifier."""
    model = ImageClassifier(num_classes=5)
    path = tmp / "five_classes.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path)
    return f"--ckpt_path={path}"


def truncated_checkpoint(tmp: Path) -> str:
    path = tmp / "truncated.ckpt"
    torch.save({"state_dict": ImageClassifier().state_dict()}, path)
    path.write_bytes(path.read_bytes()[:1000])
    return f"--ckpt_path={path}"


def not_a_checkpoint(tmp: Path) -> str:
    path = tmp / "weights.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    return f"--ckpt_path={path}"


def yaml_with_unknown_key(tmp: Path) -> str:
    path = tmp / "typo.yaml"
    path.write_text("model:\n  archh: resnet50\n")
    return f"--config={path}"


def data_dir_that_is_a_file(tmp: Path) -> str:
    path = tmp / "cifar.tar"
    path.write_text("not a folder")
    return f"--data.data_dir={path}"


def empty_data_dir(tmp: Path) -> str:
    return f"--data.data_dir={tmp / 'empty'}"


Case = tuple[str, Callable[[Path], str] | str, str]

# (subcommand, argument or a function of a scratch folder returning one, text the error line must hold)
CASES: list[Case] = [
    (
        "fit",
        "--host_memory_reuse.trim_threshold_mb=-1",
        "host_memory_reuse.trim_threshold_mb=-1: use 0 or more (MiB)",
    ),
    (
        "fit",
        "--model.arch=resnet5",
        "model.arch='resnet5' is neither a torchvision classification model nor package.module.name",
    ),
    ("fit", "--model.arch=", "model.arch='' is neither a torchvision classification model nor package.module.name"),
    ("fit", "--trainer.strategy=ddpp", "trainer.strategy='ddpp' is not a strategy; did you mean ddp or dp?"),
    ("fit", "--trainer.accelerator=qpu", "trainer.accelerator='qpu' is not an accelerator; choose one of:"),
    ("fit", "--trainer.accelerator=gpu", "trainer.accelerator='gpu', but this machine has no CUDA GPU"),
    ("fit", "--trainer.devices=0", "trainer.devices='0' is not allowed: use a number >= 1"),
    ("fit", "--trainer.devices=two", "trainer.devices='two' is not allowed: use a number >= 1"),
    ("fit", "--trainer.precision=17", "trainer.precision=17 is not allowed; expected"),
    ("fit", "--trainer.max_epochs=ten", "trainer.max_epochs=ten is not allowed; expected int or null"),
    ("fit", "--data.image_size=0", "data.image_size=0 is not allowed: it must be an integer >= 1"),
    ("fit", "--data.image_size=big", "data.image_size=big is not allowed; expected int"),
    ("fit", "--data.batch_size=-8", "data.batch_size=-8 is not allowed: it must be an integer >= 1"),
    ("fit", "--data.batch_size=0", "data.batch_size=0 is not allowed"),
    ("fit", "--data.val_size=-1", "data.val_size=-1 is not allowed: use a count (0: none) or a fraction below 1"),
    ("fit", "--data.val_size=100000", "data.val_size=100000 is not allowed: it must lie between 0 (no validation) and"),
    ("validate", "--data.val_size=0", "data.val_size=0 holds out no images, so there is nothing to validate"),
    ("fit", "--data.num_workers=-1", "data.num_workers=-1 is not allowed"),
    ("fit", "--data.augmentation=flip", "data.augmentation=flip is not allowed; expected"),
    (
        "fit",
        "--data.augmentation=torchvision.transforms.v2.functional.to_dtype",
        "data.augmentation='to_dtype' must return a uint8 (C, H, W) image as it is given one; it returned",
    ),
    ("fit", "--model.lr=-0.1", "model.lr=-0.1 is not allowed: it must be a number > 0"),
    ("fit", "--model.momentum=1.5", "model.momentum=1.5 is not allowed: it must be a number in [0, 1)"),
    ("fit", "--model.label_smoothing=1", "model.label_smoothing=1.0 is not allowed"),
    ("fit", "--model.warmup_epochs=-1", "model.warmup_epochs=-1.0 is not allowed"),
    ("fit", "--no_such_option=1", "unrecognized arguments: --no_such_option=1"),
    ("fit", "--config=missing.yaml", "missing.yaml"),
    ("fit", yaml_with_unknown_key, "does not accept option 'model.archh'"),
    ("fit", data_dir_that_is_a_file, "cifar.tar is a file; it must be a folder"),
    ("fit", empty_data_dir, "CIFAR-10 not found in"),
    ("fit", "--ckpt_path=nowhere.ckpt", "--ckpt_path=nowhere.ckpt: no such file"),
    ("test", "--ckpt_path=best", "--ckpt_path=best: no run with a checkpoint under"),
    ("test", other_task_checkpoint, "five_classes.ckpt: a model of 5 classes, but this data has 10"),
    ("test", truncated_checkpoint, "truncated.ckpt: not a readable checkpoint"),
    ("test", not_a_checkpoint, "weights.pt: a torch file, but not a Lightning checkpoint"),
]


@pytest.mark.parametrize(("subcommand", "argument", "message"), CASES, ids=[f"{c[0]}:{c[2][:40]}" for c in CASES])
def test_bad_input_is_one_line_and_leaves_nothing_behind(
    tiny_args: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    subcommand: str,
    argument: Callable[[Path], str] | str,
    message: str,
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    arg = argument(scratch) if callable(argument) else argument
    # CIFAR-10's own folder checks need the template's data set instead of the tests' own
    data = ["--data=project.data.CIFAR10DataModule"] if argument in (data_dir_that_is_a_file, empty_data_dir) else []
    # the bad argument comes last, so it overrides tiny_args' good value of the same option
    line = one_error_line(subcommand, [*tiny_args, *data, arg], capsys)
    assert message in line, line
    assert not (tmp_path / "lightning_logs").exists()  # no half-made run folder


def test_a_failed_start_keeps_earlier_runs(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", *tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=1"])
    runs = tmp_path / "lightning_logs"
    before = sorted(p.relative_to(runs) for p in runs.rglob("*"))
    with pytest.raises(SystemExit):
        main(["fit", *tiny_args, "--data.val_size=100000"])  # fails in setup, after the logger made its folder
    assert sorted(p.relative_to(runs) for p in runs.rglob("*")) == before


@pytest.mark.slow
def test_batch_that_does_not_divide_across_processes_is_one_line(tmp_path: Path) -> None:
    args = ["--data.synthetic=true", "--data.synthetic_size=40", "--data.val_size=8", "--data.image_size=32"]
    result = subprocess.run(
        [sys.executable, "-m", "project", "fit", *args, "--data.batch_size=7", "--trainer.strategy=ddp"]
        + ["--trainer.accelerator=cpu", "--trainer.devices=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: data.batch_size=7 is the global batch and must divide evenly across the 2 processes of this "
        "run; use a multiple of 2"
    ]
    assert not (tmp_path / "lightning_logs").exists()

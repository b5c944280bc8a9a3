"""A checkpoint or weights file from elsewhere is data, not code: one whose unpickling would create a folder is refused
by every command that takes it, before anything runs, in one line naming the file and what it holds; a file the user
says is trusted (``--weights_only=false``) is read with what it names allowed."""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from project.__main__ import main
from project.model import ImageClassifier
from project.toolkit.callbacks.checkpoints import check_checkpoint_file
from project.toolkit.errors import ProjectError
from tests.support.runs import one_error_line


class MakesAFolder:
    """Unpickled, it calls ``os.mkdir``: the stand-in for a payload."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.path,))


def checkpoint_of(model: ImageClassifier, **extra: object) -> dict:
    return {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams), **extra}


@pytest.fixture
def payload(tmp_path: Path) -> tuple[Path, Path]:
    """``(checkpoint file, the folder its unpickling would create)``."""
    made = tmp_path / "the_payload_ran"
    path = tmp_path / "shared_by_someone.ckpt"
    torch.save(checkpoint_of(ImageClassifier(), callbacks={"x": MakesAFolder(made)}), path)
    return path, made


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test", "predict"])
def test_a_checkpoint_that_runs_code_is_refused_by_every_trainer_command(
    subcommand: str, payload: tuple[Path, Path], tiny_args: list[str], capsys: pytest.CaptureFixture
) -> None:
    path, made = payload
    line = one_error_line(subcommand, [*tiny_args, f"--ckpt_path={path}"], capsys)
    assert line.startswith(f"error: --ckpt_path={path} holds posix.mkdir, which a safe load refuses")
    assert "--weights_only=false" in line and not made.exists()


def test_export_refuses_it_too(payload: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, made = payload
    line = one_error_line("export", [f"--ckpt_path={path}", "--format=pt2", f"--out={tmp_path / 'm.pt2'}"], capsys)
    assert f"--ckpt_path={path} holds posix.mkdir" in line
    assert not made.exists() and not (tmp_path / "m.pt2").exists()


def test_best_is_not_looked_up_in_a_planted_last_checkpoint(
    payload: tuple[Path, Path], tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path, made = payload
    planted = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(path.read_bytes())
    line = one_error_line("test", [*tiny_args, "--ckpt_path=best"], capsys)
    assert f"--ckpt_path={planted} holds posix.mkdir" in line
    line = one_error_line("export", [f"--logs={planted.parents[2]}", "--format=pt2", f"--out={tmp_path / 'm'}"], capsys)
    assert f"{planted} holds posix.mkdir" in line
    assert not made.exists()


def test_weights_that_run_code_are_refused(tmp_path: Path, tiny_args: list[str], capsys: pytest.CaptureFixture) -> None:
    made, weights = tmp_path / "the_payload_ran", tmp_path / "weights.pt"
    torch.save({**ImageClassifier().net.state_dict(), "extra": MakesAFolder(made)}, weights)
    line = one_error_line("fit", [*tiny_args, f"--model.weights={weights}"], capsys)
    assert line.startswith(f"error: model.weights={weights} holds posix.mkdir, which a safe load refuses")
    assert "--weights_only" not in line and not made.exists()


def test_a_sharded_folder_whose_metadata_runs_code_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder, made = tmp_path / "sharded.ckpt", tmp_path / "the_payload_ran"
    model = ImageClassifier(arch="tests.support.user_nets.sequential_convnet")
    dcp.save({"state_dict": model.state_dict()}, checkpoint_id=folder)  # one process: a real .metadata
    assert check_checkpoint_file(folder) is None  # torch's own bookkeeping passes
    (folder / ".metadata").write_bytes(pickle.dumps(MakesAFolder(made)))
    with pytest.raises(ProjectError, match=r"sharded\.ckpt holds posix\.mkdir in its \.metadata") as caught:
        check_checkpoint_file(folder)
    assert "\n" not in str(caught.value) and not made.exists()
    line = one_error_line("test", [f"--ckpt_path={folder}", "--trainer.accelerator=cpu"], capsys)
    assert "holds posix.mkdir in its .metadata" in line and not made.exists()


def test_a_trusted_file_is_read_with_what_it_names(
    tmp_path: Path, tiny_args: list[str], capsys: pytest.CaptureFixture
) -> None:
    """A checkpoint from another project, holding a harmless class beside a real fit's: refused by default, tested
    once trusted (which allows that class in this process: put back after)."""
    fit = [*tiny_args, "--model.arch=tests.support.user_nets.sequential_convnet", "--trainer.max_epochs=1"]
    main(["fit", *fit, "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"])
    path = tmp_path / "other_project.ckpt"
    checkpoint = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    torch.save({**checkpoint, "notes": argparse.Namespace(source="elsewhere")}, path)
    capsys.readouterr()
    line = one_error_line("test", [*tiny_args, f"--ckpt_path={path}"], capsys)
    assert "holds argparse.Namespace" in line
    allowed = torch.serialization.get_safe_globals()
    try:
        main(["test", *tiny_args, f"--ckpt_path={path}", "--weights_only=false"])
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(allowed)
    assert "test/acc" in capsys.readouterr().out


def test_what_the_template_writes_is_plain_data(tmp_path: Path, tiny_args: list[str]) -> None:
    """A fit with a user's augmentation transform and another optimizer writes checkpoints a safe load reads whole."""
    options = ["--model.optimizer=torch.optim.AdamW", "--model.optimizer.lr=0.001", "--trainer.max_epochs=1"]
    options += ["--data.augmentation=torchvision.transforms.v2.RandomHorizontalFlip", "--trainer.limit_val_batches=1"]
    main(["fit", *tiny_args, *options, "--trainer.limit_train_batches=2"])
    written = sorted((tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt"))
    assert len(written) == 2
    for path in written:
        assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []
        assert torch.load(path, weights_only=True)["hyper_parameters"]["optimizer"]["class_path"] == "torch.optim.AdamW"

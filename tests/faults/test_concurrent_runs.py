"""Runs started at once under one ``default_root_dir`` (a hyperparameter search's parallel workers) each get a run
folder of their own: its ``version_N`` is claimed with one ``mkdir`` as the run is arranged, not found free and made
later; the ranks of one run (ddp's launched processes) still share theirs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace

from project.toolkit.cli.run_dirs import CLAIMED, arrange_run_folder
from tests.support.fixtures import TINY_RUN

TINY_FIT = [
    *TINY_RUN,
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.num_sanity_val_steps=0",
]


def fit_config(root: Path, logger: object = None) -> Namespace:
    return Namespace(trainer=Namespace(default_root_dir=str(root), logger=logger), ckpt_path=None)


def versions(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "lightning_logs").iterdir())


@pytest.fixture(autouse=True)
def _first_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process starts its runs: no rank of another's, no folder claimed by an earlier test."""
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", CLAIMED):
        monkeypatch.setenv(name, "0")  # so that its value before is restored after, also where it had none
        monkeypatch.delenv(name)


def test_runs_arranged_before_either_writes_get_two_folders(tmp_path: Path) -> None:
    """Two runs arranged one after the other, before either has written anything (as two processes started at
    once are): each claims its own version_N; so does a run without a logger."""
    first, second, unlogged = fit_config(tmp_path), fit_config(tmp_path), fit_config(tmp_path, logger=False)
    for config in (first, second, unlogged):
        assert arrange_run_folder("fit", config) is None
    assert [first.trainer.logger.init_args.version, second.trainer.logger.init_args.version] == [
        "version_0",
        "version_1",
    ]
    assert unlogged.trainer.default_root_dir == str(tmp_path / "lightning_logs" / "version_2")
    assert versions(tmp_path) == ["version_0", "version_1", "version_2"]  # made as they were claimed


def test_the_ranks_a_launcher_starts_share_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ddp's launcher claims the folder before it starts the other ranks, which inherit its environment: they take
    that folder, though a later one is free, and make none; a rank torchrun or srun started makes none either."""
    launcher = fit_config(tmp_path)
    arrange_run_folder("fit", launcher)
    assert os.environ[CLAIMED] == str(tmp_path / "lightning_logs" / "version_0")
    monkeypatch.setenv("LOCAL_RANK", "1")
    rank = fit_config(tmp_path)
    arrange_run_folder("fit", rank)
    assert rank.trainer.logger.init_args.version == launcher.trainer.logger.init_args.version == "version_0"
    monkeypatch.delenv(CLAIMED)
    monkeypatch.setenv("RANK", "1")
    arrange_run_folder("fit", fit_config(tmp_path))
    assert versions(tmp_path) == ["version_0"]


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "project", "fit", *args]
    return subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def wait_all(processes: list[subprocess.Popen], timeout: float = 300) -> None:
    try:
        errors = [process.communicate(timeout=timeout)[1] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    for process, err in zip(processes, errors, strict=True):
        assert process.returncode == 0, err[-3000:]


def run_folders(root: Path) -> dict[str, dict]:
    """Each run folder's timing.json, after checking that one run wrote it: one TensorBoard event file, one
    config, a last.ckpt whose step is the run's."""
    found = {}
    for folder in sorted((root / "lightning_logs").iterdir()):
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1, f"{folder.name}: written by more than one run"
        assert (folder / "config.yaml").is_file()
        last = torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert last["global_step"] == 2
        found[folder.name] = json.loads((folder / "timing.json").read_text())
    return found


@pytest.mark.slow
def test_fits_started_at_once_each_write_a_folder_of_their_own(tmp_path: Path) -> None:
    """Three fits started together with one default_root_dir: three run folders, each with its own last.ckpt,
    timing.json and TensorBoard events (before, all three wrote into version_0 and exited 0)."""
    args = [*TINY_FIT, "--trainer.devices=1", f"--trainer.default_root_dir={tmp_path}"]
    wait_all([start(args, tmp_path) for _ in range(3)])
    found = run_folders(tmp_path)
    assert sorted(found) == ["version_0", "version_1", "version_2"]
    assert all(timing["world_size"] == 1 for timing in found.values())


@pytest.mark.slow
def test_a_ddp_fit_and_a_single_fit_started_at_once_keep_apart(tmp_path: Path) -> None:
    """A 2-process ddp fit and a one-process fit started together: two run folders, the ddp ranks sharing theirs."""
    args = [*TINY_FIT, f"--trainer.default_root_dir={tmp_path}"]
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2"]
    wait_all([start([*args, *ddp], tmp_path), start([*args, "--trainer.devices=1"], tmp_path)])
    found = run_folders(tmp_path)
    assert len(found) == 2, sorted(found)
    assert sorted(timing["world_size"] for timing in found.values()) == [1, 2]

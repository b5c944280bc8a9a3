"""A run under an fsspec URL, as Lightning accepts for ``default_root_dir`` and checkpoints: a remote one
(``memory://`` here: fsspec's in-process file system, so these runs stay in this process) takes the checkpoints,
config and TensorBoard events through fsspec and resumes with ``--ckpt_path=last``; a ``file://`` URL is its local
path; what would write this machine's files under a remote root is refused in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import torch

from project.__main__ import main
from project.toolkit.checkpoint_io import AtomicCheckpointIO
from tests.support.fixtures import TINY_RUN
from tests.support.runs import one_error_line

QUICK = [
    "--trainer.devices=1",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.num_sanity_val_steps=0",
]
LOCAL_WRITERS_OFF = ["--callbacks.timing=false", "--callbacks.evaluation=false"]


@pytest.fixture
def memory_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A root of fsspec's memory file system of this test's own, emptied after it; the working directory is
    tmp_path, where nothing may land."""
    monkeypatch.chdir(tmp_path)
    root = f"memory://{tmp_path.name}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{tmp_path.name}"):
        fs.rm(f"/{tmp_path.name}", recursive=True)


def test_fit_and_resume_under_a_memory_url(memory_root: str, tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    args = [*TINY_RUN, *QUICK, *LOCAL_WRITERS_OFF, f"--trainer.default_root_dir={memory_root}"]
    main(["fit", *args])
    first = f"{memory_root}/lightning_logs/version_0"
    assert fs.isfile(f"{first}/checkpoints/last.ckpt") and fs.isfile(f"{first}/config.yaml")
    assert fs.glob(f"{first}/events.out.tfevents.*")  # TensorBoard writes through fsspec too

    resumed = main(["fit", *args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert resumed.trainer.ckpt_path == f"{first}/checkpoints/last.ckpt"
    with fs.open(f"{memory_root}/lightning_logs/version_1/checkpoints/last.ckpt", "rb") as f:
        last = torch.load(f, map_location="cpu", weights_only=False)
    assert (last["epoch"], last["global_step"]) == (1, 4)  # went on from epoch 0's two steps
    assert list(tmp_path.iterdir()) == []  # no local "memory:" folder


def test_a_file_url_root_is_its_local_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``file:///abs/runs`` writes into /abs/runs, not into a folder named ``file:`` in the working directory."""
    monkeypatch.chdir(tmp_path)
    main(["fit", *TINY_RUN, *QUICK, f"--trainer.default_root_dir=file://{tmp_path}/runs"])
    assert (tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_remote_root_with_callbacks_writing_local_files_is_refused(
    memory_root: str, capsys: pytest.CaptureFixture
) -> None:
    line = one_error_line("fit", [*TINY_RUN, *QUICK, f"--trainer.default_root_dir={memory_root}"], capsys)
    assert line.startswith(f"error: trainer.default_root_dir={memory_root}: timing.json, the confusion CSVs "), line
    assert "(--callbacks.timing=false --callbacks.evaluation=false)" in line, line


def test_checkpoint_io_writes_a_remote_url_through_fsspec_and_a_file_url_atomically(
    memory_root: str, tmp_path: Path
) -> None:
    checkpoint_io, checkpoint = AtomicCheckpointIO(), {"weights": torch.arange(3.0)}
    checkpoint_io.save_checkpoint(checkpoint, f"{memory_root}/a/last.ckpt")
    assert torch.equal(checkpoint_io.load_checkpoint(f"{memory_root}/a/last.ckpt")["weights"], torch.arange(3.0))
    checkpoint_io.save_checkpoint(checkpoint, f"file://{tmp_path}/b/last.ckpt")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["last.ckpt"]  # no partial file left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no "memory:" or "file:" folder here

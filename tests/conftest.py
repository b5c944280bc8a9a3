"""Shared fixtures: a tiny CIFAR-10 in the official on-disk format, built once per session, and the
command-line options that keep a run small. Every test writes its runs under its own tmp_path."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lightning.pytorch import Trainer

from project.data import BASE_FOLDER, META_FILE, TEST_FILE, TRAIN_FILES
from tests.support.fixtures import PALETTE, TINY_RUN
from tests.support.machines import two_machines  # noqa: F401 (a fixture of the multinode tests)

LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
TRAIN_PER_FILE = 40  # 5 files -> 200 training images
TEST_IMAGES = 60


def quiet_trainer(tmp_path: Path, **options: Any) -> Trainer:
    """A CPU Trainer for tests that drive Lightning directly, writing and printing nothing of its own (no
    logger, checkpoints, progress bar or model summary) outside ``tmp_path``; ``options`` on top."""
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return Trainer(accelerator="cpu", default_root_dir=tmp_path, **{**quiet, **options})


def learnable_images(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Images whose class shows (its colour of tests/support/fixtures.py's palette, under noise), as flat uint8 rows in
    the official channel-first layout (N, 3072): 1024 red values, then 1024 green, then 1024 blue."""
    colour_planes = np.repeat(PALETTE[labels], 1024, axis=1)  # (N, 3072), R plane then G then B
    noise = rng.integers(0, 256, (len(labels), 3072))
    return (0.75 * colour_planes + 0.25 * noise).astype(np.uint8)


def write_official_cifar10(root: Path, train_per_file: int = TRAIN_PER_FILE, test_images: int = TEST_IMAGES) -> Path:
    """Write ``root / cifar-10-batches-py`` exactly as the official archive lays it out: protocol-2
    pickles with byte-string keys, uint8 data of shape (N, 3072) and labels as a list of ints."""
    folder = root / BASE_FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)

    def dump(name: str, entry: dict) -> None:
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f, protocol=2)

    for i, (name, count) in enumerate([(n, train_per_file) for n in TRAIN_FILES] + [(TEST_FILE, test_images)]):
        labels = np.arange(count) % 10  # balanced classes
        rng.shuffle(labels)
        dump(
            name,
            {
                b"batch_label": f"batch {i}".encode(),
                b"labels": [int(v) for v in labels],
                b"data": learnable_images(labels, rng),
                b"filenames": [f"img_{i}_{j}.png".encode() for j in range(count)],
            },
        )
    dump(META_FILE, {b"label_names": [n.encode() for n in LABEL_NAMES], b"num_cases_per_batch": train_per_file})
    return folder


@pytest.fixture(scope="session")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data_dir holding a tiny official-format CIFAR-10 (200 train, 60 test images). Read-only."""
    root = tmp_path_factory.mktemp("cifar")
    write_official_cifar10(root)
    return root


@pytest.fixture(scope="session")
def cifar_archive(tmp_path_factory: pytest.TempPathFactory, cifar_root: Path) -> tuple[Path, str]:
    """The tiny data set packed like the official ``cifar-10-python.tar.gz``, and its md5."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(cifar_root / BASE_FOLDER, arcname=BASE_FOLDER)
    path = tmp_path_factory.mktemp("archive") / "cifar-10-python.tar.gz"
    path.write_bytes(buffer.getvalue())
    return path, hashlib.md5(buffer.getvalue()).hexdigest()


@pytest.fixture
def tiny_args(tmp_path: Path) -> list[str]:
    """CLI options for a run that takes seconds on a CPU: the tests' own data set (tests/support/fixtures.py,
    not the template's), 32 px, batch 20, no worker processes, every output under this test's tmp_path."""
    return [*TINY_RUN, "--trainer.devices=1", f"--trainer.default_root_dir={tmp_path}"]


@pytest.fixture(autouse=True, scope="session")
def _tests_importable_by_runs() -> None:
    """Runs started as processes (ddp ranks, bench cells) import the tests' data set by its dotted path
    ``tests.support.fixtures...`` from wherever they start: put the repository on their PYTHONPATH."""
    paths = [str(Path(__file__).resolve().parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


@pytest.fixture(autouse=True)
def _isolated_seed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """seed_everything writes PL_GLOBAL_SEED into the environment; keep tests from seeing each
    other's."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)

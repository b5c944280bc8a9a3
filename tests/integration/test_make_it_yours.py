"""The README's "Make it yours", done as a user would: its data set and network written into a folder
OUTSIDE the repository, put on PYTHONPATH and chosen only by ``--data=...`` and ``--model.arch=...``,
train and test under every strategy that runs on a CPU, and learn (far above chance).

- the README's code as it stands (a 1-channel data set, an ``nn.Sequential``): single device,
  ``ddp``, ``fsdp`` (sharded into 2 or more units) and ``pipeline`` (2 stages), 2 CPU processes;
- a network that is not an ``nn.Sequential``, with the hook that names its blocks: single and ``ddp``;
- its command exactly as written on 2,000 images (no size options: the declared shape sets the size, a tenth
  validates), and with a wrong ``--data.data_dir``: one line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
CLASSES = 4

# A network that is no nn.Sequential: two branches added, the hook in project/nets.py not needed for
# single device or ddp (only fsdp and pipeline split a network).
TWO_BRANCH = """
import torch
from torch import nn


class TwoBranch(nn.Module):
    def __init__(self, num_classes: int, in_channels: int) -> None:
        super().__init__()
        self.wide = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.narrow = nn.Conv2d(in_channels, 8, 1)
        self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, num_classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.wide(images) + self.narrow(images))


def two_branch(num_classes: int, in_channels: int) -> nn.Module:
    return TwoBranch(num_classes, in_channels)
"""


def readme_section() -> str:
    text = (REPO / "README.md").read_text()
    return text[text.index("## Make it yours") : text.index("\n## ", text.index("## Make it yours") + 3)]


def readme_code() -> tuple[str, str, list[str]]:
    """The README's Python file (its path, from its first comment) and the options of its command."""
    section = readme_section()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    path = re.match(r"# (\S+\.py)", code).group(1)
    command = re.search(r"```bash\n(.*?)```", section, re.S).group(1).split()
    assert command[:4] == ["python", "-m", "project", "fit"]
    return path, code, command[4:]


def easy_images(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """16 x 16 one-channel images whose class is their brightness (under noise): it survives the
    training augmentation's crops and flips."""
    labels = np.arange(count) % CLASSES
    levels = np.array([30, 95, 160, 225])[labels][:, None, None, None]
    images = np.clip(levels + rng.integers(-25, 26, (count, 16, 16, 1)), 0, 255).astype(np.uint8)
    return images, labels


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the repository with the README's package, the extra network and the data."""
    root = readme_project(tmp_path_factory.mktemp("outside"), train=192, test=64, seed=0)
    path, _, _ = readme_code()
    (root / path).parent.joinpath("__init__.py").write_text("")
    (root / path).parent.joinpath("branches.py").write_text(TWO_BRANCH)
    return root


def readme_project(root: Path, train: int, test: int, seed: int) -> Path:
    """``root`` with the README's python file at its path and ``my_data/{train,test}.npz`` of that many images."""
    path, code, _ = readme_code()
    (root / path).parent.mkdir(parents=True)
    (root / path).write_text(code)
    rng = np.random.default_rng(seed)
    (root / "my_data").mkdir()
    for name, count in (("train", train), ("test", test)):
        images, labels = easy_images(count, rng)
        np.savez(root / "my_data" / f"{name}.npz", images=images, labels=labels)
    return root


def run(outside: Path, command: str, options: list[str], runs: Path) -> str:
    """``python -m project COMMAND`` started in ``outside``, with it on PYTHONPATH; its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(outside), str(REPO)])}
    tiny = [
        "--data.image_size=16",
        "--data.batch_size=16",
        "--data.val_size=32",
        "--data.num_workers=0",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={runs}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "project", command, *options, *tiny],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def fit_and_test(outside: Path, options: list[str], runs: Path) -> tuple[float, dict]:
    """Train (6 epochs) and test the last checkpoint; the test accuracy and the fit's timing.json."""
    run(outside, "fit", [*options, "--trainer.max_epochs=6"], runs)
    run_dir = runs / "lightning_logs" / "version_0"
    timing = json.loads((run_dir / "timing.json").read_text())
    out = run(outside, "test", [*options, f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"], runs)
    accuracy = float(re.search(r"test/acc\D*?([01]\.\d+)", out).group(1))
    return accuracy, timing


STRATEGIES = {
    "single": ["--trainer.devices=1"],
    "ddp": ["--trainer.strategy=ddp", "--trainer.devices=2"],
    "fsdp": ["--trainer.strategy=fsdp", "--trainer.devices=2"],
    "pipeline": ["--trainer.strategy=pipeline", "--trainer.devices=2"],
}


def test_the_readme_section_is_short_and_names_the_two_options() -> None:
    section = readme_section()
    assert len(section.strip().splitlines()) <= 27  # heading, blank line and 25 lines
    _, _, options = readme_code()
    assert any(o.startswith("--data=") for o in options) and any(o.startswith("--model.arch=") for o in options)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_readme_data_set_and_network_train_and_test_under(outside: Path, tmp_path: Path, strategy: str) -> None:
    _, _, options = readme_code()
    accuracy, timing = fit_and_test(outside, [*options, *STRATEGIES[strategy]], tmp_path)
    assert accuracy >= 0.7, f"test/acc {accuracy} (chance is {1 / CLASSES})"
    plan = timing.get("parallel_plan")
    if strategy == "fsdp":
        assert len(plan["units"]) >= 2, plan
    if strategy == "pipeline":
        assert len(plan["stages"]) == 2, plan


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_a_network_that_is_no_sequential_trains_and_tests_under(outside: Path, tmp_path: Path, strategy: str) -> None:
    _, _, options = readme_code()
    options = [o for o in options if not o.startswith("--model.arch=")] + [
        "--model.arch=my_project.branches.two_branch"
    ]
    accuracy, _ = fit_and_test(outside, [*options, *STRATEGIES[strategy]], tmp_path)
    assert accuracy >= 0.7, f"test/acc {accuracy} (chance is {1 / CLASSES})"


@pytest.fixture(scope="module")
def two_thousand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's package beside ``my_data/`` of 2,000 training images: the command as written needs no size."""
    return readme_project(tmp_path_factory.mktemp("two_thousand"), train=2000, test=200, seed=1)


def as_written(root: Path, options: list[str]) -> subprocess.CompletedProcess:
    """``python -m project fit OPTIONS`` in ``root``, nothing added but a quiet progress bar."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    command = [sys.executable, "-m", "project", "fit", *options, "--trainer.enable_progress_bar=false"]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_readme_command_runs_as_written_on_2000_images(two_thousand: Path) -> None:
    _, _, options = readme_code()
    done = as_written(two_thousand, options)
    assert done.returncode == 0, done.stderr[-3000:]
    timing = json.loads((two_thousand / "lightning_logs/version_0/timing.json").read_text())
    assert timing["image_size"] == 16  # the declared image_shape's, not CIFAR-10's 112
    assert "the statistics of its 1800 training images" in done.stderr  # a tenth held out for validation
    accuracy = float(re.search(r"val/acc\D*?([01]\.\d+)", done.stdout.split("final metrics")[1]).group(1))
    assert accuracy >= 0.7, f"val/acc {accuracy} (chance is {1 / CLASSES})"


@pytest.mark.slow
def test_a_wrong_data_dir_under_the_readme_example_is_one_line(two_thousand: Path) -> None:
    _, _, options = readme_code()
    done = as_written(two_thousand, [o.split("=")[0] + "=not_there" if "data_dir" in o else o for o in options])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: Shapes.load_split(train=True) failed with data.data_dir=not_there: FileNotFoundError: [Errno 2] "
        "No such file or directory: 'not_there/train.npz'"
    )

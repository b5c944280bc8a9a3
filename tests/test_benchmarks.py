"""The performance benchmarks under ``benchmarks/`` (``make bench-perf`` runs them, for minutes):
that they import and start as modules from the repository root without any PYTHONPATH, that the
children they launch can find what they name, and that the callback stamping the template's
steps records them."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from project.toolkit.measure.stamps import StepStamps

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["benchmarks.overhead", "benchmarks.inference", "benchmarks.input"]


def without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.parametrize("name", ["benchmarks._common", "benchmarks.plain", *SCRIPTS])
def test_every_benchmark_module_imports(name: str) -> None:
    module = importlib.import_module(name)
    assert Path(module.__file__).parent == REPO / "benchmarks"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_benchmark_has_its_options(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(name).main(["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m {name} ")


def test_a_benchmark_starts_as_a_module_from_the_repository_root_without_pythonpath() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.overhead", "--help"],
        cwd=REPO,
        env=without_pythonpath(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: python -m benchmarks.overhead ") and "--options" in result.stdout


def test_the_children_are_started_in_the_repository_root_by_names_that_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import _common

    launched: list[tuple[list[str], dict]] = []

    def fake_run(command: list[str], **options: object) -> subprocess.CompletedProcess:
        launched.append((command, options))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(_common.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    out = tmp_path / "plain" / "plain.json"
    out.parent.mkdir()
    out.write_text("[{}]")
    _common.plain_fit_run(_common.Setup(), out, threads=1)
    folder = tmp_path / "template"
    (folder / "lightning_logs" / "version_0").mkdir(parents=True)
    (folder / "lightning_logs" / "version_0" / "timing.json").write_text("{}")
    (folder / "clock.json").write_text("{}")
    assert _common.template("fit", _common.Setup(), folder, threads=0) == {"clock": {}}

    (plain, plain_options), (template, template_options) = launched
    assert plain[1:4] == ["-m", "benchmarks.plain", "fit"]
    assert template[1:4] == ["-m", "project", "fit"]
    for options in (plain_options, template_options):
        assert options["cwd"] == REPO  # where -m finds this checkout's project and benchmarks
        assert options["env"]["PYTHONPATH"] == "/somewhere"  # the caller's, untouched
    assert plain_options["env"]["OMP_NUM_THREADS"] == "1"
    callback = next(a.split("=", 1)[1] for a in template if a.startswith("--trainer.callbacks+="))
    module, _, name = callback.rpartition(".")
    assert getattr(importlib.import_module(module), name) is StepStamps


class Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3 * 4 * 4, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.flatten(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("loss", F.cross_entropy(self(batch[0]), batch[1]))

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0]).argmax(1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_step_stamps_record_every_step_of_fit_test_and_predict(tmp_path: Path) -> None:
    data = TensorDataset(torch.randn(20, 3, 4, 4), torch.randint(0, 10, (20,)))
    loader = DataLoader(data, batch_size=5)
    path = tmp_path / "stamps" / "clock.json"
    stamps = StepStamps(str(path))
    options = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    trainer = Trainer(fast_dev_run=3, callbacks=[stamps], default_root_dir=tmp_path, **options)
    model = Tiny()
    trainer.fit(model, loader)
    written = json.loads(path.read_text())
    (start,), (ends,) = written["epoch_starts"], written["train_batch_ends"]
    assert len(ends) == 3 and start <= ends[0] <= ends[1] <= ends[2] <= written["train_end"]

    trainer.test(model, loader, verbose=False)
    trainer.predict(model, loader)
    batches = json.loads(path.read_text())["eval_batches"]
    assert len(batches) == 6  # three of test, then three of predict
    assert all(start <= end and images == 5 for start, end, images in batches)
    assert all(a[1] <= b[0] for a, b in zip(batches, batches[1:], strict=False))  # one after the other


@pytest.mark.slow
def test_both_sides_run_in_fresh_processes_without_pythonpath(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from benchmarks import _common

    monkeypatch.delenv("PYTHONPATH", raising=False)
    setup = _common.Setup(image_size=32, batch_size=4, test_batches=3)
    (plain,) = _common.plain_infer_run([(setup, 4, False)], tmp_path / "plain" / "plain.json", threads=1)
    assert len(plain["clock"]["eval_batches"]) == 3
    template = _common.template("test", setup, tmp_path / "template", threads=1)
    assert len(template["clock"]["eval_batches"]) == 3 and template["test_samples_per_second"] > 0

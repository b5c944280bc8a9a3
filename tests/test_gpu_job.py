"""``python -m benchmarks.gpu_job``: its answer without a GPU, and its report from stand-in runs.

The runs themselves need a CUDA GPU; here each command is replaced by one that writes a ``timing.json`` as
the template's fit does, so the bookkeeping (the figures read, the report, earlier runs kept) is what runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import benchmarks.gpu_job as gpu_job

TIMING = {
    "input_path": "on_device",
    "num_workers": 0,
    "epochs": [{"seconds": 8.0}, {"seconds": 3.0}, {"seconds": 3.0}],
    "first_epoch_seconds": 8.0,
    "epoch_seconds_mean": 3.0,
    "train_samples_per_second": 15000.0,
    "mfu": 0.015,
    "data_wait_fraction": 0.13,
    "peak_memory_mb": [6038.0],
    "step_anatomy": {"ranks": [{"step_seconds": 0.02, "data_wait": 0.001, "compute": 0.018, "optimizer": 0.001}]},
}


PROFILE = {"step_seconds": 0.02, "device_idle_fraction": 0.25, "launches": 450.0, "host_syncs": 1.0}


def stand_in(monkeypatch: pytest.MonkeyPatch, codes: dict[str, int]) -> list[list[str]]:
    """Replace the GPU and the commands: a run exits with ``codes[its folder]`` (0 by default) and, when 0,
    leaves ``TIMING`` and ``PROFILE`` where the template's fit leaves its ``timing.json`` and the step profile."""
    commands: list[list[str]] = []

    def run_logged(command: list[str], log: Path, timeout_s: float) -> tuple[int | None, str, float]:
        commands.append(command)
        code = codes.get(log.parent.name, 0)
        if code == 0:
            run = log.parent / "lightning_logs" / "version_0"
            run.mkdir(parents=True)
            (run / "timing.json").write_text(json.dumps(TIMING))
            (run / "step_profile.json").write_text(json.dumps(PROFILE))
        return code, "RuntimeError: boom\n" if code else "", 12.0

    monkeypatch.setattr(gpu_job, "no_gpu_line", lambda tool: None)
    monkeypatch.setattr(gpu_job, "run_logged", run_logged)
    monkeypatch.setattr("project.toolkit.measure.environment.run_environment", lambda: {"device_name": "H100"})
    return commands


def rows(out: Path) -> list[str]:
    return [line for line in (out / "gpu-job.md").read_text().splitlines() if line.startswith(("| mobile", "| resn"))]


def test_without_a_gpu_one_line_and_nothing_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_job, "run_logged", lambda *a: pytest.fail("ran without a GPU"))
    assert gpu_job.main(["--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.startswith("gpu-job: no CUDA GPU here")
    assert list(tmp_path.iterdir()) == []


def test_every_run_on_the_default_config_with_its_figures(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    commands = stand_in(monkeypatch, {})
    assert gpu_job.main(["--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs"), "--profile"]) == 0
    assert len(commands) == len(gpu_job.runs(3)) == 7
    assert all("--config=configs/default.yaml" in c and "--data.synthetic_size=50000" in c for c in commands)
    assert sum("--data.on_device=false" in c for c in commands) == 2
    assert sum("--trainer.precision=bf16-mixed" in c for c in commands) == 4
    assert sum("--trainer.max_epochs=3" in c for c in commands) == 3  # ResNet50's
    assert [c for c in commands if "--model.compile=true" in c] == [commands[-1]]  # ResNet50 bf16, compiled
    first = rows(tmp_path / "out")[0]
    cells = [cell.strip() for cell in first.split("|")[1:-1]]
    # result, input, epoch 1 s, steady s/epoch, training s (all epochs), img/s, MFU %, data wait %, peak MiB
    assert cells[1:10] == ["pass", "on_device (0 workers)", "8.00", "3.00", "14.0", "15000", "1.5", "13.0", "6038"]
    assert cells[10] == "data 5% · compute 90% · optimizer 5%"
    assert cells[11] == "step 20.0 ms: device busy 75 % (idle 25 %), 450 launches, 1.0 host syncs"
    assert all("--trainer.callbacks+=project.toolkit.measure.step_profile.StepProfile" in c for c in commands)


def test_a_failed_run_is_reported_and_earlier_runs_are_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out, runs = tmp_path / "out", tmp_path / "runs"
    stand_in(monkeypatch, {})
    assert gpu_job.main(["--out", str(out), "--runs", str(runs), "--only", "0,1"]) == 0
    failing: dict[str, Any] = {"resnet50-bf16-mixed-default-input": 1}
    commands = stand_in(monkeypatch, failing)
    assert gpu_job.main(["--out", str(out), "--runs", str(runs / "again"), "--only", "1", "--max-epochs", "2"]) == 1
    assert not any("StepProfile" in arg for arg in commands[0])  # no profile without --profile
    assert commands[0][-1] == "--trainer.max_epochs=2"  # after the run's own --trainer.max_epochs=3
    saved = json.loads((out / "gpu-job.json").read_text())["runs"]
    assert [(r["name"], r["code"]) for r in saved] == [
        ("mobilenet_v2 bf16-mixed, default input", 0),
        ("resnet50 bf16-mixed, default input", 1),
    ]
    text = (out / "gpu-job.md").read_text()
    assert "**FAIL** (1)" in rows(out)[1] and "### resnet50 bf16-mixed, default input: exit 1" in text
    assert "RuntimeError: boom" in text

"""``python -m benchmarks.gpu_check``: its answer on a machine without a GPU, its report, and its checks.

The GPU paths themselves need a CUDA GPU. Here: the one-line exit without one (through a real process and
through ``main``), the report from made-up results, the bookkeeping with the commands replaced by stand-ins,
and (slow) the checks of the single-device paths against real runs of the template on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

import benchmarks.gpu_check as gpu_check
import benchmarks.gpu_check_paths as gpu_check_paths
from benchmarks.gpu_check import REPO, main, no_gpu_line, run_all, run_path, select, write_report

NO_GPU = re.compile(r"gpu-check: no CUDA GPU here \(torch \S+, CUDA build: (yes|no)\); nothing to check")


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


# --------------------------------------------------------------------------- no GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the check would run")
def test_no_gpu_one_line_from_a_real_process(tmp_path: Path) -> None:
    before = _listing(REPO / "benchmarks" / "results")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and NO_GPU.fullmatch(lines[0]), done.stdout
    assert not (tmp_path / "out").exists()
    assert _listing(REPO / "benchmarks" / "results") == before


def test_no_gpu_one_line_from_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check, "run_all", lambda *a: pytest.fail("ran a check without a GPU"))
    assert main(["--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert NO_GPU.fullmatch(out.strip()) and out.count("\n") == 1
    assert build_word(out) == ("yes" if torch.version.cuda else "no")
    assert list(tmp_path.iterdir()) == []


def build_word(line: str) -> str:
    return line.split("CUDA build: ")[1].split(")")[0]


def test_no_gpu_line_only_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert no_gpu_line() is None


# --------------------------------------------------------------------------- choosing paths


def test_every_path_by_default_in_running_order() -> None:
    names = select(None)
    assert names[0] == "single-fp32" and names[-1] == "nan-guard"
    assert names.index("single-fp32") < names.index("test-last") < names.index("resume")
    assert {"bf16-mixed", "compile", "on-device", "ddp-1", "fsdp-1", "dp-1", "deepspeed-stage-2", "nan-guard"} <= set(
        names
    )


def test_a_subset_brings_the_path_it_continues() -> None:
    assert select(["resume", "dp-1"]) == ["single-fp32", "dp-1", "resume"]


def test_an_unknown_path_is_named() -> None:
    with pytest.raises(SystemExit, match=r"unknown path\(s\) nope; choose from single-fp32, "):
        select(["nope"])


# --------------------------------------------------------------------------- running, with stand-ins


def fake_runs(monkeypatch: pytest.MonkeyPatch, outcomes: list[tuple[int | None, str, float]]) -> list[list[str]]:
    """Replace the commands: each call takes the next ``(exit status, output, wall seconds)``."""
    commands: list[list[str]] = []

    def run_logged(command: list[str], log: Path, timeout_s: float) -> tuple[int | None, str, float]:
        commands.append(command)
        return outcomes[len(commands) - 1]

    monkeypatch.setattr(gpu_check, "run_logged", run_logged)
    return commands


def path(name: str) -> gpu_check.CheckPath:
    return next(p for p in gpu_check.check_paths() if p.name == name)


def test_a_failing_command_keeps_its_last_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    output = "\n".join(f"line {i}" for i in range(20)) + "\n\nRuntimeError: CUDA error: out of memory\n"
    commands = fake_runs(monkeypatch, [(1, output, 3.0)])
    result = run_path(path("bf16-mixed"), tmp_path, timeout_s=60)
    assert result["status"] == "fail" and result["reason"] == "fit: exit status 1"
    assert result["error_lines"] == [*(f"line {i}" for i in range(13, 20)), "RuntimeError: CUDA error: out of memory"]
    assert commands[0][1:4] == ["-m", "project", "fit"] and "--trainer.precision=bf16-mixed" in commands[0]
    assert "--trainer.accelerator=gpu" in commands[0] and "--data.synthetic=true" in commands[0]
    assert f"--trainer.default_root_dir={tmp_path}" in commands[0]


def test_a_fit_that_writes_nothing_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_runs(monkeypatch, [(0, "done\n", 3.0)])
    result = run_path(path("single-fp32"), tmp_path, timeout_s=60)
    assert result["status"] == "fail" and "no lightning_logs/version_*/checkpoints/last.ckpt" in result["reason"]


def test_a_refusal_that_does_not_come_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_runs(monkeypatch, [(0, "trained\n", 3.0)])
    result = run_path(path("nan-guard"), tmp_path, timeout_s=60)
    assert result["status"] == "fail" and "must stop with an error" in result["reason"]


def test_the_nan_guard_passes_when_it_stops_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_runs(monkeypatch, [(2, "error: training loss is nan at step 2 (epoch 0); stopped, ...\n", 3.0)])
    assert run_path(path("nan-guard"), tmp_path, timeout_s=60)["status"] == "pass"


def test_a_timeout_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_runs(monkeypatch, [(None, "step 1\n", 600.0)])
    assert run_path(path("compile"), tmp_path, timeout_s=600)["reason"] == "fit: timed out after 10 min"


def test_an_evaluation_table_or_an_export_that_is_missing_fails(tmp_path: Path) -> None:
    run = tmp_path / "lightning_logs" / "version_3"
    run.mkdir(parents=True)
    table, exported = gpu_check_paths.wrote_in_run("confusion_val.csv"), gpu_check_paths.wrote_file("model.pt2")
    assert table(tmp_path, "") == f"no confusion_val.csv in {run}"
    assert exported(tmp_path, "") == f"no {tmp_path / 'model.pt2'}"
    (run / "confusion_val.csv").write_text("true \\ predicted,a,b\n")
    (tmp_path / "model.pt2").write_bytes(b"PK")
    assert table(tmp_path, "") is None and exported(tmp_path, "") is None


def test_deepspeed_is_skipped_without_its_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: None)
    commands = fake_runs(monkeypatch, [])
    result = run_path(path("deepspeed-stage-2"), tmp_path, timeout_s=60)
    assert result["status"] == "skip" and "pip install -e '.[deepspeed]'" in result["reason"]
    assert commands == []


def test_a_path_after_a_failed_one_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_runs(monkeypatch, [(1, "boom\n", 1.0)])
    args = argparse.Namespace(timeout_minutes=1.0, jobs=2)
    results = run_all(["single-fp32", "test-last"], tmp_path, args)
    assert [r["status"] for r in results] == ["fail", "skip"]
    assert results[1]["reason"] == "needs single-fp32, which did not pass"


# --------------------------------------------------------------------------- the report


ENVIRONMENT = {
    "device_name": "NVIDIA H100 80GB HBM3",
    "device_count": 1,
    "cuda": "12.8",
    "torch": "2.8.0",
    "git_commit": "abc123",
    "git_dirty": False,
}


def made_up_results() -> list[dict]:
    return [
        {
            "name": "single-fp32",
            "what": "one device, 32-true",
            "status": "pass",
            "reason": None,
            "seconds": 31.0,
            "commands": ["python -m project fit ..."],
            "figures": {"epoch_seconds_mean": 1.234, "train_samples_per_second": 4321.0, "mfu": 0.123,
                        "peak_memory_mb": 2048.0},
        },
        {
            "name": "compile",
            "what": "torch.compile",
            "status": "fail",
            "reason": "fit: exit status 1",
            "seconds": 12.0,
            "commands": ["python -m project fit --model.compile=true"],
            "figures": {},
            "error_lines": ["Traceback (most recent call last):", "torch._dynamo.exc.BackendCompilerFailed: a | b"],
        },
        {
            "name": "deepspeed-stage-2",
            "what": "DeepSpeed ZeRO-2",
            "status": "skip",
            "reason": "the deepspeed package is not installed (pip install -e '.[deepspeed]')",
            "commands": [],
            "figures": {},
        },
    ]  # fmt: skip


def test_the_report(tmp_path: Path) -> None:
    markdown, raw = write_report(made_up_results(), ENVIRONMENT, tmp_path / "out", "python -m benchmarks.gpu_check")
    text = markdown.read_text()
    assert text.startswith("# GPU check\n")
    assert "1 passed, 1 failed, 1 skipped" in text
    environment = text.split("## Environment")[1].split("## Paths")[0]
    assert "| device_name | `NVIDIA H100 80GB HBM3` |" in environment and "| git_commit | `abc123` |" in environment
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    single = next(r for r in rows if r.startswith("| `single-fp32`"))
    assert "| pass |" in single and "| 1.23 |" in single and "| 4321 |" in single and "| 12.3 |" in single
    assert "| 2048 |" in single
    assert "**FAIL**: fit: exit status 1" in next(r for r in rows if r.startswith("| `compile`"))
    assert "skip: the deepspeed package is not installed" in next(r for r in rows if "deepspeed" in r)
    failures = text.split("## Failures")[1]
    assert "### `compile`: fit: exit status 1" in failures
    assert "`python -m project fit --model.compile=true`" in failures
    assert "torch._dynamo.exc.BackendCompilerFailed: a | b" in failures  # as printed, inside a code block
    saved = json.loads(raw.read_text())
    assert saved["environment"] == ENVIRONMENT and saved["results"] == made_up_results()


def test_a_report_without_failures(tmp_path: Path) -> None:
    markdown, _ = write_report(made_up_results()[:1], ENVIRONMENT, tmp_path, "cmd")
    text = markdown.read_text()
    assert "## Failures" not in text


# --------------------------------------------------------------------------- the checks, against real runs


@pytest.mark.slow
def test_the_checks_hold_for_real_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The single-device paths' commands, as the GPU check runs them but on the CPU at 32 px: the files and
    lines its checks look for are those the template writes (timing.json keys, last.ckpt, predictions.csv,
    Lightning's restore line and the resumed step, DataParallel's single-device line, the NaN guard's line, the
    evaluation's tables, the exported file), and the options of this round's paths (EMA, MixUp/CutMix on both
    input paths, the augmentations, a folder of JPEGs) are the template's."""
    common, data = gpu_check.common_args, gpu_check.data_args

    def on_the_cpu(root: Path, batches: int = 4, batch_size: int = 16) -> list[str]:
        return [*(a for a in common(root, batches, batch_size) if "accelerator" not in a), "--trainer.accelerator=cpu"]

    def small_data(kind: str, root: Path, batches: int = 4, batch_size: int = 16) -> list[str]:
        if kind == "folder":
            return [*data(kind, root), "--data.image_size=32", "--data.num_workers=1"]
        return ["--data.synthetic=true", "--data.synthetic_size=128", "--data.val_size=32", "--data.image_size=32"] + [
            f"--data.batch_size={batch_size}",
            "--data.num_workers=0",
        ]

    monkeypatch.setattr(gpu_check, "common_args", on_the_cpu)
    monkeypatch.setattr(gpu_check, "data_args", small_data)
    paths = gpu_check.check_paths(batches=4)
    monkeypatch.setattr(gpu_check, "check_paths", lambda batches=4: paths)
    args = argparse.Namespace(timeout_minutes=5.0, jobs=2)
    names = ["single-fp32", "test-last", "predict-last", "resume", "nan-guard", "dp-1", "ema", "mixup-cutmix"]
    results = run_all([*names, "augmentation", "folder"], tmp_path, args)
    assert {r["name"]: (r["status"], r["reason"]) for r in results} == {r["name"]: ("pass", None) for r in results}, [
        r.get("error_lines") for r in results
    ]
    assert results[0]["figures"]["train_samples_per_second"] > 0
    exported = torch.export.load(tmp_path / "folder" / "model.pt2")
    logits = exported.module()(torch.randint(0, 256, (2, 3, 40, 56), dtype=torch.uint8))
    assert logits.shape == (2, 2)


def test_the_folder_is_photos_of_two_kinds_written_once(tmp_path: Path) -> None:
    folder = gpu_check.write_folder(tmp_path)
    files = sorted(folder.rglob("*.jpg"))
    assert len(files) == 2 * sum(gpu_check_paths.FOLDER_SPLITS.values())
    with Image.open(files[0]) as first:
        assert first.format == "JPEG" and first.size == gpu_check_paths.FOLDER_SHAPES[0]
    stamp = files[0].stat().st_mtime_ns
    assert gpu_check.write_folder(tmp_path) == folder and files[0].stat().st_mtime_ns == stamp

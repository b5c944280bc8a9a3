"""``python -m project compare RUN_DIR... --out DIR``: finished runs' timing.json files into the
bench's three result files, and one ``error:`` line for a bad folder. (A compare of real run folders
is in tests/integration/test_views.py, after its fit and test.)"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib.image
import pytest

from project.__main__ import main
from project.toolkit.errors import ProjectError
from project.tools.bench.compare import cell_names, timing_files
from project.tools.bench.compare import compare as compare_runs

ENVIRONMENT = {"device_name": "cpu", "torch": "2.8.0", "hostname": "node1"}


def timing(strategy: str, devices: int, epoch_seconds: float, **extra: object) -> dict[str, object]:
    """A timing.json as fit and test write it (the keys the result files read)."""
    return {
        "strategy": strategy,
        "accelerator": "cpu",
        "devices": devices,
        "world_size": devices,
        "arch": "mobilenet_v2",
        "image_size": 32,
        "batch_size": 32,
        "precision": "32-true",
        "epoch_seconds_mean": epoch_seconds,
        "epoch_seconds_std": 0.01,
        "train_samples_per_second": 640 / epoch_seconds,
        "peak_memory_mb": [800.0] * devices,
        "peak_memory_devices": [f"rank{i}" for i in range(devices)],
        "test_batch_latency_ms": {"mean": 12.0, "std": 1.0, "p50": 11.5, "p90": 13.0, "p99": 14.0},
        "test_samples_per_second": 2000.0,
        "environment": ENVIRONMENT,
        **extra,
    }


def write_run(folder: Path, record: object) -> Path:
    folder.mkdir(parents=True)
    (folder / "timing.json").write_text(json.dumps(record))
    return folder


def compare(*args: str) -> int | str | None:
    """``python -m project compare ARGS``' exit status."""
    try:
        main(["compare", *args])
    except SystemExit as exit_info:
        return exit_info.code
    return 0


def test_two_run_folders_become_the_three_result_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "lightning_logs"
    single = write_run(runs / "version_0", timing("single_device", 1, 2.0))
    ddp = write_run(runs / "version_1", timing("ddp", 2, 1.0))
    out = tmp_path / "compared"
    assert compare(str(single), str(ddp), "--out", str(out)) == 0
    assert f"compare: 2 runs; results in {out}/results.{{csv,md,png}}" in capsys.readouterr().out

    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["cell"], r["bench_strategy"], r["devices"]) for r in rows] == [
        ("version_0", "single", "1"),
        ("version_1", "ddp", "2"),
    ]
    assert rows[1]["test_batch_latency_ms_p50"] == "11.5" and rows[1]["environment_hostname"] == "node1"
    text = (out / "results.md").read_text()
    assert text.startswith("# Run comparison") and "python -m project compare" in text
    assert "| `version_0` | single | mobilenet_v2 | 32 | 1 | 32-true |" in text
    assert "| 1.00x |" in text and "| 2.00x |" in text  # ddp against the single-device run
    assert "| `version_1` | rank0 800, rank1 800 |" in text
    assert matplotlib.image.imread(out / "results.png").std() > 0

    # a folder without a timing.json of its own stands for the run folders below it
    assert [path.parent.name for path in timing_files([str(runs)])] == ["version_0", "version_1"]
    assert cell_names([runs / "a" / "version_0", runs / "b" / "version_0"]) == ["a/version_0", "b/version_0"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: tmp / "missing", "compare: RUN_DIR {run} does not exist; give run folders"),
        (lambda tmp: write_run(tmp / "r", {}) / "timing.json", "compare: RUN_DIR {run} is a file"),
        (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "compare: no timing.json in {run} nor below it"),
        (
            lambda tmp: write_run(tmp / "bad", {}).joinpath("timing.json").write_text("{") and tmp / "bad",
            "is not a readable JSON file",
        ),
        (lambda tmp: write_run(tmp / "list", [1, 2]), "holds no timing record"),
    ],
    ids=["missing", "file", "no-timing", "bad-json", "not-an-object"],
)
def test_a_bad_run_folder_is_refused_naming_it(tmp_path: Path, make, message: str) -> None:
    run = make(tmp_path)
    good = write_run(tmp_path / "good", timing("single_device", 1, 2.0))
    with pytest.raises(ProjectError) as error:
        compare_runs([str(good), str(run)], tmp_path / "out", "python -m project compare")
    assert message.format(run=run) in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_on_the_command_line_a_bad_run_folder_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert compare(str(tmp_path / "missing"), "--out", str(tmp_path / "out")) == 2
    missing = tmp_path / "missing"
    expected = f"error: compare: RUN_DIR {missing} does not exist; give run folders, e.g. lightning_logs/version_0\n"
    assert capsys.readouterr().err == expected


def test_out_must_be_a_folder_and_a_run_folder_is_required(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = write_run(tmp_path / "good", timing("single_device", 1, 2.0))
    (tmp_path / "out").write_text("")
    with pytest.raises(ProjectError, match="compare --out .*out: is a file"):
        compare_runs([str(good)], tmp_path / "out", "python -m project compare")
    assert compare("--out", str(tmp_path / "x")) == 2
    assert capsys.readouterr().err == (
        "error: the following arguments are required: RUN_DIR (see python -m project compare --help)\n"
    )

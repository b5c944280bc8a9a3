"""``python -m project bench``: the matrix file, the cells' commands, failure and resumption, the
three result files -- and the CPU smoke preset, end to end."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot
import pytest
import yaml

from project.tools import bench
from project.tools.bench import BenchConfig, Cell, cell_args, expand

REPO = Path(__file__).resolve().parents[2]

# A cell that trains in seconds on a CPU: synthetic data, 32 px, two epochs of three batches.
TINY = {
    "archs": ["mobilenet_v2"],
    "batch_sizes": [20],
    "devices": [2],
    "accelerator": "cpu",
    "epochs": 2,
    "image_size": 32,
    "limit_train_batches": 3,
    "limit_val_batches": 2,
    "limit_test_batches": 4,
    "args": [
        "--data.synthetic=true",
        "--data.synthetic_size=200",
        "--data.val_size=40",
        "--data.num_workers=0",
        "--trainer.enable_model_summary=false",
        "--timing.warmup_iterations=1",
    ],
}


def write_config(path: Path, settings: object) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize(
    "settings, message",
    [
        ({**TINY, "strategies": ["ddp"], "epoch": 3}, "unknown key(s) epoch; allowed: strategies, archs"),
        ({k: v for k, v in TINY.items() if k != "archs"} | {"strategies": ["ddp"]}, "missing key(s) archs"),
        ({**TINY, "strategies": ["ddp"], "limit_val_batches": 1}, "limit_val_batches=1 is not allowed"),
        ({**TINY, "strategies": ["ddp"], "batch_sizes": [0]}, "batch_sizes=[0] is not allowed"),
        ({**TINY, "strategies": "ddp"}, "strategies='ddp' is not allowed: it must be a non-empty list"),
        ({**TINY, "strategies": ["ddp"], "variants": {"on_device": "--x"}}, "variants={'on_device': '--x'} is not"),
        ({**TINY, "strategies": ["ddp"], "variants": ["--x"]}, "variants=['--x'] is not allowed: it must be a non"),
        ({**TINY, "strategies": ["ddp"], "variants": {"a/b": []}}, "variants={'a/b': []} is not allowed"),
        (["single", "ddp"], "expected a mapping of settings, found list"),
    ],
)
def test_a_bad_matrix_file_is_one_line(tmp_path: Path, capsys, settings: object, message: str) -> None:
    config = write_config(tmp_path / "bench.yaml", settings)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--config", str(config), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: bench --config {config}: {message}")
    assert not (tmp_path / "out").exists()


def test_a_missing_matrix_file_is_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--config", str(tmp_path / "nowhere.yaml"), "--out", str(tmp_path / "out")])
    presets = "cpu-learn, cpu-smoke, gpu1, seed"
    line = f"error: bench --config {tmp_path / 'nowhere.yaml'}: no such file, nor a preset ({presets})"
    assert capsys.readouterr().err.strip() == line


def test_the_presets_are_valid_matrices() -> None:
    seed = expand(bench.load_config(bench.config_path("seed")))
    pipelines = {"pipeline-mb1", "pipeline-mb4", "pipeline-mb8"}  # model parallel, then pipelined
    assert {c.strategy for c in seed} == {"single", "dp", "ddp", "fsdp", "deepspeed_stage_2", *pipelines}
    assert {c.arch for c in seed if c.strategy in pipelines} == {"resnet50"}
    assert {c.arch for c in seed} == {"mobilenet_v2", "resnet50"} and {c.batch_size for c in seed} == {256, 512}
    gpu1 = expand(bench.load_config(bench.config_path("gpu1")))
    assert {c.devices for c in gpu1} == {1} and {c.precision for c in gpu1} == {"bf16-mixed"}
    assert {c.strategy for c in gpu1} == {"single", "ddp", "fsdp", "deepspeed_stage_2"}
    smoke = expand(bench.load_config(bench.config_path("cpu-smoke")))
    assert {(c.strategy, c.devices) for c in smoke} == {("single", 1), ("ddp", 2), ("fsdp", 2), ("pipeline-mb4", 2)}
    assert [c.name for c in smoke if c.strategy.startswith("pipeline")] == ["pipeline-mb4-resnet50-b32-x2-32-true"]


def test_every_cell_is_its_own_run_with_its_settings(tmp_path: Path) -> None:
    config = BenchConfig(
        strategies=["single", "ddp", "fsdp"],
        archs=["mobilenet_v2", "resnet50"],
        batch_sizes=[256, 512],
        devices=[2, 4],
        precision=["32-true"],
        args=["--data.synthetic=true"],
    )
    cells = expand(config)
    assert len(cells) == 2 * 2 * (1 + 2 * 2)  # single runs on one device only
    assert {c.devices for c in cells if c.strategy == "single"} == {1}
    assert len({c.name for c in cells}) == len(cells)

    ddp = Cell("ddp", "resnet50", 512, 4, "32-true")
    args = cell_args(config, ddp, tmp_path)
    assert {"--trainer.strategy=ddp", "--trainer.devices=4", "--model.arch=resnet50", "--data.batch_size=512"} <= set(
        args
    )
    # its own TensorBoard run, the same one for fit and test
    assert f"--trainer.default_root_dir={tmp_path / ddp.name}" in args
    assert f"--trainer.logger.init_args.save_dir={tmp_path / ddp.name}" in args
    assert "--trainer.logger.init_args.version=0" in args
    assert args[-1] == "--data.synthetic=true"  # the preset's own options come last, so they win
    single = cell_args(config, Cell("single", "resnet50", 512, 1, "32-true"), tmp_path)
    assert "--trainer.strategy=auto" in single and "--trainer.devices=1" in single


def test_variants_are_one_more_dimension_of_the_matrix(tmp_path: Path) -> None:
    variants = {"loader": [], "on_device": ["--data.on_device=true"]}
    config = bench.load_config(
        write_config(tmp_path / "bench.yaml", {**TINY, "strategies": ["single", "ddp"], "variants": variants})
    )
    cells = expand(config)
    assert [c.name for c in cells] == [
        "single-mobilenet_v2-b20-x1-32-true-loader",
        "ddp-mobilenet_v2-b20-x2-32-true-loader",
        "single-mobilenet_v2-b20-x1-32-true-on_device",
        "ddp-mobilenet_v2-b20-x2-32-true-on_device",
    ]
    # a variant's options come after the shared ones
    assert cell_args(config, cells[1], tmp_path)[-len(TINY["args"]) :] == TINY["args"]
    assert cell_args(config, cells[3], tmp_path)[-len(TINY["args"]) - 1 :] == [*TINY["args"], "--data.on_device=true"]

    # one variant: its options apply, the names stay as without variants
    one = bench.load_config(
        write_config(tmp_path / "one.yaml", {**TINY, "strategies": ["ddp"], "variants": {"on_device": ["--x=1"]}})
    )
    (cell,) = expand(one)
    assert cell.name == "ddp-mobilenet_v2-b20-x2-32-true" and cell_args(one, cell, tmp_path)[-1] == "--x=1"
    # none: a single unnamed variant without options
    plain = bench.load_config(write_config(tmp_path / "plain.yaml", {**TINY, "strategies": ["ddp"]}))
    assert [(c.variant, c.name) for c in expand(plain)] == [("", cell.name)]
    assert cell_args(plain, cell, tmp_path)[-len(TINY["args"]) :] == TINY["args"]


def test_a_variant_is_compared_with_the_single_device_cell_of_the_same_variant(tmp_path: Path) -> None:
    config = BenchConfig(
        strategies=["single", "ddp"],
        archs=["resnet50"],
        batch_sizes=[256],
        devices=[2],
        variants={"loader": [], "on_device": ["--data.on_device=true"]},
    )
    rows = bench.collect(expand(config), tmp_path)  # nothing ran: "not run" rows of the four cells
    assert [r["variant"] for r in rows] == ["loader", "loader", "on_device", "on_device"]
    for row, seconds in zip(rows, [4.0, 2.0, 2.0, 1.6], strict=True):
        row.update(status="ok", epoch_seconds_mean=seconds)
    assert bench.speedups(rows) == [1.0, 2.0, 1.0, 1.25]

    bench.write_markdown(rows, tmp_path / "results.md", "python -m project bench", "a machine")
    text = (tmp_path / "results.md").read_text()
    assert "| precision | variant | total s |" in text and "| 32-true | on_device |" in text
    assert "| 1.25x |" in text and "same arch, batch, precision, variant" in text
    bench.write_csv(rows, tmp_path / "results.csv")
    assert [r["variant"] for r in read_csv(tmp_path / "results.csv")] == ["loader", "loader", "on_device", "on_device"]
    # without variants there is no such column
    rows = bench.collect(expand(BenchConfig(strategies=["single"], archs=["resnet50"], batch_sizes=[256])), tmp_path)
    assert "variant" not in rows[0]


ENVIRONMENT = {
    "device_name": "NVIDIA H100 80GB HBM3",
    "device_count": 2,
    "cpu_model": "AMD EPYC 9454",
    "cpu_cores": 16,
    "cuda": "12.8",
    "cudnn": "9.1.0",
    "nccl": "2.21.5",
    "torch": "2.8.0",
    "lightning": "2.6.0",
    "torchvision": "0.23.0",
    "python": "3.12.3",
    "hostname": "node1",
    "git_commit": "abc123",
    "git_dirty": False,
    "date": "2025-01-01T10:00:00+00:00",
}


def test_results_show_the_work_done_and_the_environment_once(tmp_path: Path) -> None:
    common = {"arch": "resnet50", "batch_size": 256, "precision": "32-true", "status": "ok", "error": None}
    rows = [
        {
            **common,
            "cell": "s",
            "bench_strategy": "single",
            "devices": 1,
            "epoch_seconds_mean": 2.0,
            "model_flops_per_sample": {"train": 1.2e10, "inference": 4.1e9},
            "train_tflops_per_second": 51.234,
            "mfu": 0.2571,
            "peak_tflops": 989.0,
            "test_tflops_per_second": 0.00512,
            "environment": ENVIRONMENT,
        },
        {
            **common,
            "cell": "d",
            "bench_strategy": "ddp",
            "devices": 2,
            "epoch_seconds_mean": 1.0,
            "train_tflops_per_second": None,
            "mfu": None,
            "environment": {**ENVIRONMENT, "torch": "2.9.0", "date": "2025-01-01T11:00:00+00:00"},
        },
        {**common, "cell": "old", "bench_strategy": "ddp", "devices": 2},  # a timing.json without the new keys
    ]
    bench.write_markdown(rows, tmp_path / "results.md", "python -m project bench", "a machine")
    text = (tmp_path / "results.md").read_text()
    assert "| TFLOP/s | MFU % | speed-up |" in text
    assert "| 51.2 | 25.7 | 1.00x |" in text and "| – | – | 2.00x |" in text and "| – | – | – |" in text
    assert "| 0.00512 | – |" in text  # inference: TFLOP/s in three significant digits
    # the environment once, above the tables, and which cell differs in what (the date differs anyway)
    assert text.count("NVIDIA H100 80GB HBM3") == 1 and text.index("## Environment") < text.index("## Training")
    assert "| git_dirty | no |" in text and "| cuda | 12.8 |" in text
    assert "they differ in torch." in text
    assert "| `s` | 2.8.0 |" in text and "| `d` | 2.9.0 |" in text

    bench.write_csv(rows, tmp_path / "results.csv")
    written = read_csv(tmp_path / "results.csv")
    assert written[0]["model_flops_per_sample_train"] == "12000000000.0" and written[0]["mfu"] == "0.2571"
    assert (
        written[0]["environment_device_name"] == "NVIDIA H100 80GB HBM3" and written[1]["environment_torch"] == "2.9.0"
    )
    assert written[2]["mfu"] == written[2]["environment_torch"] == ""

    bench.write_chart(rows, tmp_path / "results.png", "work")
    assert matplotlib.image.imread(tmp_path / "results.png").std() > 0


def test_the_chart_labels_every_bar_and_shows_throughput_and_latency() -> None:
    common = {"arch": "resnet50", "batch_size": 32, "precision": "32-true", "status": "ok", "error": None}
    latency = {"p50": 16.1, "p90": 18.0}
    rows = [
        {**common, "cell": "s", "bench_strategy": "single", "devices": 1, "epoch_seconds_mean": 2.0,
         "train_samples_per_second": 461.0, "test_samples_per_second": 1988.4, "test_batch_latency_ms": latency,
         "peak_memory_mb": [881.0], "peak_memory_devices": ["rank0"]},
        {**common, "cell": "d", "bench_strategy": "ddp", "devices": 2, "epoch_seconds_mean": 0.5,
         "train_samples_per_second": 1840.0, "peak_memory_mb": [868.0, 870.0],
         "peak_memory_devices": ["rank0", "rank1"]},
    ]  # fmt: skip
    figure = bench.chart_figure(rows, "labels")
    try:
        texts = {axis.get_title(): [t.get_text() for t in axis.texts] for axis in figure.axes}
    finally:
        matplotlib.pyplot.close(figure)
    epoch, throughput, memory = (
        next(v for k, v in texts.items() if word in k) for word in ("epoch", "throughput", "memory")
    )
    assert epoch == ["2 s\n1.00x", "0.5 s\n4.00x"]  # the value and the speed-up over the single device
    assert throughput == ["461", "1840", "1988", ""]  # train, then test samples/s; ddp ran no test
    assert ["16.1 ms"] in texts.values()  # the latency, on the throughput panel's second axis
    assert memory == ["881", "868", "", "870"]  # rank0 of both cells, then rank1


def test_results_of_cells_that_record_no_environment_say_so(tmp_path: Path) -> None:
    row = {"cell": "s", "bench_strategy": "single", "arch": "a", "batch_size": 8, "devices": 1, "precision": "32-true"}
    rows = [
        {**row, "status": "ok", "error": None},
        {**row, "cell": "f", "status": "failed", "error": "boom", "environment": ENVIRONMENT},
    ]
    bench.write_markdown(rows, tmp_path / "results.md", "python -m project bench", "a machine")
    text = (tmp_path / "results.md").read_text()
    assert "## Environment\n\n– (the cells' timing.json files do not record it)" in text
    assert "NVIDIA" not in text  # a failed cell's environment is not the one the figures come from


def test_results_compare_each_cell_with_its_single_device_baseline(tmp_path: Path) -> None:
    common = {"arch": "resnet50", "batch_size": 256, "devices": 2, "precision": "32-true", "error": None}
    rows = [
        {**common, "cell": "s", "bench_strategy": "single", "status": "ok", "epoch_seconds_mean": 3.0},
        {**common, "cell": "d", "bench_strategy": "ddp", "status": "ok", "epoch_seconds_mean": 2.0},
        {**common, "cell": "f", "bench_strategy": "fsdp", "status": "failed", "error": "ValueError: no | way"},
        {**common, "cell": "o", "bench_strategy": "ddp", "status": "ok", "epoch_seconds_mean": 1.0, "batch_size": 512},
    ]
    assert bench.speedups(rows) == [1.0, 1.5, None, None]  # no single-device cell at batch 512

    rows[1].update(
        test_batch_latency_ms={"mean": 4.0, "p50": 3.5},
        peak_memory_mb=[900.0, 800.0],
        peak_memory_devices=["rank0", "rank1"],
    )
    bench.write_csv(rows, tmp_path / "results.csv")
    written = read_csv(tmp_path / "results.csv")
    assert [r["cell"] for r in written] == ["s", "d", "f", "o"]
    assert written[1]["test_batch_latency_ms_p50"] == "3.5" and json.loads(written[1]["peak_memory_mb"]) == [900, 800]

    bench.write_markdown(rows, tmp_path / "results.md", "python -m project bench --config x.yaml --out y", "a machine")
    text = (tmp_path / "results.md").read_text()
    assert "`python -m project bench --config x.yaml --out y`" in text
    assert "| 1.50x |" in text and "| rank0 900, rank1 800 |" in text and "ValueError: no \\| way" in text
    assert "| variant |" not in text and "same arch, batch, precision)" in text


def test_importing_bench_is_cheap() -> None:
    """No torch, Lightning or matplotlib until a matrix runs (``python -m project bench --help``
    should answer at once); the ``project`` package's own imports are left out of the check."""
    code = (
        "import sys, types; package = types.ModuleType('project'); package.__path__ = [sys.argv[1]]; "
        "sys.modules['project'] = package; import project.tools.bench; "
        "print(sorted(m for m in ('torch', 'lightning', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "project")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_failing_cell_is_recorded_and_a_finished_one_not_run_again(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path / "bench.yaml", {**TINY, "strategies": ["single", "no_such_strategy"]})
    out = tmp_path / "out"
    bench.main(["--config", str(config), "--out", str(out)])
    first = capsys.readouterr().out
    assert "[1/2] single-mobilenet_v2-b20-x1-32-true: ok" in first and "left ~" in first
    assert "[2/2] no_such_strategy-mobilenet_v2-b20-x2-32-true: FAILED" in first

    rows = read_csv(out / "results.csv")
    single, broken = rows
    assert single["status"] == "ok" and broken["status"] == "failed"
    assert "trainer.strategy='no_such_strategy' is not a strategy" in broken["error"]
    for key in ("fit_seconds", "epoch_seconds_mean", "iteration_seconds_mean", "test_batch_latency_ms_mean"):
        assert float(single[key]) > 0, key
    assert "no_such_strategy" in (out / "results.md").read_text()

    timing = bench.run_folder(out / "runs", Cell("single", "mobilenet_v2", 20, 1, "32-true")) / "timing.json"
    written_at = timing.stat().st_mtime_ns
    bench.main(["--config", str(config), "--out", str(out)])
    again = capsys.readouterr().out
    assert "1 finished before, 1 to run" in again
    assert "[1/2] single-mobilenet_v2-b20-x1-32-true: finished before, not run again" in again
    assert timing.stat().st_mtime_ns == written_at
    assert [r["status"] for r in read_csv(out / "results.csv")] == ["ok", "failed"]


@pytest.mark.slow
def test_cpu_smoke_preset_writes_the_three_result_files(tmp_path: Path) -> None:
    # The preset with its settings and options, but (CI time: the whole preset takes 330 s) three of its
    # seven cells and half its batches: single device and ddp with MobileNetV2, the ResNet50 pipeline.
    # fsdp runs in tests/integration/test_strategy_runs.py; the full preset's results are benchmarks/results/cpu-smoke.
    settings = yaml.safe_load(bench.config_path("cpu-smoke").read_text())
    settings["strategy_archs"] = {"single": ["mobilenet_v2"], "ddp": ["mobilenet_v2"], "pipeline-mb4": ["resnet50"]}
    settings.update(strategies=["single", "ddp", "pipeline-mb4"], limit_train_batches=3, limit_test_batches=3)
    preset = write_config(tmp_path / "cpu-smoke.yaml", settings)
    out = tmp_path / "smoke"
    result = subprocess.run(
        [sys.executable, "-m", "project", "bench", "--config", str(preset), "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cells = expand(bench.load_config(preset))
    assert f"[{len(cells)}/{len(cells)}]" in result.stdout

    rows = read_csv(out / "results.csv")
    assert [r["cell"] for r in rows] == [c.name for c in cells]
    measured = [r for r in rows if r["bench_strategy"] in ("single", "ddp")]  # fsdp may or may not run on CPU
    assert len(measured) == 2
    markdown = (out / "results.md").read_text()
    for row in measured:
        assert row["status"] == "ok", row["error"]
        for key in (
            "fit_seconds",
            "epoch_seconds_mean",
            "iteration_seconds_mean",
            "train_samples_per_second",
            "test_batch_latency_ms_mean",
            "test_samples_per_second",
        ):
            assert float(row[key]) > 0, (row["cell"], key)
        world_size = 2 if row["bench_strategy"] == "ddp" else 1
        assert int(row["world_size"]) == world_size
        memory = json.loads(row["peak_memory_mb"])
        assert len(memory) == world_size and min(memory) > 0
        assert f"| `{row['cell']}` | {row['bench_strategy']} | {row['arch']} |" in markdown
        assert f" {float(row['fit_seconds']):.1f} |" in markdown
        assert list((out / "runs" / row["cell"] / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))
    for row in rows:
        assert row["status"] == "ok" or row["error"], row["cell"]
    assert f"python -m project bench --config {preset} --out {out}" in markdown
    # the ResNet50 pipeline: each sample counted once, a measured bubble per stage, shown in the table
    (pipeline,) = [r for r in rows if r["bench_strategy"] == "pipeline-mb4"]
    assert pipeline["status"] == "ok", pipeline["error"]
    bubble = json.loads(pipeline["bubble_fraction"])
    assert len(bubble) == 2 and all(0 <= b < 1 for b in bubble)
    assert [e["samples"] for e in json.loads(pipeline["epochs"])] == [3 * 32] * 3
    assert " / ".join(f"{100 * b:.0f}" for b in bubble) in markdown and "| bubble % |" in markdown

    image = matplotlib.image.imread(out / "results.png")
    assert image.shape[0] > 300 and image.shape[1] > 300 and image.std() > 0


# A cell's stand-in: a process that writes its pid to the file it is given, then sleeps.
SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
# A bench-like process: one such session waited on as a cell's fit is.
SESSION_RUNNER = textwrap.dedent(
    f"""
    import signal
    import sys
    from project.tools.bench.matrix import ending_sessions_on_sigterm, run_in_own_session

    pid_file, guarded = sys.argv[1], sys.argv[2] == "guarded"
    session = [sys.executable, "-c", {SLEEPER!r}, pid_file]
    if guarded:
        with ending_sessions_on_sigterm():
            run_in_own_session(session, None, None, timeout_s=120)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # Python's own response, even where pytest's was to ignore it
        run_in_own_session(session, None, None, timeout_s=120)
    """
)


def started(pid_file: Path, waiter_alive: Callable[[], bool]) -> int:
    """The pid the session wrote to ``pid_file``, once it has, while ``waiter_alive()`` (at most 60 s)."""
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()):
        assert waiter_alive() and time.monotonic() < deadline, "the session did not start"
        time.sleep(0.05)
    return int(pid_file.read_text())


def ended(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie, which runs nothing) within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
@pytest.mark.parametrize("guarded", [True, False], ids=["ending_sessions_on_sigterm", "python-default"])
def test_sigterm_ends_the_sessions_the_process_waits_on(tmp_path: Path, guarded: bool) -> None:
    """``bench``, ``gpu_check`` and ``gpu_runs`` run each cell in a process session of its own; SIGTERM (a time
    limit, ``timeout``) must end those too. Python's own response leaves them running: the second case shows it."""
    pid_file = tmp_path / "session.pid"
    repo = Path(__file__).resolve().parents[2]
    which = "guarded" if guarded else "default"
    runner = subprocess.Popen([sys.executable, "-c", SESSION_RUNNER, str(pid_file), which], cwd=repo)
    session = None
    try:
        session = started(pid_file, lambda: runner.poll() is None)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) == (143 if guarded else -signal.SIGTERM)
        assert ended(session, within_s=10 if guarded else 1) is guarded
    finally:
        runner.kill()
        runner.wait()
        if session is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(session, signal.SIGKILL)


@pytest.mark.slow
def test_ending_all_sessions_reaches_those_waited_on_in_other_threads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """gpu_check waits on its sessions from worker threads, where Ctrl-C does not reach: end_all_sessions (called
    by its main thread) ends them, and a worker starts no more."""
    from project.tools.bench import matrix

    monkeypatch.setattr(matrix, "_ENDING", threading.Event())  # this process goes on after the test
    pid_file = tmp_path / "session.pid"
    outcome: dict[str, object] = {}

    def worker() -> None:
        try:
            session = [sys.executable, "-c", SLEEPER, str(pid_file)]
            outcome["status"] = matrix.run_in_own_session(session, None, None, 120)
        except SystemExit as stop:
            outcome["exit"] = stop.code

    thread = threading.Thread(target=worker)
    thread.start()
    session = started(pid_file, thread.is_alive)
    matrix.end_all_sessions()
    thread.join(timeout=30)
    assert not thread.is_alive() and outcome == {"exit": matrix.SIGTERM_STATUS}
    assert ended(session)
    with pytest.raises(SystemExit):  # nothing starts any more
        matrix.run_in_own_session([sys.executable, "-c", "pass"], None, None, 60)

"""Accuracy beside the timings in bench and compare: a preset's target, the per-cell columns, the table per strategy
over its seeds against the single device, the chart, the progress line -- and the learnable preset's matrix."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot
import numpy as np
import pytest
import torch
import yaml

from project.data.stripes import PERIODS, StripesDataModule, stripe_images
from project.toolkit.data.augmentation import crop_and_flip
from project.toolkit.errors import ProjectError
from project.tools import bench
from project.tools.bench.compare import compare
from project.tools.bench.matrix import accuracy_text
from tests.tools.test_bench import TINY, read_csv, write_config


def cell_row(strategy: str, seed: str, best: float, reached: float | None, precision: str = "32-true") -> dict:
    devices = 1 if strategy == "single" else 2
    return {
        "cell": f"{strategy}-{precision}-{seed}", "status": "ok", "error": None, "bench_strategy": strategy,
        "arch": "small", "batch_size": 64, "devices": devices, "precision": precision, "variant": seed,
        "epoch_seconds_mean": 1.0, "train_samples_per_second": 1000.0, "best_val_acc": best, "best_val_acc_epoch": 6,
        "last_val_acc": best, "test_acc": best - 0.01, "target_acc": [0.7], "seconds_to_target_acc": {"0.7": reached},
    }  # fmt: skip


ROWS = [
    cell_row("single", "seed0", 0.80, 10.0),
    cell_row("single", "seed1", 0.82, 12.0),
    cell_row("pipeline-mb4", "seed0", 0.70, 20.0),
    cell_row("pipeline-mb4", "seed1", 0.66, None),
    cell_row("single", "seed0", 0.78, 11.0, "bf16-mixed"),
]


def test_a_presets_target_is_every_cells_timing_target(tmp_path: Path) -> None:
    settings = {**TINY, "strategies": ["single", "ddp"], "precision": ["32-true", "bf16-mixed"], "target_acc": 0.7}
    config = bench.load_config(
        write_config(tmp_path / "b.yaml", {**settings, "strategy_precisions": {"ddp": ["32-true"]}})
    )
    cells = bench.expand(config)
    assert [(c.strategy, c.precision) for c in cells] == [
        ("single", "32-true"),
        ("ddp", "32-true"),
        ("single", "bf16-mixed"),
    ]
    assert all("--timing.target_acc=[0.7]" in bench.cell_args(config, c, tmp_path) for c in cells)
    with pytest.raises(ProjectError, match=r"target_acc=1.5 is not allowed: it must be a number in \(0, 1\]"):
        bench.load_config(write_config(tmp_path / "bad.yaml", {**settings, "target_acc": 1.5}))


def test_results_show_accuracy_and_time_to_target_beside_throughput(tmp_path: Path) -> None:
    bench.write_markdown(ROWS, tmp_path / "results.md", "python -m project bench", "a machine")
    text = (tmp_path / "results.md").read_text()
    assert "| samples/s | best val acc % | test acc % | s to val acc | TFLOP/s |" in text
    assert "| 1000.0 | 70.0 | 69.0 | 0.7: 20.0 | – |" in text and "| 66.0 | 65.0 | 0.7: – |" in text
    # per strategy over its seeds, against the single device at 32-true (also for the bf16 single device)
    assert "| single | 1 | small | 64 | 32-true | 2 | 81.0 ± 1.4 | 0.0 | 80.0 ± 1.4 | 11.0 ± 1.4 (2/2) |" in text
    assert "| pipeline-mb4 | 2 | small | 64 | 32-true | 2 | 68.0 ± 2.8 | -13.0 | 67.0 ± 2.8 | 20.0 (1/2) |" in text
    assert "| single | 1 | small | 64 | bf16-mixed | 1 | 78.0 | -3.0 | 77.0 | 11.0 (1/1) |" in text

    bench.write_csv(ROWS, tmp_path / "results.csv")
    written = read_csv(tmp_path / "results.csv")
    assert [r["seconds_to_target_acc_0.7"] for r in written] == ["10.0", "12.0", "20.0", "", "11.0"]
    assert written[0]["best_val_acc"] == "0.8" and written[0]["test_acc"] == "0.79"

    figure = bench.chart_figure(ROWS, "accuracy")
    try:
        ticks = {axis.get_title(): [t.get_text() for t in axis.get_xticklabels()] for axis in figure.axes}
    finally:
        matplotlib.pyplot.close(figure)
    throughput = next(v for k, v in ticks.items() if "throughput" in k)
    assert throughput[0].endswith("val acc 80.0 %\n0.7: 10 s") and throughput[3].endswith("0.7: not reached")


def test_compare_shows_the_runs_accuracy(tmp_path: Path) -> None:
    for row in ROWS[:3]:
        (tmp_path / "runs" / row["cell"]).mkdir(parents=True)
        timing = {k: v for k, v in row.items() if k not in ("cell", "status", "error", "bench_strategy", "variant")}
        timing["strategy"] = "single_device" if row["bench_strategy"] == "single" else "pipeline"
        (tmp_path / "runs" / row["cell"] / "timing.json").write_text(json.dumps(timing))
    compare([str(tmp_path / "runs")], tmp_path / "out", "python -m project compare runs")
    text = (tmp_path / "out" / "results.md").read_text()
    assert (
        "| 1000.0 | 80.0 | 79.0 | 0.7: 10.0 |" in text and "| pipeline | 2 | small | 64 | 32-true | 1 | 70.0 |" in text
    )
    # runs that set no target and ran no test: their accuracy, "–" for the rest
    for run in ("single-32-true-seed0", "single-32-true-seed1"):
        timing = json.loads((tmp_path / "runs" / run / "timing.json").read_text())
        del timing["test_acc"], timing["target_acc"], timing["seconds_to_target_acc"]
        (tmp_path / "runs" / run / "timing.json").write_text(json.dumps(timing))
    compare([str(tmp_path / "runs")], tmp_path / "out", "python -m project compare runs")
    text = (tmp_path / "out" / "results.md").read_text()
    assert "| single | 1 | small | 64 | 32-true | 2 | 81.0 ± 1.4 | 0.0 | – | – | 1000.0 ± 0.0 |" in text


def test_a_finished_cells_progress_line_says_its_accuracy(tmp_path: Path) -> None:
    (tmp_path / "timing.json").write_text(json.dumps(ROWS[3]))
    assert accuracy_text(tmp_path) == " | val acc best 0.660, last 0.660, test 0.650 | 0.7 not reached"
    (tmp_path / "timing.json").write_text(json.dumps(ROWS[0]))
    assert accuracy_text(tmp_path).endswith("| 0.7 reached in 10.0 s")
    assert accuracy_text(tmp_path / "nothing") == ""


def test_the_learnable_preset_runs_every_strategy_with_three_seeds_to_one_target() -> None:
    config = bench.load_config(bench.config_path("cpu-learn"))
    cells = bench.expand(config)
    assert {c.strategy for c in cells} == {"single", "dp", "ddp", "fsdp", "pipeline-mb4"}
    assert {c.variant for c in cells} == {"seed0", "seed1", "seed2"} and len(cells) == 18
    assert {c.precision for c in cells if c.strategy == "single"} == {"32-true", "bf16-mixed"}
    assert config.target_acc == 0.7 and all(c.batch_size == 64 for c in cells)
    assert "--data=project.data.stripes.StripesDataModule" in config.args
    assert yaml.safe_load(bench.config_path("cpu-learn").read_text())["archs"] == ["project.data.stripes.small_convnet"]


def oracle(images: np.ndarray) -> np.ndarray:
    """The known answer: the direction and period whose wave the image's row or column means follow most."""
    x = images.astype(np.float64)
    x -= x.mean(axis=(1, 2), keepdims=True)
    t = np.arange(x.shape[1])
    waves = np.exp(-2j * np.pi * t[None, :] / np.asarray(PERIODS)[:, None])
    power = [np.abs(np.einsum("ntc,pt->npc", x.mean(axis=axis), waves)) ** 2 for axis in (2, 1)]
    return np.concatenate(power, axis=1).sum(axis=2).argmax(axis=1)  # rows' periods, then columns'


def test_the_stripes_labels_are_a_known_answer_that_a_flip_keeps() -> None:
    labels = np.arange(1000) % StripesDataModule.num_classes
    images = stripe_images(labels, np.random.default_rng(0))
    assert (oracle(images) == labels).mean() > 0.99
    flips = torch.tensor([[4, 4, 1]] * len(labels))  # no shift, every image flipped
    flipped = crop_and_flip(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), flips)
    assert (oracle(flipped.permute(0, 2, 3, 1).numpy()) == labels).mean() > 0.99
    train, again = StripesDataModule().load_split(True), StripesDataModule().load_split(True)
    assert np.array_equal(train[0], again[0]) and np.bincount(train[1]).tolist() == [150] * 10

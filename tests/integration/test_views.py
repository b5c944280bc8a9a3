"""What a run shows in TensorBoard (project/toolkit/callbacks/views.py and the timing callback's scalars): no
placeholder ``hp_metric``, the hparams with real metrics, the custom-scalars layout, and every
scalar on the global-step axis."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from urllib.parse import quote

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from project.__main__ import main
from project.toolkit.callbacks.views import FIRST_CARDS, HPARAM_METRICS, LAYOUT
from project.tools.bench.config import BenchConfig, Cell
from project.tools.bench.matrix import cell_args


def read_run(run: Path, command: int = 0) -> EventAccumulator:
    """The events the ``command``-th command (0: the fit, 1: a test of it) wrote into ``run``; one
    file each, named by its start time."""
    events = sorted(run.glob("events.out.tfevents.*"))[command]
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    return accumulator


def steps(accumulator: EventAccumulator, tag: str) -> list[int]:
    return [event.step for event in accumulator.Scalars(tag)]


def test_a_fit_writes_real_hparams_the_layout_and_one_step_axis(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    main(["fit", *tiny_args, "--trainer.max_epochs=2", "--trainer.limit_train_batches=3"])
    run = read_run(tmp_path / "lightning_logs" / "version_0")
    tags = set(run.Tags()["scalars"])
    # the link the run prints opens TensorBoard's first tab on accuracy and loss, nothing else
    assert f"http://localhost:6006/?tagFilter={quote(FIRST_CARDS, safe='')}#timeseries" in capsys.readouterr().out
    assert {tag for tag in tags if re.search(FIRST_CARDS, tag)} == {"train/acc", "train/loss", "val/acc", "val/loss"}
    assert {tag for tag in run.Tags()["images"] if re.search(FIRST_CARDS, tag)} == {"val/confusion"}
    assert "hp_metric" not in tags and "epoch" not in tags  # Lightning's placeholder -1, and its epoch staircase
    assert set(HPARAM_METRICS) <= tags, set(HPARAM_METRICS) - tags

    # one x axis: an epoch's time and memory at the step of its train/acc and val/acc (3 steps an epoch)
    assert steps(run, "val/acc") == steps(run, "train/acc") == [2, 5]
    for tag in ("time/train_epoch_seconds", "time/train_samples_per_second", "memory/peak_mb/rank0"):
        assert steps(run, tag) == [2, 5], tag
    assert steps(run, "time/summary/fit_seconds") == steps(run, "hparams/val_acc") == [5]
    # the hparams' metrics are the run's own figures
    assert run.Scalars("hparams/val_acc")[0].value == run.Scalars("val/acc")[-1].value
    assert run.Scalars("hparams/train_samples_per_second")[0].value > 0

    # the HPARAMS tab: the run's settings against those metrics
    hparams = run.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"])
    values = session.session_start_info.hparams
    assert values["strategy"].string_value == "single_device" and values["arch"].string_value == "mobilenet_v2"
    assert values["batch_size"].number_value == 20 and values["lr"].number_value == 0.1
    assert "_instantiator" not in values  # LightningCLI's bookkeeping in the model's hparams
    experiment = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == set(HPARAM_METRICS)

    # the CUSTOM SCALARS tab: time, memory and accuracy side by side
    (config,) = run.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    assert [c.title for c in layout.category] == list(LAYOUT)
    training = [chart.title for chart in layout.category[0].chart]
    assert training == list(LAYOUT["training"]) and training[0] == "accuracy"
    assert "seconds per epoch" in training and "peak memory MiB per rank" in training
    assert list(layout.category[0].chart[0].multiline.tag) == [r"^train/acc$", r"^val/acc$"]

    # a test of the fit's last checkpoint, in the fit's folder: its figures on test/acc's step, still no placeholder
    main(["test", *tiny_args, "--ckpt_path=last"])
    test_run = read_run(tmp_path / "lightning_logs" / "version_0", command=1)
    test_tags = set(test_run.Tags()["scalars"])
    assert not {"hp_metric", "epoch"} & test_tags and "time/test/samples_per_second" in test_tags
    assert steps(test_run, "time/test/samples_per_second") == steps(test_run, "test/acc")

    # the run folder compared from the timing.json the fit and the test wrote into it
    out = tmp_path / "compared"
    main(["compare", str(tmp_path / "lightning_logs"), "--out", str(out)])  # exits only on an error
    with open(out / "results.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert (row["cell"], row["bench_strategy"]) == ("version_0", "single")
    assert float(row["train_samples_per_second"]) > 0 and float(row["test_samples_per_second"]) > 0
    assert "| `version_0` | single | mobilenet_v2 | 20 | 1 | 32-true |" in (out / "results.md").read_text()


def test_without_validation_or_timing_no_hparams_are_written(tiny_args: list[str], tmp_path: Path) -> None:
    off = ["--trainer.limit_val_batches=0", "--callbacks.timing=false", "--callbacks.checkpoint=false"]
    main(["fit", *tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", *off])
    run = read_run(tmp_path / "lightning_logs" / "version_0")
    assert not any(m.plugin_data.plugin_name == "hparams" for m in run.summary_metadata.values())
    assert not {"hp_metric", *HPARAM_METRICS} & set(run.Tags()["scalars"])
    assert "train/loss_step" in run.Tags()["scalars"]  # the run itself was logged


def test_a_bench_cells_logger_writes_no_placeholder_card_nor_column(tiny_args: list[str], tmp_path: Path) -> None:
    config = BenchConfig(strategies=["single"], archs=["mobilenet_v2"], batch_sizes=[20])
    cell = cell_args(config, Cell("single", "mobilenet_v2", 20, 1, "32-true"), tmp_path)
    logger = [arg for arg in cell if arg.startswith("--trainer.logger.")]  # the TensorBoard run a cell writes
    main(["fit", *tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", *logger])
    (events,) = tmp_path.glob("*/lightning_logs/version_0/events.out.tfevents.*")
    summaries = [value for event in EventFileLoader(str(events)).Load() for value in event.summary.value]
    scalars = {value.tag for value in summaries if value.metadata.plugin_data.plugin_name == "scalars"}
    assert not {"hp_metric", "epoch"} & scalars and "val/acc" in scalars
    sessions = [  # every session the HPARAMS tab shows, each with its columns
        plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content).session_start_info.hparams
        for value in summaries
        if value.tag == "_hparams_/session_start_info"
    ]
    assert sessions and all("_instantiator" not in values and "strategy" in values for values in sessions)

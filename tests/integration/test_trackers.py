"""Every tracker (configs/logger/): CSV and MLflow beside TensorBoard share the run folder, get the timing figures
and the model's metrics, MLflow the run's options as params; TensorBoard keeps its views; an evaluation of a fit's
checkpoint still finds it and writes into its folder. MLflow's local store (SQLite), no server, no network."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest
from jsonargparse import Namespace
from tensorboard.plugins.custom_scalar import layout_pb2

from project.__main__ import main
from project.toolkit.cli.run_dirs import arrange_run_folder
from tests.integration.test_cli import parsed_config
from tests.integration.test_views import read_run

LOGGERS = Path(__file__).resolve().parents[2] / "configs" / "logger"
DEFAULT = LOGGERS.parent / "default.yaml"
SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]


@pytest.mark.parametrize("tracker", ["csv", "mlflow"])
def test_logger_configs_compose_with_and_without_the_default_config(capsys, tracker: str) -> None:
    for configs in ([f"--config={DEFAULT}"], []):
        config = parsed_config(capsys, *configs, f"--config={LOGGERS / tracker}.yaml")
        names = [entry["class_path"].rsplit(".", 1)[1] for entry in config["trainer"]["logger"]]
        assert sorted(names) == sorted(["TensorBoardLogger", {"csv": "CSVLogger", "mlflow": "MLFlowLogger"}[tracker]])
        assert config["model"]["arch"] == "mobilenet_v2" and config["trainer"]["max_epochs"] == 10


def test_csv_gets_the_timing_figures_in_the_run_folder_and_tensorboard_keeps_its_views(
    tiny_args: list[str], tmp_path: Path, capsys
) -> None:
    config = f"--config={LOGGERS / 'csv.yaml'}"
    fit = main(["fit", config, *tiny_args, *SHORT])
    run = tmp_path / "lightning_logs" / "version_0"
    assert Path(fit.trainer.log_dir) == run and (run / "checkpoints" / "last.ckpt").is_file()
    assert {"config.yaml", "timing.json", "metrics.csv"} <= {p.name for p in run.iterdir()}
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    for column in ("time/train_epoch_seconds", "time/train_samples_per_second", "time/summary/fit_seconds", "val/acc"):
        assert any(row.get(column) for row in rows), column
    assert f"metrics.csv:      {run / 'metrics.csv'}" in capsys.readouterr().out

    # TensorBoard, beside it: the custom-scalars layout and the HPARAMS tab, as with TensorBoard alone
    events = read_run(run)
    assert "hparams/val_acc" in events.Tags()["scalars"] and "hp_metric" not in events.Tags()["scalars"]
    assert events.PluginTagToContent("hparams")
    (layout,) = events.Tensors("custom_scalars__config__")
    assert layout_pb2.Layout.FromString(layout.tensor_proto.string_val[0]).category

    # --ckpt_path=last finds the fit; the test writes into its folder, its CSV beside the fit's (which is kept)
    tested = main(["test", config, *tiny_args, "--ckpt_path=last"])
    assert Path(tested.trainer.log_dir) == run and (run / "config-test.yaml").is_file()
    assert list(csv.DictReader((run / "metrics.csv").open())) == rows
    tests = list(csv.DictReader((run / "test" / "metrics.csv").open()))
    assert any(row.get("test/acc") for row in tests) and any(row.get("time/test/samples_per_second") for row in tests)


def test_mlflow_reads_back_the_metrics_and_the_options_from_its_local_store(
    tiny_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from mlflow.tracking import MlflowClient

    work = tmp_path / "work"  # the working directory: nothing of MLflow's lands there
    work.mkdir()
    monkeypatch.chdir(work)
    config = f"--config={LOGGERS / 'mlflow.yaml'}"
    main(["fit", config, *tiny_args, *SHORT])
    # The hint works with what is installed: mlflow-skinny (the extra) has no UI server, flask.
    ui = "mlflow ui" if importlib.util.find_spec("flask") else "pip install mlflow, then mlflow ui"
    assert f": {ui} --backend-store-uri sqlite:///" in capsys.readouterr().out
    main(["test", config, *tiny_args, "--ckpt_path=last"])
    assert not any(work.iterdir()) and (tmp_path / "mlflow.db").is_file()
    assert (tmp_path / "lightning_logs" / "version_0" / "config-test.yaml").is_file()

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "lightning_logs"]
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"version_0-fit", "version_0-test"}  # named by their run folder
    fit = client.get_run(runs["version_0-fit"].info.run_id).data
    assert {"time/train_epoch_seconds", "time/summary/fit_seconds", "memory/peak_mb/rank0", "val/acc"} <= set(
        fit.metrics
    )
    assert fit.params["arch"] == "mobilenet_v2" and fit.params["batch_size"] == "20" and fit.params["lr"] == "0.1"
    assert fit.params["strategy"] == "single_device" and fit.params["precision"] == "32-true"
    assert {"test/acc", "time/test/samples_per_second"} <= set(runs["version_0-test"].data.metrics)


def test_a_bad_logger_config_gets_one_line(
    tiny_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    misspelled = tmp_path / "logger.yaml"
    misspelled.write_text((LOGGERS / "mlflow.yaml").read_text().replace("experiment_name:", "experiment:"))
    with pytest.raises(SystemExit) as exited:
        main(["fit", f"--config={misspelled}", *tiny_args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: trainer.logger=")

    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if the mlflow extra were not installed
    with pytest.raises(SystemExit) as exited:
        main(["fit", f"--config={LOGGERS / 'mlflow.yaml'}", *tiny_args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install '.[mlflow]'" in err
    assert not (tmp_path / "lightning_logs").exists()


def test_one_version_for_every_logger_and_a_rerun_of_a_saved_config_gets_a_new_one(tmp_path: Path) -> None:
    """A config.yaml records the version it placed (version_0): run again with it, the run gets the next folder;
    a version the user named stays."""
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    loggers = [
        Namespace(class_path=f"lightning.pytorch.loggers.{name}", init_args=Namespace(save_dir=".", version=version))
        for name, version in [("CSVLogger", "version_0"), ("TensorBoardLogger", None), ("TensorBoardLogger", "mine")]
    ]
    mlflow = Namespace(
        class_path="lightning.pytorch.loggers.MLFlowLogger", init_args=Namespace(run_name="version_0-fit")
    )
    config = Namespace(trainer=Namespace(default_root_dir=str(tmp_path), logger=[*loggers, mlflow]), ckpt_path=None)
    assert arrange_run_folder("fit", config) is None
    assert [entry.init_args.version for entry in loggers] == ["version_1", "version_1", "mine"]
    assert {entry.init_args.save_dir for entry in loggers} == {str(tmp_path)}
    assert mlflow.init_args.run_name == "version_1-fit"
    assert mlflow.init_args.tracking_uri == f"sqlite:///{tmp_path.absolute() / 'mlflow.db'}"

"""W&B beside TensorBoard (configs/logger/wandb.yaml, project/toolkit/wandb_run.py): without credentials the run is
offline and one line says where it went and how to upload it; the offline run's own files hold the model's metrics,
the run's options and timing.json's figures; ``--ckpt_path=last`` continues the same W&B run; an evaluation is a run
of its own in the fit's folder. No credentials and no network: W&B's home is the test's folder, its server a closed
local port."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonargparse import Namespace

from project.__main__ import main
from project.toolkit.cli.run_dirs import arrange_run_folder
from project.toolkit.wandb_run import has_credentials
from tests.support.runs import one_error_line

pytest.importorskip("wandb", reason="the wandb extra: pip install '.[wandb]'")

CONFIG = f"--config={Path(__file__).resolve().parents[2] / 'configs' / 'logger' / 'wandb.yaml'}"
SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]


@pytest.fixture
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key, no netrc, no WANDB_MODE: the logger itself must choose offline."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR", "WANDB_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # were it to go online, it would fail at once
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))


def wandb_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if "wandb" in line.lower()]  # W&B's own messages left out
    return line


def offline_run(line: str, run_folder: Path, run_id: str) -> Path:
    """The offline run's folder in ``run_folder`` (W&B's ``wandb/offline-run-<time>-<id>``), which ``line`` names."""
    (folder,) = run_folder.glob(f"wandb/offline-run-*-{run_id}")
    assert f"offline, in {folder}: upload with wandb sync " in line, line
    return folder


def synced(line: str) -> list[Path]:
    """The folders the line's ``wandb sync <pattern>`` uploads."""
    return sorted(Path(p) for p in glob.glob(line.rsplit("wandb sync ", 1)[1]))


def inspect(folder: Path, *options: str) -> Any:
    """What W&B's own reader of an offline run's log (``run-<id>.wandb``) finds there: ``wandb leet inspect --json``
    (``--summary``: the run's config, summary, name, id and state; else every record, one JSON object a line)."""
    wandb = Path(sys.executable).parent / "wandb"
    out = subprocess.run([str(wandb), "leet", "inspect", str(folder), "--json", *options], capture_output=True,
                         text=True, timeout=120, check=True).stdout  # fmt: skip
    return json.loads(out) if options else [json.loads(line) for line in out.splitlines() if line.strip()]


def recorded_id(run_folder: Path, config: str = "config.yaml") -> str:
    entries = yaml.safe_load((run_folder / config).read_text())["trainer"]["logger"]
    (entry,) = [entry for entry in entries if entry["class_path"].endswith("WandbLogger")]
    return entry["init_args"]["id"]


@pytest.mark.slow  # W&B's service process, and its reader's
def test_an_offline_run_holds_the_metrics_the_options_and_the_timing_and_resumes(
    tiny_args: list[str], tmp_path: Path, no_credentials: None, capsys: pytest.CaptureFixture
) -> None:
    main(["fit", CONFIG, *tiny_args, *SHORT])
    run = tmp_path / "lightning_logs" / "version_0"
    run_id = recorded_id(run)
    assert run_id.startswith("version_0-")
    line = wandb_line(capsys.readouterr().out)
    assert line.startswith("  W&B run:") and "version_0, offline" in line
    folder = offline_run(line, run, run_id)
    assert synced(line) == [folder]
    assert (folder / f"run-{run_id}.wandb").stat().st_size > 0  # the run's log, which `wandb sync` uploads

    found = inspect(folder, "--summary")
    assert (found["name"], found["run_id"], found["state"], found["exit_code"]) == ("version_0", run_id, "finished", 0)
    config = found["config"]
    assert config["arch"] == "mobilenet_v2" and config["batch_size"] == 20 and config["lr"] == 0.1
    assert config["strategy"] == "single_device" and config["precision"] == "32-true"
    summary = found["summary"]  # each metric's last value, and timing.json
    assert {"train/loss", "train/loss_step", "train/lr", "val/acc", "time/summary/fit_seconds"} <= set(summary)
    timing = json.loads((run / "timing.json").read_text())
    assert summary["timing"]["train_samples_per_second"] == timing["train_samples_per_second"] > 0
    assert summary["timing"]["arch"] == "mobilenet_v2"
    history = [r["history"]["item"] for r in inspect(folder) if r["type"] == "history"]  # each log's values
    loss_steps = [item["trainer/global_step"] for item in history if "train/loss_step" in item]
    assert loss_steps == [0, 1] and [item["trainer/global_step"] for item in history if "train/lr" in item] == [0, 1]

    # --ckpt_path=last: a new run folder, the same W&B run (its id and name), found by the same `wandb sync`
    more = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    main(["fit", CONFIG, *tiny_args, *more, "--ckpt_path=last"])
    resumed = tmp_path / "lightning_logs" / "version_1"
    assert recorded_id(resumed) == run_id
    line = wandb_line(capsys.readouterr().out)
    assert "version_0, offline" in line
    continued = offline_run(line, resumed, run_id)
    assert synced(line) == sorted([folder, continued])
    assert inspect(continued, "--summary")["summary"]["trainer/global_step"] == 3  # the steps after the checkpoint's 2

    # an evaluation of the fit: a W&B run of its own, in the fit's folder
    main(["test", CONFIG, *tiny_args, "--ckpt_path=last"])
    line = wandb_line(capsys.readouterr().out)
    test_id = recorded_id(resumed, "config-test.yaml")
    assert test_id.startswith("version_1-test-") and "version_1-test, offline" in line
    summary = inspect(offline_run(line, resumed, test_id), "--summary")["summary"]
    assert "test/acc" in summary and summary["timing"]["test_samples_per_second"] > 0


def test_a_rerun_of_a_saved_config_is_a_new_wandb_run_and_a_name_you_give_stays(tmp_path: Path) -> None:
    wandb = "project.toolkit.wandb_run.WandbLogger"
    recorded = Namespace(class_path=wandb, init_args=Namespace(name="version_0", id="version_0-1a2b3c4d"))
    named = Namespace(class_path=wandb, init_args=Namespace(name="mine", id="my-id"))
    tensorboard = Namespace(class_path="lightning.pytorch.loggers.TensorBoardLogger", init_args=Namespace())
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    logger = [tensorboard, recorded, named]
    config = Namespace(trainer=Namespace(default_root_dir=str(tmp_path), logger=logger), ckpt_path=None)
    arrange_run_folder("fit", config)
    assert recorded.init_args.name == "version_1" and recorded.init_args.id.startswith("version_1-")
    assert (named.init_args.name, named.init_args.id) == ("mine", "my-id")
    assert recorded.init_args.save_dir == named.init_args.save_dir == str(tmp_path / "lightning_logs" / "version_1")


def test_credentials_are_a_key_or_a_netrc_entry_for_the_server(tmp_path: Path) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai login user password abc123\n")
    assert has_credentials({"WANDB_API_KEY": "abc123", "NETRC": str(tmp_path / "none")})
    assert has_credentials({"NETRC": str(netrc)})
    assert not has_credentials({"NETRC": str(netrc), "WANDB_BASE_URL": "https://wandb.example.com"})
    assert not has_credentials({"NETRC": str(tmp_path / "none")})


def test_without_the_wandb_extra_one_line_says_what_to_install(
    tiny_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the wandb extra were not installed
    assert "pip install '.[wandb]'" in one_error_line("fit", [CONFIG, *tiny_args], capsys)
    assert not (tmp_path / "lightning_logs").exists()

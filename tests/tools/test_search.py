"""``python -m project search``: the search file's checks, the storage, epochs reported and pruned, a study of tiny
trials run and resumed -- and, slow, a search killed with ``kill -9`` that resumes, and two workers on one study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from project.tools import search
from project.tools.bench.matrix import run_in_own_session
from project.tools.search.storage import open_storage
from project.tools.search.trials import EpochReporter, epoch_accuracies, option_args
from tests.support.fixtures import TINY_RUN

REPO = Path(__file__).resolve().parents[2]
# Trials that fit in seconds on a CPU: the tests' colour images, 32 px, a small net, two epochs of three batches.
TINY = {
    "trials": 2,
    "epochs": 2,
    "params": {"model.lr": {"low": 0.01, "high": 0.3, "log": True}, "model.label_smoothing": [0.0, 0.1]},
    "prune": False,
    "timeout_minutes": 3,
    "args": [
        *TINY_RUN,
        "--model.arch=tests.support.user_nets.sequential_convnet",
        "--trainer.devices=1",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=2",
    ],
}


def write_config(tmp_path: Path, **settings: Any) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, **settings}, sort_keys=False))
    return path


def load_study(out: Path, name: str = "tiny") -> Any:
    import optuna

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(out / "study.journal")))
    return optuna.load_study(study_name=name, storage=storage)


def search_command(config: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "project", "search", "--config", str(config), "--out", str(out)]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"trial": 3}, "unknown key(s) trial; allowed: params, trials"),
        ({"params": {"model.lr": {"low": 0.5, "high": 0.1}}}, "model.lr={'low': 0.5, 'high': 0.1} is not allowed: low"),
        ({"params": {"model.lr": {"low": 0, "high": 1, "log": True}}}, "a log range needs low > 0 and no step"),
        ({"params": {"model.lr": {"low": 0, "high": 1, "step": 2}}}, "step must be a number > 0, at most high - low"),
        ({"params": {"model.lr": {"low": 0, "hi": 1}}}, "model.lr={'low': 0, 'hi': 1} is not allowed: it must be"),
        ({"params": {"data.batch_size": []}}, "choices must be a non-empty list"),
        ({"params": {"lr": [0.1]}}, "params: 'lr' is not a fit option's dotted name, e.g. model.lr"),
        ({"trials": 0}, "trials=0 is not allowed: it must be an integer >= 1"),
    ],
)
def test_a_bad_search_file_is_one_line(tmp_path: Path, capsys, settings: dict, message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        search.main(["--config", str(write_config(tmp_path, **settings)), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: search --config ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize("url", ["nosuchdb://host/db", "sqlite:////no/such/folder/study.db"])
def test_a_bad_storage_url_is_one_line(tmp_path: Path, capsys, url: str) -> None:
    pytest.importorskip("optuna")
    with pytest.raises(SystemExit) as exit_info:
        search.main(["--config", str(write_config(tmp_path)), "--out", str(tmp_path), "--storage", url])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: search --storage {url}: Optuna cannot open this database (")


def test_an_option_the_fit_does_not_know_is_one_line(tmp_path: Path, capsys) -> None:
    pytest.importorskip("optuna")
    config = write_config(tmp_path, params={"model.lrr": [0.1]})
    with pytest.raises(SystemExit) as exit_info:
        search.main(["--config", str(config), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: search: trial 0's fit: unrecognized arguments: --model.lrr=0.1; did you mean")


def test_option_values_as_the_command_line_reads_them() -> None:
    values = {"model.lr": 1e-05, "model.x": 0.25, "a.b": True, "c.d": None, "data.batch_size": 128, "e.f": 1e16}
    assert option_args(values) == [
        "--model.lr=1.0e-05",
        "--model.x=0.25",
        "--a.b=true",
        "--c.d=null",
        "--data.batch_size=128",
        "--e.f=1.0e+16",
    ]


def test_epochs_are_reported_as_the_csv_grows_and_a_worse_trial_is_pruned(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(1, n_warmup_steps=1))
    first = study.ask()
    first.report(0.9, 1)
    study.tell(first, 0.9)
    run = tmp_path / "lightning_logs" / "version_0"
    run.mkdir(parents=True)
    metrics = run / "metrics.csv"
    metrics.write_text("epoch,step,train/loss,val/acc\n0,0,2.3,\n0,2,,0.5\n1,5,,0.4")  # the last line being written
    assert epoch_accuracies(tmp_path) == {0: 0.5}
    reporter = EpochReporter(study.ask(), tmp_path, epochs=3)
    with pytest.raises(optuna.TrialPruned, match="val/acc 0.5000 after epoch 1"):
        reporter()
    assert reporter.reported == {0: 0.5}
    EpochReporter(study.ask(), tmp_path, epochs=1)()  # the same epoch, the fit's last: it runs to its end
    metrics.write_text(metrics.read_text() + "\n")
    reporter(prune=False)  # the fit's last epoch, read once it ended
    assert reporter.reported == {0: 0.5, 1: 0.4}


def test_a_watch_that_raises_ends_the_session(tmp_path: Path) -> None:
    calls = []

    def watch() -> None:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise KeyboardInterrupt

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_in_own_session(["sleep", "60"], None, None, timeout_s=60, watch=watch)
    assert len(calls) == 2 and time.monotonic() - start < 10


def test_a_search_runs_its_trials_as_runs_and_ends_with_the_best(tmp_path: Path, capsys) -> None:
    pytest.importorskip("optuna")
    config, out = write_config(tmp_path), tmp_path / "out"
    search.main(["--config", str(config), "--out", str(out)])
    printed = capsys.readouterr().out
    study = load_study(out)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    for trial in study.trials:
        run = out / f"trial-{trial.number:04d}" / "lightning_logs" / "version_0"
        assert {"config.yaml", "metrics.csv", "timing.json", "checkpoints"} <= {p.name for p in run.iterdir()}
        assert sorted(trial.intermediate_values) == [1, 2] and trial.value == max(trial.intermediate_values.values())
        assert trial.user_attrs["seconds"] > 0
    assert "| trial | model.lr | model.label_smoothing | state | val acc | epochs | seconds |" in printed
    best = study.best_trial
    assert (
        f"best: trial {best.number}, val acc {best.value:.4f}: python -m project fit --trainer.max_epochs=2 " in printed
    )
    assert printed.rstrip().endswith(
        f"--model.lr={best.params['model.lr']!r} --model.label_smoothing={best.params['model.label_smoothing']}"
    )
    assert (out / "trials.md").read_text().count("| complete |") == 2
    search.main(["--config", str(config), "--out", str(out)])  # again: the study has its trials, none runs again
    assert "search: trial" not in capsys.readouterr().out and len(load_study(out).trials) == 2


def test_a_database_url_holds_the_study_with_heartbeats(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    config, url = write_config(tmp_path, trials=1, epochs=1), f"sqlite:///{tmp_path / 'study.db'}"
    search.main(["--config", str(config), "--out", str(tmp_path / "out"), "--storage", url])
    storage, lock = open_storage(url)
    assert (storage.get_heartbeat_interval(), lock) == (60, None)  # stale trials: by heartbeat, no lock file
    (trial,) = optuna.load_study(study_name="tiny", storage=storage).trials
    assert trial.state.name == "COMPLETE" and not (tmp_path / "out" / "study.journal").exists()


def wait_for(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_search_killed_with_kill_9_resumes_without_redoing_a_trial(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    config, out = write_config(tmp_path), tmp_path / "out"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    first = subprocess.Popen(search_command(config, out), cwd=REPO, **quiet)
    try:
        wait_for(lambda: (out / "trial-0001" / "fit.err").is_file(), 120)  # trial 0 done, trial 1's fit started
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    done_before = (out / "trial-0000" / "fit.out").stat().st_mtime_ns
    resumed = subprocess.run(search_command(config, out), cwd=REPO, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert "search: trial 1's worker is gone: failed, queued again" in resumed.stdout
    trials = load_study(out).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[2].params == trials[1].params  # trial 1 again, as trial 2
    assert (out / "trial-0000" / "fit.out").stat().st_mtime_ns == done_before  # trial 0 not run again
    assert not list((out / "trial-0001").rglob("last.ckpt"))  # its fit ended with the search it ran in


@pytest.mark.slow
def test_two_workers_share_one_study_and_its_trial_count(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    config, out = write_config(tmp_path, trials=4, epochs=1), tmp_path / "out"
    out.mkdir()
    command = search_command(config, out)
    workers = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [worker.communicate(timeout=240)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0]
    trials = load_study(out).trials
    assert [(t.number, t.state.name) for t in trials] == [(n, "COMPLETE") for n in range(4)]  # none lost, none extra
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both worked
    assert sum(output.count(" complete (") for output in outputs) == 4  # each trial ran once, by one worker
    assert all(len(list((out / f"trial-{n:04d}").rglob("metrics.csv"))) == 1 for n in range(4))

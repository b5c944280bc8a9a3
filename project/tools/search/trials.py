"""One trial: its options (suggested by the study's sampler), its fit as an ordinary run in ``<out>/trial-NNNN`` (a
fresh process, as bench runs its cells), each epoch's ``val/acc`` read from the run's ``metrics.csv`` while it runs and
reported to the study, which may prune it (the fit's process is then ended)."""

from __future__ import annotations

import csv
import ctypes
import json
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from project.toolkit.errors import ProjectError
from project.tools.bench.matrix import project_command, run_logged
from project.tools.search.config import Param, SearchConfig
from project.tools.search.storage import WORKER, worker_name

# The trial's loggers: a CSV file to read each epoch's val/acc from (written at every log call), and TensorBoard.
LOGGERS = [
    {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "."}},
    {"class_path": "project.toolkit.callbacks.views.TensorBoardLogger", "init_args": {"save_dir": "."}},
]
PR_SET_PDEATHSIG = 1  # Linux prctl: the signal a process gets when the one that started it dies


class TrialFailed(Exception):
    """A trial's fit failed or logged no ``val/acc``: the trial is marked failed and the search goes on."""


def suggest(trial: Any, params: dict[str, Param]) -> dict[str, Any]:
    """The trial's value of every searched option (a queued trial's own, where it was run before)."""
    values = {}
    for name, p in params.items():
        if p.choices is not None:
            values[name] = trial.suggest_categorical(name, p.choices)
        elif all(isinstance(v, int) for v in (p.low, p.high, p.step or 1)):
            values[name] = trial.suggest_int(name, p.low, p.high, step=p.step or 1, log=p.log)
        else:
            values[name] = trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log)
    return values


def option_value(value: Any) -> str:
    """A value as the command line reads it: ``true``, ``null``, ``1.0e-05`` (YAML reads ``1e-05`` as a string)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    text = repr(value) if isinstance(value, float) else str(value)
    return text.replace("e", ".0e") if isinstance(value, float) and "e" in text and "." not in text else text


def option_args(values: dict[str, Any]) -> list[str]:
    return [f"--{name}={option_value(value)}" for name, value in values.items()]


def trial_args(config: SearchConfig, values: dict[str, Any], folder: Path) -> list[str]:
    """A trial's fit options: its epochs, folder and loggers, then the search's ``args``, then its own values."""
    args = [f"--trainer.max_epochs={config.epochs}", "--trainer.enable_progress_bar=false"]
    args += [f"--trainer.default_root_dir={folder}", f"--trainer.logger={json.dumps(LOGGERS)}"]
    return args + config.args + option_args(values)


def epoch_accuracies(folder: Path) -> dict[int, float]:
    """Each epoch's ``val/acc`` (epoch -> accuracy) in the ``metrics.csv`` under ``folder`` so far; a last line
    still being written is left for the next read."""
    found: dict[int, float] = {}
    for path in folder.rglob("metrics.csv"):
        try:
            lines = path.read_text().splitlines(keepends=True)
        except OSError:
            continue
        if lines and not lines[-1].endswith("\n"):
            lines.pop()
        for row in csv.DictReader(lines):
            if row.get("val/acc") and row.get("epoch"):
                found[int(float(row["epoch"]))] = float(row["val/acc"])
    return found


class EpochReporter:
    """Called while a trial's fit runs: reports each new epoch's ``val/acc`` (step: epochs done) and raises
    ``optuna.TrialPruned`` where the study's pruner says so, before the fit's last epoch (``epochs``)."""

    def __init__(self, trial: Any, folder: Path, epochs: int) -> None:
        self.trial, self.folder, self.epochs, self.reported = trial, folder, epochs, {}

    def __call__(self, prune: bool = True) -> None:
        import optuna

        for epoch, accuracy in sorted(epoch_accuracies(self.folder).items()):
            if epoch not in self.reported:
                self.reported[epoch] = accuracy
                self.trial.report(accuracy, epoch + 1)
                if prune and epoch + 1 < self.epochs and self.trial.should_prune():
                    raise optuna.TrialPruned(f"val/acc {accuracy:.4f} after epoch {epoch + 1}")


def _ends_with_this_process() -> Callable[[], Any] | None:
    """What a fit runs before it starts (Linux): it is killed when the search process dies, also by ``kill -9``."""
    if sys.platform != "linux":
        return None
    prctl = ctypes.CDLL(None).prctl
    return lambda: prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL))


def run_trial(trial: Any, config: SearchConfig, out: Path, marked: Callable[[], None]) -> float:
    """The trial's best ``val/acc``: its fit, run in a fresh process into ``out/trial-NNNN``. ``marked``: called
    once the trial is marked with this worker."""
    folder = out / f"trial-{trial.number:04d}"
    values = suggest(trial, config.params)
    trial.set_user_attr(WORKER, worker_name())
    marked()
    shutil.rmtree(folder, ignore_errors=True)  # a trial number's earlier study, where its journal was deleted
    folder.mkdir(parents=True)
    reporter, start = EpochReporter(trial, folder, config.epochs), time.perf_counter()
    command = project_command("fit", trial_args(config, values, folder))
    session = {"watch": reporter, "preexec_fn": _ends_with_this_process()}
    try:
        error = run_logged(command, folder / "fit", config.timeout_minutes * 60, **session)
        reporter(prune=False)  # the last epoch's, written as the fit ended
    finally:
        trial.set_user_attr("seconds", round(time.perf_counter() - start, 1))
    if error is not None and error.startswith("error:"):  # the fit refused an option: so would every trial
        raise ProjectError(f"search: trial {trial.number}'s fit: {error.removeprefix('error:').strip()}")
    if error is not None or not reporter.reported:
        trial.set_user_attr("error", f"{error or 'no val/acc in metrics.csv'} (see {folder}/fit.err)")
        raise TrialFailed(trial.user_attrs["error"])
    return max(reporter.reported.values())

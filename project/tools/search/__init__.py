"""``python -m project search --config PRESET|FILE [--out DIR] [--storage JOURNAL|URL]``: an Optuna study (TPE) of fit
options (:mod:`.config`). Each trial is an ordinary ``fit`` in ``DIR/trial-NNNN``, pruned on its epochs' ``val/acc``
(:mod:`.trials`); the study lives in a journal file or a database (:mod:`.storage`), so a search killed goes on where
it stopped and several workers share one study. It ends with the table of trials (also ``DIR/trials.md``) and the
best trial as a command."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from project.toolkit.errors import OneLineParser, ProjectError, exit_on_project_error
from project.tools.bench.matrix import ending_sessions_on_sigterm
from project.tools.search.config import SearchConfig, config_path, load_config, preset_names
from project.tools.search.storage import counted_trials, open_storage, recover_stale_trials, turn
from project.tools.search.trials import TrialFailed, option_args, run_trial

__all__ = ["main", "parse_args", "run_worker", "search", "trials_table"]
FAILED_IN_A_ROW = 3  # a worker stops after this many failed trials in a row: the next would fail too
WAIT_S = 2.0  # how often a worker with no trial left looks whether the others' running trials ended


def parse_args(argv: list[str]) -> argparse.Namespace:
    about = "Search fit options with Optuna (TPE): each trial an ordinary fit in its own run folder, pruned on its "
    about += f"epochs' val/acc; the study in a journal file or a database. Presets: {', '.join(preset_names())}."
    parser = OneLineParser(prog="python -m project search", description=about)
    parser.add_argument("--config", type=config_path, required=True, help="a preset's name or a YAML file")
    parser.add_argument("--out", type=Path, help="folder of the trials and trials.md (default: search/<study_name>)")
    storage = "a journal file or a database URL (default: the config's storage, else OUT/study.journal)"
    parser.add_argument("--storage", help=storage)
    return parser.parse_args(argv)


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _line(trial: Any) -> str:
    """``trial 3 pruned (model.lr=0.05): val acc 0.4125 after 1 epoch(s) in 12.0 s``, or the failure's reason."""
    values = ", ".join(f"{name}={_shown(value)}" for name, value in trial.params.items())
    epochs, accuracy = len(trial.intermediate_values), max(trial.intermediate_values.values(), default=None)
    result = trial.user_attrs.get("error") if accuracy is None else f"val acc {accuracy:.4f} after {epochs} epoch(s)"
    seconds = trial.user_attrs.get("seconds")
    return f"trial {trial.number} {trial.state.name.lower()} ({values}): {result} in {seconds} s"


def trials_table(study: Any, names: list[str]) -> list[str]:
    """The study's trials as a Markdown table: options, state, best val/acc, epochs run, seconds."""
    head = ["trial", *names, "state", "val acc", "epochs", "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for trial in study.get_trials(deepcopy=False):
        accuracy = max(trial.intermediate_values.values(), default=None)
        cells = [trial.number, *(_shown(trial.params.get(name, "")) for name in names), trial.state.name.lower()]
        cells += ["" if accuracy is None else f"{accuracy:.4f}", len(trial.intermediate_values)]
        lines.append("| " + " | ".join(map(str, [*cells, trial.user_attrs.get("seconds", "")])) + " |")
    return lines


def best_command(study: Any, config: SearchConfig) -> str:
    """The best complete trial and the ``fit`` that reruns it (without the search's folders)."""
    if not any(trial.state.name == "COMPLETE" for trial in study.get_trials(deepcopy=False)):
        return "no trial completed"
    best = study.best_trial
    args = ["python", "-m", "project", "fit", f"--trainer.max_epochs={config.epochs}", *config.args]
    return f"trial {best.number}, val acc {best.value:.4f}: {shlex.join([*args, *option_args(best.params)])}"


def run_worker(study: Any, config: SearchConfig, out: Path, lock: Path | None) -> bool:
    """Run trials until the study counts ``config.trials`` and none runs elsewhere; False after
    :data:`FAILED_IN_A_ROW` failed trials of this worker."""
    import optuna

    states: list[str] = []
    callbacks = [lambda study, trial: (states.append(trial.state.name), print(f"search: {_line(trial)}", flush=True))]
    while states[-FAILED_IN_A_ROW:] != ["FAIL"] * FAILED_IN_A_ROW:
        with turn(lock) as marked:
            for number in recover_stale_trials(study, lock):
                print(f"search: trial {number}'s worker is gone: failed, queued again", flush=True)
            if counted_trials(study) < config.trials:
                objective = lambda trial: run_trial(trial, config, out, marked)  # noqa: E731
                study.optimize(objective, n_trials=1, catch=(TrialFailed,), callbacks=callbacks, gc_after_trial=False)
                continue
        if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            return True
        time.sleep(WAIT_S)  # other workers' trials: they end, or their worker is gone and they run again here
    return False


def search(config_file: Path, out: Path | None, storage: str | None) -> Any:
    """Run this worker's share of the study (create it, or join it); print and write the table and the best trial."""
    config = load_config(config_file)
    try:
        import optuna
    except ImportError:
        raise ProjectError("search needs Optuna, which is not installed: pip install '.[search]'") from None
    out = (out or Path("search") / config.study_name).absolute()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # each trial has its line here
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage, lock = open_storage(storage or config.storage or str(out / "study.journal"))
    pruner = optuna.pruners.MedianPruner(config.startup_trials, config.min_epochs)
    study = optuna.create_study(
        storage=storage,
        study_name=config.study_name,
        sampler=optuna.samplers.TPESampler(seed=config.seed, constant_liar=True),  # workers spread their trials out
        pruner=pruner if config.prune else optuna.pruners.NopPruner(),
        direction="maximize",
        load_if_exists=True,
    )
    with ending_sessions_on_sigterm():  # SIGTERM ends the running trial's fit too
        done = run_worker(study, config, out, lock)
    lines = [*trials_table(study, list(config.params)), "", f"best: {best_command(study, config)}"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "trials.md").write_text(f"# Search {config.study_name}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    if not done:
        print(f"search: stopped after {FAILED_IN_A_ROW} failed trials in a row (see their fit.err)", file=sys.stderr)
        raise SystemExit(1)
    return study


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m project search``; ``argv`` replaces ``sys.argv[2:]``."""
    args = parse_args(sys.argv[2:] if argv is None else argv)
    with exit_on_project_error():
        search(args.config, args.out, args.storage)

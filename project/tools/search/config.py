"""The search file: what a preset (``configs/search/<name>.yaml``) or a YAML file of your own may say
(:func:`load_config`): the fit options searched and their ranges, the study's trial count, each trial's epochs and
fixed options, pruning, and where the study lives."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from project.toolkit.errors import ProjectError
from project.tools.bench.config import read_settings

PRESETS = Path(__file__).resolve().parents[3] / "configs" / "search"  # in a checkout
OPTION = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")  # a fit option without its dashes: model.lr, data.batch_size
RANGE_KEYS = {"low", "high", "log", "step"}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def config_path(given: str) -> Path:
    """A preset's file for its name (``cpu-smoke``), else ``given`` as a path."""
    return PRESETS / f"{given}.yaml" if given in preset_names() else Path(given)


@dataclass(frozen=True)
class Param:
    """One searched option: ``choices`` (a list), or numbers from ``low`` to ``high`` (integers when both are),
    on a log scale (``log``) or in steps (``step``)."""

    choices: list[Any] | None = None
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None


@dataclass(frozen=True)
class SearchConfig:
    """A search, as read from YAML. ``trials``: the study's count of finished (complete or pruned) trials, however
    many workers run it; ``args``: the options every trial's fit gets; ``min_epochs`` / ``startup_trials``: no trial
    is pruned before it has run that many epochs, nor before that many trials finished; ``storage``: a journal file
    or a database URL (null: ``<out>/study.journal``)."""

    params: dict[str, Param]
    trials: int = 20
    epochs: int = 10
    args: list[str] = field(default_factory=list)
    prune: bool = True
    min_epochs: int = 1
    startup_trials: int = 3
    seed: int | None = None
    study_name: str = ""
    storage: str | None = None
    timeout_minutes: float = 60.0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


_RULES: dict[str, tuple[Any, str]] = {
    "params": (lambda v: isinstance(v, dict) and bool(v), "a mapping of fit options to ranges or lists of choices"),
    "trials": (lambda v: _count(v, 1), "an integer >= 1"),
    "epochs": (lambda v: _count(v, 1), "an integer >= 1"),
    "args": (lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v), "a list of fit options"),
    "prune": (lambda v: isinstance(v, bool), "true or false"),
    "min_epochs": (lambda v: _count(v, 1), "an integer >= 1"),
    "startup_trials": (lambda v: _count(v, 0), "an integer >= 0"),
    "seed": (lambda v: v is None or _count(v, 0), "null or an integer >= 0"),
    "study_name": (lambda v: isinstance(v, str) and bool(v), "a non-empty name"),
    "storage": (lambda v: v is None or (isinstance(v, str) and bool(v)), "null, a journal file or a database URL"),
    "timeout_minutes": (lambda v: _number(v) and v > 0, "a number > 0"),
}


def _param(where: str, name: str, spec: Any) -> Param:
    """A checked :class:`Param` from ``[a, b, ...]``, ``{choices: [...]}`` or ``{low:, high:, log:, step:}``."""
    if not OPTION.fullmatch(name):
        raise ProjectError(f"{where}: params: {name!r} is not a fit option's dotted name, e.g. model.lr")
    spec = {"choices": spec} if isinstance(spec, list) else spec
    if not isinstance(spec, dict) or not spec or set(spec) - RANGE_KEYS - {"choices"}:
        allowed = "a list of choices, {choices: [...]}, or {low: .., high: .., log: true|false, step: ..}"
        raise ProjectError(f"{where}: params: {name}={spec!r} is not allowed: it must be {allowed}")
    bad = f"{where}: params: {name}={spec!r} is not allowed:"
    if "choices" in spec:
        choices = spec["choices"]
        scalars = isinstance(choices, list) and all(c is None or isinstance(c, str | int | float) for c in choices)
        if len(spec) > 1 or not scalars or not choices:
            raise ProjectError(f"{bad} choices must be a non-empty list of numbers, strings, booleans or null alone")
        return Param(choices=choices)
    low, high, log, step = (spec.get(key) for key in ("low", "high", "log", "step"))
    if not (_number(low) and _number(high) and low < high):
        raise ProjectError(f"{bad} low and high must be numbers, low below high")
    if log is not None and not isinstance(log, bool):
        raise ProjectError(f"{bad} log must be true or false")
    if log and (low <= 0 or step is not None):
        raise ProjectError(f"{bad} a log range needs low > 0 and no step")
    if step is not None and not (_number(step) and 0 < step <= high - low):
        raise ProjectError(f"{bad} step must be a number > 0, at most high - low")
    return Param(low=low, high=high, log=bool(log), step=step)


def load_config(path: Path) -> SearchConfig:
    """Read and check a search YAML file; anything wrong is a :class:`ProjectError` naming it."""
    where = f"search --config {path}"
    raw = read_settings(path, where, _RULES, preset_names())
    if "params" not in raw:
        example = "model.lr: {low: 0.01, high: 1}"
        raise ProjectError(f"{where}: missing key params (the fit options searched, e.g. {example})")
    raw["params"] = {name: _param(where, name, spec) for name, spec in raw["params"].items()}
    return SearchConfig(**{"study_name": path.stem, **raw})

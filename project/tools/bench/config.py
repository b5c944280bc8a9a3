"""The bench matrix: what a preset (``presets/<name>.yaml``, beside this file) or a YAML file of your own may say
(:func:`load_config`), and its cells (:func:`expand`) of strategies x archs x batch sizes x devices x precisions x
variants; a strategy: a name or ``pipeline-mb<N>``."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import yaml

from project.toolkit.errors import ProjectError

SINGLE = "single"  # the baseline: Lightning's default strategy on one device
NAME = re.compile(r"[A-Za-z0-9_.-]+")  # what a variant may be called: it becomes part of a folder name
PIPELINE_CELL = re.compile(r"pipeline-mb([1-9][0-9]*)")  # the pipeline with that many micro-batches
LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches")  # the Trainer's, as a preset sets them
PRESETS = Path(__file__).resolve().parent / "presets"  # installed with the package (pyproject.toml's package-data)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def config_path(given: str) -> Path:
    """A preset's file for its name (``cpu-smoke``), else ``given`` as a path."""
    return PRESETS / f"{given}.yaml" if given in preset_names() else Path(given)


def strategy_options(strategy: str) -> list[str]:
    if match := PIPELINE_CELL.fullmatch(strategy):
        pipeline = "--trainer.strategy.class_path=project.toolkit.strategies.pipeline.PipelineStrategy"
        return [pipeline, f"--trainer.strategy.init_args.micro_batches={match.group(1)}"]
    return [f"--trainer.strategy={'auto' if strategy == SINGLE else strategy}"]


@dataclass(frozen=True)
class BenchConfig:
    """A benchmark matrix, as read from YAML. ``devices``: the counts of the multi-device strategies (``single``
    runs on one); ``variants``: name -> options appended to every cell's ``args``; ``strategy_archs`` and
    ``strategy_precisions``: a strategy's archs and precisions, where not all; ``target_acc``: the validation
    accuracy whose time to reach every cell reports (``--timing.target_acc``)."""

    strategies: list[str]
    archs: list[str]
    batch_sizes: list[int]
    devices: list[int] = field(default_factory=lambda: [1])
    precision: list[str] = field(default_factory=lambda: ["32-true"])
    accelerator: str = "auto"
    epochs: int = 10
    image_size: int = 112
    limit_train_batches: int | float | None = None
    limit_val_batches: int | float | None = None
    limit_test_batches: int | float | None = None
    args: list[str] = field(default_factory=list)
    timeout_minutes: float = 60.0
    variants: dict[str, list[str]] = field(default_factory=lambda: {"": []})
    strategy_archs: dict[str, list[str]] = field(default_factory=dict)
    strategy_precisions: dict[str, list[str]] = field(default_factory=dict)
    target_acc: float | None = None

    def variant_names(self) -> list[str]:
        """The variants as cells name them: ``[""]`` (not shown) when there is only one."""
        return list(self.variants) if len(self.variants) > 1 else [""]

    def variant_args(self, name: str) -> list[str]:
        """The options of the variant a cell calls ``name`` (``""``: the only one)."""
        return next(iter(self.variants.values())) if name == "" and len(self.variants) == 1 else self.variants[name]


def _is_list_of(value: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, kind) and v is not True for v in value)


def _is_limit(value: Any) -> bool:
    """What Lightning accepts, less 1: ``--trainer.limit_*_batches=1`` parses as the float 1.0 (100 %)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return value is None or (number and ((isinstance(value, int) and value >= 2) or 0 < value < 1))


def _is_options(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(a, str) for a in value)


def _is_variants(value: Any) -> bool:
    """A non-empty mapping of names (letters, digits, ``_.-``) to lists of options."""
    names = isinstance(value, dict) and all(isinstance(k, str) and NAME.fullmatch(k) for k in value)
    return names and bool(value) and all(_is_options(v) for v in value.values())


_RULES: dict[str, tuple[Any, str]] = {
    "strategies": (lambda v: _is_list_of(v, str), "a non-empty list of strategy names (single, dp, ddp, fsdp, ...)"),
    "archs": (lambda v: _is_list_of(v, str), "a non-empty list of torchvision model names"),
    "batch_sizes": (lambda v: _is_list_of(v, int) and min(v) > 0, "a non-empty list of global batch sizes > 0"),
    "devices": (lambda v: _is_list_of(v, int) and min(v) > 0, "a non-empty list of device counts > 0"),
    "precision": (lambda v: _is_list_of(v, str | int), "a non-empty list of Lightning precisions (32-true, ...)"),
    "accelerator": (lambda v: isinstance(v, str), "an accelerator name (cpu, gpu, auto, ...)"),
    "epochs": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "image_size": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    **dict.fromkeys(LIMITS, (_is_limit, "null, a number of batches >= 2, or a fraction in (0, 1)")),
    "args": (_is_options, "a list of command-line options"),
    "timeout_minutes": (lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0, "a number > 0"),
    "variants": (
        _is_variants,
        "a non-empty mapping of variant names (letters, digits, _ . -) to lists of command-line options, "
        "e.g. {loader: [], on_device: [--data.on_device=true]}",
    ),
    "strategy_archs": (
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and _is_list_of(a, str) for k, a in v.items()),
        "a mapping of strategy names to the archs they run for, e.g. {pipeline-mb4: [resnet50]}",
    ),
    "strategy_precisions": (
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and _is_list_of(p, str) for k, p in v.items()),
        "a mapping of strategy names to the precisions they run at, e.g. {single: [32-true, bf16-mixed]}",
    ),
    "target_acc": (
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1,
        "a number in (0, 1], the validation accuracy each cell's time is taken to",
    ),
}
_REQUIRED = ("strategies", "archs", "batch_sizes")


Rules = dict[str, tuple[Callable[[Any], bool], str]]  # a key -> its check, and what it allows in words


def read_settings(path: Path, where: str, rules: Rules, presets: list[str]) -> dict[str, Any]:
    """The YAML mapping in ``path``, each key one of ``rules`` and each value passing its rule (bench's and search's
    files); anything else a :class:`ProjectError` starting with ``where``."""
    if not path.is_file():
        raise ProjectError(f"{where}: no such file, nor a preset ({', '.join(presets) or 'none found'})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ProjectError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ProjectError(f"{where}: expected a mapping of settings, found {type(raw).__name__}")
    if unknown := sorted(set(raw) - set(rules)):
        raise ProjectError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(rules)}")
    for key, value in raw.items():
        ok, allowed = rules[key]
        if not ok(value):
            raise ProjectError(f"{where}: {key}={value!r} is not allowed: it must be {allowed}")
    return raw


def load_config(path: Path) -> BenchConfig:
    """Read and check a bench YAML file; anything wrong is a :class:`ProjectError` naming it."""
    raw = read_settings(path, f"bench --config {path}", _RULES, preset_names())
    if missing := [key for key in _REQUIRED if key not in raw]:
        raise ProjectError(f"bench --config {path}: missing key(s) {', '.join(missing)}")
    if "precision" in raw:
        raw["precision"] = [str(p) for p in raw["precision"]]  # YAML reads 32 and 16 as numbers
    return BenchConfig(**raw)


@dataclass(frozen=True)
class Cell:
    strategy: str
    arch: str
    batch_size: int
    devices: int
    precision: str
    variant: str = ""  # "" where the matrix has a single variant

    @property
    def name(self) -> str:
        """The run folder's name, ``ddp-resnet50-b256-x2-32-true`` (``...-on_device`` with variants)."""
        raw = f"{self.strategy}-{self.arch}-b{self.batch_size}-x{self.devices}-{self.precision}"
        raw += f"-{self.variant}" if self.variant else ""
        return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def expand(config: BenchConfig) -> list[Cell]:
    """Every cell of the matrix, the single-device baseline first within each arch, batch, precision and variant."""
    cells = []
    grid = product(config.archs, config.batch_sizes, config.precision, config.variant_names(), config.strategies)
    for arch, batch_size, precision, variant, strategy in grid:
        runs_arch = arch in config.strategy_archs.get(strategy, [arch])
        if runs_arch and precision in config.strategy_precisions.get(strategy, [precision]):
            counts = [1] if strategy == SINGLE else config.devices
            cells += [Cell(strategy, arch, batch_size, n, precision, variant) for n in counts]
    return list(dict.fromkeys(cells))  # a strategy listed twice runs once

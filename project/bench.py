"""``python -m project bench --config configs/bench/<preset>.yaml --out DIR``: the strategy comparison.

The YAML file names a matrix -- strategies x archs x global batch sizes x device counts x
precisions -- and the settings every cell shares. Each cell runs as its own ``python -m project
fit`` and then ``test --ckpt_path=last``, in fresh processes, with ``DIR/runs/<cell>`` as its
``default_root_dir``: both log to ``lightning_logs/version_0`` there (one TensorBoard run per
cell; ``make tensorboard LOGDIR=DIR/runs`` overlays them). The cells' ``timing.json`` files (see
:mod:`project.callbacks.timing`) are collected into ``DIR/results.csv``, ``DIR/results.md`` and
``DIR/results.png``.

A cell that finished is not run again when the same command is repeated (change a setting and it
runs afresh); a cell that fails is recorded with the last line of its error output, the matrix
goes on, and the next invocation tries it again.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from project.errors import ProjectError
from project.measure.environment import machine_description
from project.measure.tables import markdown_table

SINGLE = "single"  # the baseline: Lightning's default strategy on one device
MARKER = "bench-cell.json"  # a cell's outcome, in its run folder


# --------------------------------------------------------------------------- the matrix


@dataclass(frozen=True)
class BenchConfig:
    """A benchmark matrix, as read from YAML. ``devices`` are the device counts of the
    multi-device strategies; ``single`` always runs on one."""

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


def _is_list_of(value: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, kind) and v is not True for v in value)


def _is_limit(value: Any) -> bool:
    """What Lightning accepts, less 1: ``--trainer.limit_*_batches=1`` parses as the float 1.0
    (100 %), so a one-batch limit cannot be passed on a command line."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (isinstance(value, int) and value >= 2) or 0 < value < 1


_RULES: dict[str, tuple[Any, str]] = {
    "strategies": (lambda v: _is_list_of(v, str), "a non-empty list of strategy names (single, dp, ddp, fsdp, ...)"),
    "archs": (lambda v: _is_list_of(v, str), "a non-empty list of torchvision model names"),
    "batch_sizes": (lambda v: _is_list_of(v, int) and min(v) > 0, "a non-empty list of global batch sizes > 0"),
    "devices": (lambda v: _is_list_of(v, int) and min(v) > 0, "a non-empty list of device counts > 0"),
    "precision": (lambda v: _is_list_of(v, str | int), "a non-empty list of Lightning precisions (32-true, ...)"),
    "accelerator": (lambda v: isinstance(v, str), "an accelerator name (cpu, gpu, auto, ...)"),
    "epochs": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "image_size": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "limit_train_batches": (_is_limit, "null, a number of batches >= 2, or a fraction in (0, 1)"),
    "limit_val_batches": (_is_limit, "null, a number of batches >= 2, or a fraction in (0, 1)"),
    "limit_test_batches": (_is_limit, "null, a number of batches >= 2, or a fraction in (0, 1)"),
    "args": (lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v), "a list of command-line options"),
    "timeout_minutes": (lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0, "a number > 0"),
}
_REQUIRED = ("strategies", "archs", "batch_sizes")


def load_config(path: Path) -> BenchConfig:
    """Read and check a bench YAML file; anything wrong is a :class:`ProjectError` naming it."""
    if not path.is_file():
        raise ProjectError(f"bench --config {path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ProjectError(f"bench --config {path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ProjectError(f"bench --config {path}: expected a mapping of settings, found {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_RULES))
    if unknown:
        raise ProjectError(f"bench --config {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_RULES)}")
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise ProjectError(f"bench --config {path}: missing key(s) {', '.join(missing)}")
    for key, value in raw.items():
        ok, allowed = _RULES[key]
        if not ok(value):
            raise ProjectError(f"bench --config {path}: {key}={value!r} is not allowed: it must be {allowed}")
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

    @property
    def name(self) -> str:
        """``ddp-resnet50-b256-x2-32-true``: the run folder's name, safe on any file system."""
        raw = f"{self.strategy}-{self.arch}-b{self.batch_size}-x{self.devices}-{self.precision}"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def expand(config: BenchConfig) -> list[Cell]:
    """Every cell of the matrix, the single-device baseline first within each arch and batch."""
    cells = []
    for arch in config.archs:
        for batch_size in config.batch_sizes:
            for precision in config.precision:
                for strategy in config.strategies:
                    counts = [1] if strategy == SINGLE else config.devices
                    cells += [Cell(strategy, arch, batch_size, n, precision) for n in counts]
    return list(dict.fromkeys(cells))  # a strategy listed twice runs once


def cell_args(config: BenchConfig, cell: Cell, runs: Path) -> list[str]:
    """The options ``fit`` and ``test`` share: the cell's settings, its own folder, whose
    ``lightning_logs/version_0`` is fixed as the TensorBoard run (so ``test`` adds to the run
    ``fit`` made, and ``--ckpt_path=last`` finds it), and the preset's args."""
    args = [
        f"--trainer.strategy={'auto' if cell.strategy == SINGLE else cell.strategy}",
        f"--trainer.devices={cell.devices}",
        f"--trainer.accelerator={config.accelerator}",
        f"--trainer.precision={cell.precision}",
        f"--trainer.max_epochs={config.epochs}",
        f"--model.arch={cell.arch}",
        f"--data.batch_size={cell.batch_size}",
        f"--data.image_size={config.image_size}",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={runs / cell.name}",
        "--trainer.logger.class_path=lightning.pytorch.loggers.TensorBoardLogger",
        f"--trainer.logger.init_args.save_dir={runs / cell.name}",
        "--trainer.logger.init_args.version=0",
    ]
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
        if getattr(config, key) is not None:
            args.append(f"--trainer.{key}={getattr(config, key)}")
    return args + config.args


# --------------------------------------------------------------------------- running the cells


def run_folder(runs: Path, cell: Cell) -> Path:
    """Where a cell's fit and test log (the layout of Lightning's default TensorBoard logger)."""
    return runs / cell.name / "lightning_logs" / "version_0"


def _project_command(subcommand: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "project", subcommand, *args]


def _run_logged(command: list[str], log_stem: Path, timeout_s: float) -> str | None:
    """Run ``command`` with its output in ``<log_stem>.out`` / ``.err``; None on success, else
    the error: the last line it printed to stderr (a traceback ends with the exception)."""
    with open(f"{log_stem}.out", "w") as out, open(f"{log_stem}.err", "w") as err:
        # A session of its own, so a timeout ends the launcher AND the ranks it started.
        process = subprocess.Popen(command, stdout=out, stderr=err, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return f"timed out after {timeout_s / 60:g} min"
        except BaseException:  # Ctrl-C: leave no ranks behind
            os.killpg(process.pid, signal.SIGKILL)
            raise
    if code == 0:
        return None
    lines = [line.strip() for line in Path(f"{log_stem}.err").read_text(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), f"exit code {code}")


def _finished(cell_dir: Path, args: list[str]) -> bool:
    """Whether this very cell (same options) already ran to the end."""
    try:
        marker = json.loads((cell_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("status") == "ok" and marker.get("args") == args


def run_cell(config: BenchConfig, cell: Cell, runs: Path) -> dict[str, Any]:
    """Fit then test one cell in fresh processes, from an empty run folder; record the outcome."""
    cell_dir = runs / cell.name
    shutil.rmtree(cell_dir, ignore_errors=True)  # an interrupted earlier attempt leaves nothing behind
    cell_dir.mkdir(parents=True)
    args = cell_args(config, cell, runs)
    fit, test = _project_command("fit", args), _project_command("test", [*args, "--ckpt_path=last"])
    start = time.perf_counter()
    timeout_s = config.timeout_minutes * 60
    error = _run_logged(fit, cell_dir / "fit", timeout_s)
    if error is None:
        error = _run_logged(test, cell_dir / "test", timeout_s)
        error = None if error is None else f"test: {error}"
    outcome = {
        "status": "ok" if error is None else "failed",
        "error": error,
        "cell_seconds": round(time.perf_counter() - start, 1),
        "args": args,
        "fit_command": fit,
        "test_command": test,
    }
    (cell_dir / MARKER).write_text(json.dumps(outcome, indent=2) + "\n")
    return outcome


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def run_matrix(config: BenchConfig, cells: list[Cell], runs: Path) -> None:
    """Run every cell not finished yet, printing progress: cell i/N, elapsed, estimate left."""
    todo = [c for c in cells if not _finished(runs / c.name, cell_args(config, c, runs))]
    print(f"bench: {len(cells)} cells, {len(cells) - len(todo)} finished before, {len(todo)} to run", flush=True)
    start, ran = time.perf_counter(), 0
    for i, cell in enumerate(cells, 1):
        prefix = f"[{i}/{len(cells)}] {cell.name}"
        if cell not in todo:
            print(f"{prefix}: finished before, not run again", flush=True)
            continue
        print(f"{prefix}: running", flush=True)
        outcome = run_cell(config, cell, runs)
        ran += 1
        elapsed = time.perf_counter() - start
        left = elapsed / ran * (len(todo) - ran)
        result = "ok" if outcome["status"] == "ok" else f"FAILED ({outcome['error']})"
        print(
            f"{prefix}: {result} in {outcome['cell_seconds']:.0f} s | elapsed {_clock(elapsed)} | left ~{_clock(left)}",
            flush=True,
        )


# --------------------------------------------------------------------------- collecting the results


def collect(cells: list[Cell], runs: Path) -> list[dict[str, Any]]:
    """One row per cell: the cell, its outcome, and every key of its ``timing.json``."""
    rows = []
    for cell in cells:
        cell_dir = runs / cell.name
        row: dict[str, Any] = {
            "cell": cell.name,
            "status": "not run",
            "error": None,
            "bench_strategy": cell.strategy,
            "arch": cell.arch,
            "batch_size": cell.batch_size,
            "devices": cell.devices,
            "precision": cell.precision,
        }
        if (cell_dir / MARKER).is_file():
            marker = json.loads((cell_dir / MARKER).read_text())
            row.update(status=marker["status"], error=marker["error"], cell_seconds=marker["cell_seconds"])
        timing = run_folder(runs, cell) / "timing.json"
        if row["status"] == "ok" and timing.is_file():
            row.update(json.loads(timing.read_text()))
        rows.append(row)
    return rows


def speedups(rows: list[dict[str, Any]]) -> list[float | None]:
    """Each cell's steady-state epoch time against the ``single`` cell of the same arch, batch
    and precision: ``single seconds / cell seconds`` (2.0 = twice as fast)."""
    baseline = {
        (r["arch"], r["batch_size"], r["precision"]): r.get("epoch_seconds_mean")
        for r in rows
        if r["bench_strategy"] == SINGLE and r["status"] == "ok"
    }
    result = []
    for r in rows:
        base, own = baseline.get((r["arch"], r["batch_size"], r["precision"])), r.get("epoch_seconds_mean")
        result.append(base / own if base and own else None)
    return result


def _flatten(row: dict[str, Any]) -> dict[str, Any]:
    """CSV cells: ``{"a": {"p50": 1}}`` becomes ``a_p50``; lists become JSON text."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update({f"{key}_{k}": v for k, v in value.items()})
        elif isinstance(value, list):
            flat[key] = json.dumps(value)
        else:
            flat[key] = value
    return flat


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    flat = [_flatten(r) for r in rows]
    columns = list(dict.fromkeys(key for r in flat for key in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)


def _num(value: float | None, digits: int = 3, scale: float = 1.0) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def _pm(mean: float | None, std: float | None, digits: int = 3) -> str:
    return _num(mean, digits) + ("" if std is None else f" ± {std:.{digits}f}")


def _memory(row: dict[str, Any], prefix: str) -> str:
    """``rank0 812, rank1 790``: the peak MiB of every device of the cell."""
    pairs = zip(row.get(f"{prefix}_devices", []), row.get(f"{prefix}_mb", []), strict=True)
    return ", ".join(f"{label} {_num(mb, 0)}" for label, mb in pairs)


def write_markdown(rows: list[dict[str, Any]], path: Path, command: str, machine: str) -> None:
    ok = [(r, s) for r, s in zip(rows, speedups(rows), strict=True) if r["status"] == "ok"]
    training = [
        [
            f"`{r['cell']}`",
            r["bench_strategy"],
            r["arch"],
            str(r["batch_size"]),
            str(r["devices"]),
            r["precision"],
            _num(r.get("fit_seconds"), 1),
            _pm(r.get("epoch_seconds_mean"), r.get("epoch_seconds_std"), 2),
            _num(r.get("first_epoch_seconds"), 2),
            _pm(r.get("iteration_seconds_mean"), r.get("iteration_seconds_std"), 3),
            _num(r.get("data_wait_fraction"), 1, 100),
            _num(r.get("train_samples_per_second"), 1),
            "–" if s is None else f"{s:.2f}x",
        ]
        for r, s in ok
    ]
    inference = []
    for r, _ in ok:
        latency = r.get("test_batch_latency_ms") or {}
        inference.append(
            [
                f"`{r['cell']}`",
                _pm(latency.get("mean"), latency.get("std"), 1),
                _num(latency.get("p50"), 1),
                _num(latency.get("p90"), 1),
                _num(latency.get("p99"), 1),
                _num(r.get("test_sample_latency_ms"), 2),
                _num(r.get("test_samples_per_second"), 1),
            ]
        )
    memory = [[f"`{r['cell']}`", _memory(r, "peak_memory"), _memory(r, "test_peak_memory")] for r, _ in ok]
    failed = [
        [f"`{r['cell']}`", r["status"], (r["error"] or "").replace("|", "\\|")] for r in rows if r["status"] != "ok"
    ]
    text = [
        "# Strategy benchmark",
        "",
        f"Produced by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
        f"Machine: {machine}.",
        "",
        "Each cell ran `python -m project fit` and then `python -m project test --ckpt_path=last` in fresh",
        "processes. Times are wall-clock seconds of the slowest rank with the device synchronised; the",
        "first epoch (warm-up) is shown apart and left out of the epoch mean ± std; the first iterations",
        "are left out of the iteration statistics. Throughput counts the samples of all ranks. Speed-up:",
        "the single-device cell's steady epoch time over this cell's (same arch, batch, precision).",
        "",
        "## Training",
        "",
        markdown_table(
            [
                "cell",
                "strategy",
                "arch",
                "global batch",
                "devices",
                "precision",
                "total s",
                "s/epoch",
                "first epoch s",
                "s/iteration",
                "data wait %",
                "samples/s",
                "speed-up",
            ],
            training,
        ),
        "",
        "## Inference (test)",
        "",
        markdown_table(["cell", "ms/batch", "p50 ms", "p90 ms", "p99 ms", "ms/sample", "samples/s"], inference),
        "",
        "## Peak memory per rank (MiB)",
        "",
        "CUDA: peak allocated per GPU; CPU: each process's peak resident memory.",
        "",
        markdown_table(["cell", "fit", "test"], memory),
        "",
    ]
    if failed:
        text += ["## Cells that did not finish", "", markdown_table(["cell", "status", "error"], failed), ""]
    path.write_text("\n".join(text))


def write_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Per arch: steady epoch time per cell (mean ± std) above, peak memory per rank below."""
    try:
        import matplotlib
    except ImportError:
        raise ProjectError("the chart needs matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    archs = list(dict.fromkeys(r["arch"] for r in ok)) or ["(no finished cell)"]
    widest = max([sum(r["arch"] == a for r in ok) for a in archs] + [1])
    fig, axes = plt.subplots(2, len(archs), figsize=(max(5.0, 1.3 * widest + 2) * len(archs), 8), squeeze=False)
    for column, arch in enumerate(archs):
        cells = [r for r in ok if r["arch"] == arch]
        labels = [f"{r['bench_strategy']} x{r['devices']}\nb{r['batch_size']} {r['precision']}" for r in cells]
        positions = list(range(len(cells)))
        means = [r.get("epoch_seconds_mean") or math.nan for r in cells]
        stds = [r.get("epoch_seconds_std") or 0.0 for r in cells]
        top, bottom = axes[0][column], axes[1][column]
        top.bar(positions, means, yerr=stds, capsize=4, color="tab:blue")
        top.set_title(f"{arch}: seconds per epoch (steady, mean ± std)")
        top.set_xticks(positions, labels, fontsize=8)
        top.set_ylabel("s / epoch")
        # One bar per rank (per GPU when one process drives several), named after the widest cell.
        names = max([r.get("peak_memory_devices", []) for r in cells] + [["rank0"]], key=len)
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = [(r.get("peak_memory_mb") or [])[i:][:1] for r in cells]
            bottom.bar(
                [p - 0.4 + width * (i + 0.5) for p in positions],
                [v[0] if v and v[0] is not None else math.nan for v in values],
                width=width,
                label=name,
            )
        bottom.set_title(f"{arch}: peak memory per rank (fit)")
        bottom.set_xticks(positions, labels, fontsize=8)
        bottom.set_ylabel("MiB")
        bottom.margins(y=0.2)  # room for the legend above the bars
        bottom.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- the command


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m project bench",
        description="Run a matrix of strategies x archs x batch sizes x device counts x precisions, each cell as its "
        "own fit + test, and compare their time and memory.",
    )
    parser.add_argument("--config", type=Path, required=True, help="the matrix: configs/bench/<preset>.yaml")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.{csv,md,png} and runs/")
    return parser.parse_args(argv)


def bench(config_path: Path, out: Path, command: str) -> list[dict[str, Any]]:
    """Run (or resume) the matrix of ``config_path`` into ``out`` and write the three result files."""
    config = load_config(config_path)
    if out.exists() and not out.is_dir():
        raise ProjectError(f"bench --out {out}: is a file; it must be a folder (or not exist yet)")
    out.mkdir(parents=True, exist_ok=True)
    runs = (out / "runs").resolve()
    cells = expand(config)
    run_matrix(config, cells, runs)
    rows = collect(cells, runs)
    machine = machine_description()
    write_csv(rows, out / "results.csv")
    write_markdown(rows, out / "results.md", command, machine)
    write_chart(rows, out / "results.png", f"{config_path.stem} ({machine})")
    done = sum(r["status"] == "ok" for r in rows)
    print(f"bench: {done}/{len(rows)} cells finished; results in {out}/results.{{csv,md,png}}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m project bench``; ``argv`` replaces ``sys.argv[2:]`` (for tests)."""
    argv = sys.argv[2:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "project", "bench", *argv])
    try:
        bench(args.config, args.out, command)
    except ProjectError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None

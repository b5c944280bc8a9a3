"""``python -m project compare RUN_DIR... --out DIR``: finished runs' ``timing.json`` into bench's result files."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from project.toolkit.errors import OneLineParser, ProjectError, exit_on_project_error
from project.tools.bench.chart import write_chart_if_possible
from project.tools.bench.config import SINGLE
from project.tools.bench.report import write_csv, write_markdown

COMPARE_HELP = "Compare finished runs: their timing.json files into results.{csv,md,png}, as bench writes them."
TIMING = "timing.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m project compare", description=f"{COMPARE_HELP} Trains nothing.")
    below = "a folder without one stands for every run folder below it that has one"
    text = f"run folders holding a timing.json (lightning_logs/version_0, ...); {below}"
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help=text)
    parser.add_argument("--out", type=Path, required=True, help="folder for results.{csv,md,png}")
    return parser.parse_args(argv)


def timing_files(run_dirs: list[str]) -> list[Path]:
    """The ``timing.json`` of every run folder named, in order, each once; a bad folder is a :class:`ProjectError`."""
    found: list[Path] = []
    for given in run_dirs:
        folder = Path(given)
        if not folder.is_dir():
            what = "is a file" if folder.exists() else "does not exist"
            raise ProjectError(f"compare: RUN_DIR {given} {what}; give run folders, e.g. lightning_logs/version_0")
        below = [folder / TIMING] if (folder / TIMING).is_file() else sorted(folder.rglob(TIMING))
        if not below:
            raise ProjectError(
                f"compare: no {TIMING} in {given} nor below it; give the run folder of a finished fit "
                "(e.g. lightning_logs/version_0; --callbacks.timing=false and --trainer.logger=false write none)"
            )
        found += [path for path in below if path not in found]
    return found


def run_row(path: Path, name: str) -> dict[str, Any]:
    """A run as a bench cell: its settings in bench's columns, then every key of its ``timing.json``."""
    try:
        timing = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ProjectError(f"compare: {path} is not a readable JSON file ({err})") from None
    if not isinstance(timing, dict):
        raise ProjectError(f"compare: {path} holds no timing record (a JSON object)")
    strategy = timing.get("strategy")  # one device under Lightning's own: the speed-ups' baseline, as in bench
    strategy = SINGLE if strategy == "single_device" else strategy
    row = {"cell": name, "status": "ok", "error": None, "bench_strategy": strategy}
    return {**row, **{key: timing.get(key) for key in ("arch", "batch_size", "devices", "precision")}, **timing}


def cell_names(folders: list[Path]) -> list[str]:
    """Each run folder's path below the folder all of them share (``version_0``, ``a/lightning_logs/version_0``)."""
    resolved = [folder.resolve() for folder in folders]
    common = Path(os.path.commonpath(resolved))
    return [str(folder.relative_to(common)) if folder != common else folder.name for folder in resolved]


def compare(run_dirs: list[str], out: Path, command: str) -> list[dict[str, Any]]:
    """Write ``out/results.{csv,md,png}`` from the runs' ``timing.json`` files; return the rows."""
    files = timing_files(run_dirs)
    if out.exists() and not out.is_dir():
        raise ProjectError(f"compare --out {out}: is a file; it must be a folder (or not exist yet)")
    rows = [run_row(path, name) for path, name in zip(files, cell_names([p.parent for p in files]), strict=True)]
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "results.csv")
    how = "Each cell is a finished run, read from the `timing.json` its fit (and test) wrote."
    machine = "each run's own, as its timing.json records it (Environment, below)"
    write_markdown(rows, out / "results.md", command, machine, title="Run comparison", how=how)
    written = write_chart_if_possible(rows, out / "results.png", f"{len(rows)} runs compared")
    print(f"compare: {len(rows)} runs; results in {out}/results.{{{written}}}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m project compare``; ``argv`` replaces ``sys.argv[2:]``."""
    argv = sys.argv[2:] if argv is None else argv
    args = parse_args(argv)
    with exit_on_project_error():
        compare(args.run_dirs, args.out, shlex.join(["python", "-m", "project", "compare", *argv]))

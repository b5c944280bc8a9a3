"""``python -m project bench --config PRESET|FILE --out DIR``: the strategy comparison. Each cell of the matrix
(:mod:`.config`) runs as ``fit`` then ``test`` in fresh processes into ``DIR/runs/<cell>``, again only if it failed
(:mod:`.matrix`); each ``timing.json`` feeds ``DIR/results.{csv,md,png}`` (:mod:`.report`, :mod:`.chart`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from project.toolkit.errors import OneLineParser, ProjectError, exit_on_project_error
from project.tools.bench.chart import chart_figure, write_chart, write_chart_if_possible
from project.tools.bench.config import BenchConfig, Cell, config_path, expand, load_config, preset_names
from project.tools.bench.matrix import cell_args, collect, ending_sessions_on_sigterm, run_folder, run_matrix
from project.tools.bench.report import speedups, write_csv, write_markdown

__all__ = ["BenchConfig", "Cell", "bench", "cell_args", "chart_figure", "collect", "config_path", "expand"]
__all__ += ["load_config", "main"]
__all__ += ["parse_args", "run_folder", "run_matrix", "speedups", "write_chart", "write_csv", "write_markdown"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    about = "Run a matrix of strategies x archs x batch sizes x device counts x precisions (x variants), each cell as "
    about += f"its own fit + test, and compare their time and memory. Presets: {', '.join(preset_names())}."
    parser = OneLineParser(prog="python -m project bench", description=about)
    parser.add_argument("--config", type=config_path, required=True, help="the matrix: a preset's name, or a YAML file")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.{csv,md,png} and runs/")
    return parser.parse_args(argv)


def bench(config_file: Path, out: Path, command: str) -> list[dict[str, Any]]:
    """Run (or resume) the matrix of ``config_file`` into ``out`` and write the three result files."""
    from project.toolkit.timing.environment import machine_description  # imports torch

    config = load_config(config_file)
    if out.exists() and not out.is_dir():
        raise ProjectError(f"bench --out {out}: is a file; it must be a folder (or not exist yet)")
    out.mkdir(parents=True, exist_ok=True)
    runs = (out / "runs").resolve()
    cells = expand(config)
    with ending_sessions_on_sigterm():  # a time limit's SIGTERM ends the cell's ranks too
        run_matrix(config, cells, runs)
    rows = collect(cells, runs)
    machine = machine_description()
    write_csv(rows, out / "results.csv")
    write_markdown(rows, out / "results.md", command, machine)
    written = write_chart_if_possible(rows, out / "results.png", f"{config_file.stem} ({machine})")
    done = sum(r["status"] == "ok" for r in rows)
    print(f"bench: {done}/{len(rows)} cells finished; results in {out}/results.{{{written}}}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m project bench``; ``argv`` replaces ``sys.argv[2:]``."""
    argv = sys.argv[2:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "project", "bench", *argv])
    with exit_on_project_error():
        bench(args.config, args.out, command)

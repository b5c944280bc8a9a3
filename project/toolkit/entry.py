"""``python -m project``: which program a command line is for, decided before anything heavy is imported.

``fit``, ``validate``, ``test`` and ``predict`` are LightningCLI's (:mod:`project.toolkit.cli`), which needs torch
and Lightning: about 6 s of imports before the first line of output. ``bench`` only starts runs and
reads their results, ``compare`` and ``plan`` only read them, and the top-level help only lists the commands,
so these answer without importing either (a twentieth of a second), as does a mistyped command.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from project.toolkit.commands import TRAINER_COMMANDS, top_level_help, unknown_command
from project.toolkit.process_exit import end_program

# The module whose main() answers each of the tool commands (commands.TOOL_COMMANDS, which the help lists).
TOOLS = {
    "bench": "project.toolkit.bench",
    "compare": "project.toolkit.bench.compare",
    "plan": "project.toolkit.bench.plan",
}


def main(args: list[str] | None = None, model: str = "", data: str = "") -> Any:
    """Entry point of ``python -m project``; ``args`` replaces ``sys.argv[1:]`` (for tests). ``model`` and
    ``data`` are the dotted paths of the template's LightningModule and default data set."""
    argv = sys.argv[1:] if args is None else list(args)
    if not argv or argv[0] in ("-h", "--help"):
        print(top_level_help())
        raise SystemExit(0 if argv else 2)
    if argv[0] in TOOLS:  # imported only when asked for: no torch for any of them
        importlib.import_module(TOOLS[argv[0]]).main(argv[1:])
        return
    if not argv[0].startswith("-") and argv[0] not in TRAINER_COMMANDS:
        print(f"error: {unknown_command(argv[0])}", file=sys.stderr)
        raise SystemExit(2)
    from project.toolkit.cli import main as cli_main  # torch and Lightning: only the trainer commands need them

    if args is not None:  # called from Python (tests): the caller's process goes on
        return cli_main(argv, model=model, data=data)
    try:
        cli = cli_main(None, model=model, data=data)  # None: LightningCLI reads sys.argv itself, without a warning
    except BaseException as outcome:
        end_program(outcome)  # returns unless the process has a gloo group (project/toolkit/process_exit.py)
        raise
    end_program(None)
    return cli

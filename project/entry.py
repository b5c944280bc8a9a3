"""``python -m project``: which program a command line is for, decided before anything heavy is imported.

``fit``, ``validate``, ``test`` and ``predict`` are LightningCLI's (:mod:`project.cli`), which needs torch
and Lightning: about 6 s of imports before the first line of output. ``bench`` only starts runs and
reads their results, ``compare`` only reads them, and the top-level help only lists the commands,
so these answer without importing either (a twentieth of a second), as does a mistyped command.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable
from typing import NoReturn

# What each command does, as the top-level help lists it. The trainer commands are Lightning's
# (tests/test_entry.py checks this list against LightningCLI.subcommands()).
TRAINER_COMMANDS = {
    "fit": "train the model (validating every epoch); a run folder with checkpoints, timing.json, TensorBoard",
    "validate": "evaluate on the validation split (--ckpt_path=best, last or a file)",
    "test": "evaluate on the test split (--ckpt_path=best, last or a file)",
    "predict": "class probabilities for the test images, written to predictions.csv",
}
TOOL_COMMANDS = {
    "bench": "run a matrix of strategies, archs, batch sizes, devices and precisions; compare time and memory",
    "compare": "compare finished runs (their timing.json) in the same results.{csv,md,png} as bench",
}
USAGE = "python -m project"


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one ``error:`` line (exit 2) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def top_level_help() -> str:
    """The help of ``python -m project``: its commands, and where each one's options are listed."""
    width = max(map(len, {**TRAINER_COMMANDS, **TOOL_COMMANDS}))
    lines = [
        f"usage: {USAGE} [-c CONFIG] {{{','.join([*TRAINER_COMMANDS, *TOOL_COMMANDS])}}} ...",
        "",
        "Train, evaluate and time one image classifier (a LightningCLI), and compare strategies.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {text}" for name, text in {**TRAINER_COMMANDS, **TOOL_COMMANDS}.items()),
        "",
        f"Each command's options: {USAGE} COMMAND --help (e.g. {USAGE} fit --help).",
        f"A config file goes before or after the command: {USAGE} fit --config configs/default.yaml",
        "Options are documented in docs/options.md; the strategies in docs/strategies.md.",
    ]
    return "\n".join(lines)


def unknown_command(name: str) -> str:
    """The one line for a command that is not one, with the nearest command if there is one.

    >>> unknown_command("fitt")
    "'fitt' is not a command; did you mean 'fit'? Commands: fit, validate, test, predict, bench, compare"
    """
    commands = [*TRAINER_COMMANDS, *TOOL_COMMANDS]
    near = difflib.get_close_matches(name, commands, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ";"
    return f"{name!r} is not a command{hint} Commands: {', '.join(commands)}"


def with_option_hints(message: str, options: Iterable[str]) -> str:
    """A parser's message about unknown options, with the nearest known option to each of them.

    >>> with_option_hints("unrecognized arguments: --data.batchsize=64", ["--data.batch_size", "--data.data_dir"])
    'unrecognized arguments: --data.batchsize=64; did you mean --data.batch_size?'
    >>> with_option_hints("Subcommand 'fit' does not accept option 'model.lrr'", ["--model.lr"])
    "Subcommand 'fit' does not accept option 'model.lrr'; did you mean --model.lr?"
    """
    _, _, unrecognized = message.partition("unrecognized arguments:")
    unknown = re.findall(r"(--[\w.-]+)", unrecognized)
    unknown += [f"--{key}" for key in re.findall(r"does not accept option '([^']+)'", message)]
    options = list(options)
    near = [match[0] for name in unknown if (match := difflib.get_close_matches(name, options, n=1))]
    return f"{message}; did you mean {' or '.join(dict.fromkeys(near))}?" if near else message


def main(args: list[str] | None = None) -> None:
    """Entry point of ``python -m project``; ``args`` replaces ``sys.argv[1:]`` (for tests)."""
    argv = sys.argv[1:] if args is None else list(args)
    if not argv or argv[0] in ("-h", "--help"):
        print(top_level_help())
        raise SystemExit(0 if argv else 2)
    if argv[0] == "bench":
        from project.bench import main as bench_main

        bench_main(argv[1:])
        return
    if argv[0] == "compare":
        from project.bench.compare import main as compare_main

        compare_main(argv[1:])
        return
    if not argv[0].startswith("-") and argv[0] not in TRAINER_COMMANDS:
        print(f"error: {unknown_command(argv[0])}", file=sys.stderr)
        raise SystemExit(2)
    from project.cli import main as cli_main  # torch and Lightning: only the trainer commands need them

    cli_main(None if args is None else argv)  # None: LightningCLI reads sys.argv itself, without a warning

"""``python -m project``: which program a command line is for, decided before anything heavy is imported: the trainer
commands are LightningCLI's (seconds of torch and Lightning imports); the offline tools are a package of their own,
named by the template (``project/__main__.py``); the help and a typo import neither."""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Any

from project.toolkit.cli.process_exit import end_program

# What each command does, as the top-level help lists it (tests/unit/test_entry.py checks LightningCLI's).
TRAINER_COMMANDS = {
    "fit": "train the model (validating every epoch); a run folder with checkpoints, timing.json, TensorBoard",
    "validate": "evaluate on the validation split (--ckpt_path=best, last or a file)",
    "test": "evaluate on the test split (--ckpt_path=best, last or a file); per-class scores, confusion matrix",
    "predict": "the predicted class of every test image (name, probability, top 5), written to predictions.csv",
}
USAGE = "python -m project"


def tool_commands(tools: str) -> dict[str, tuple[str, str]]:
    """The offline commands of the package ``tools`` (its ``COMMANDS``: name -> module, text); none without one."""
    return importlib.import_module(tools).COMMANDS if tools else {}


def top_level_help(tools: str = "") -> str:
    """The help of ``python -m project``: its commands, and where each one's options are listed."""
    texts = TRAINER_COMMANDS | {name: text for name, (_, text) in tool_commands(tools).items()}
    width = max(map(len, texts))
    lines = [
        f"usage: {USAGE} [-c CONFIG] {{{','.join(texts)}}} ...",
        "",
        "Train, evaluate and time one image classifier (a LightningCLI), and compare strategies.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {text}" for name, text in texts.items()),
        "",
        f"Each command's options: {USAGE} COMMAND --help (e.g. {USAGE} fit --help).",
        f"A config file goes before or after the command: {USAGE} fit --config configs/default.yaml",
        "Options are documented in docs/options.md; the strategies in docs/strategies.md.",
    ]
    return "\n".join(lines)


def unknown_command(name: str, tools: str = "") -> str:
    """The one line for a command that is not one, with the nearest command if there is one."""
    commands = [*TRAINER_COMMANDS, *tool_commands(tools)]
    near = difflib.get_close_matches(name, commands, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ";"
    return f"{name!r} is not a command{hint} Commands: {', '.join(commands)}"


def main(args: list[str] | None = None, model: str = "", data: str = "", tools: str = "") -> Any:
    """Entry point of ``python -m project``; ``args`` replaces ``sys.argv[1:]``. ``model`` and ``data``: the dotted
    paths of the template's LightningModule and default data set; ``tools``: the package of the offline commands."""
    argv = sys.argv[1:] if args is None else list(args)
    if not argv or argv[0] in ("-h", "--help"):
        print(top_level_help(tools))
        raise SystemExit(0 if argv else 2)
    if argv[0] not in TRAINER_COMMANDS and not argv[0].startswith("-"):
        tool = tool_commands(tools).get(argv[0])
        if tool is None:
            print(f"error: {unknown_command(argv[0], tools)}", file=sys.stderr)
            raise SystemExit(2)
        extra = {"model": model} if argv[0] == "export" else {}  # a checkpoint may not name its model class
        importlib.import_module(tool[0]).main(argv[1:], **extra)  # imported only when asked for
        return
    from project.toolkit.cli.lightning_cli import main as cli_main  # torch and Lightning

    if args is not None:  # called from Python (tests): the caller's process goes on
        return cli_main(argv, model=model, data=data)
    try:
        cli = cli_main(None, model=model, data=data)  # None: LightningCLI reads sys.argv itself, without a warning
    except BaseException as outcome:
        end_program(outcome)  # returns unless the process has a gloo group
        raise
    end_program(None)
    return cli

"""The commands of ``python -m project`` and the one-line errors of their parsers: shared by the
dispatcher (:mod:`.entry`), the LightningCLI (:mod:`.cli`) and the tools (:mod:`.bench`), none of
which needs torch to read them."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

# What each command does, as the top-level help lists it. The trainer commands are Lightning's
# (tests/test_entry.py checks this list against LightningCLI.subcommands()).
TRAINER_COMMANDS = {
    "fit": "train the model (validating every epoch); a run folder with checkpoints, timing.json, TensorBoard",
    "validate": "evaluate on the validation split (--ckpt_path=best, last or a file)",
    "test": "evaluate on the test split (--ckpt_path=best, last or a file)",
    "predict": "the predicted class of every test image (index and name), written to predictions.csv",
}
TOOL_COMMANDS = {
    "bench": "run a matrix of strategies, archs, batch sizes, devices and precisions; compare time and memory",
    "compare": "compare finished runs (their timing.json) in the same results.{csv,md,png} as bench",
    "plan": "predict each strategy's step time, throughput and memory on N devices from one run's timing.json",
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
    "'fitt' is not a command; did you mean 'fit'? Commands: fit, validate, test, predict, bench, compare, plan"
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


def config_shape_error(message: str, argv: Iterable[str]) -> str | None:
    """For jsonargparse's ``Unexpected config: - a - b`` (a config file that is a list or a single value,
    not a mapping of options), a line naming the file and what it must hold; None for other messages.

    >>> config_shape_error("Unexpected config: - a", ["fit", "--config=missing.yaml"])
    'a config file must be a mapping of options (key: value), e.g. "trainer: {max_epochs: 5}"; found: - a'
    """
    if not message.startswith("Unexpected config"):
        return None
    import yaml  # only on this error: the commands answer without it otherwise

    found = " ".join(message.partition(":")[2].split())  # the YAML as jsonargparse shows it, on one line
    words = list(argv)
    values = [word.partition("=")[2] if "=" in word else nxt for word, nxt in zip(words, [*words[1:], ""], strict=True)]
    for value in values:
        path = Path(value) if value else None
        if path is not None and path.suffix in (".yaml", ".yml", ".json") and path.is_file():
            try:
                content = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if not isinstance(content, dict):
                kind = "a list" if isinstance(content, list) else f"a single value ({type(content).__name__})"
                return (
                    f"{path}: a config file must be a mapping of options (key: value), e.g. "
                    f'"trainer: {{max_epochs: 5}}"; this one holds {kind}: {found}'
                )
    return f'a config file must be a mapping of options (key: value), e.g. "trainer: {{max_epochs: 5}}"; found: {found}'

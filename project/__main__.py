"""``python -m project fit|validate|test|predict|bench|compare|plan|export|search ...``: the toolkit's command
line, with this template's LightningModule and its default data set (``--data=package.module.Class`` picks another).
Named by dotted path, so ``--help``, ``bench`` and ``compare`` answer without importing torch."""

from __future__ import annotations

from typing import Any

from project.toolkit.cli import main as toolkit_main

MODEL = "project.model.ImageClassifier"
DEFAULT_DATA = "project.data.CIFAR10DataModule"
TOOLS = "project.tools"  # bench, compare, plan, export, search: offline commands, which no training run loads


def main(args: list[str] | None = None) -> Any:
    """``python -m project``; ``args`` replaces ``sys.argv[1:]`` (for tests). Returns the LightningCLI
    of a trainer command."""
    return toolkit_main(args, model=MODEL, data=DEFAULT_DATA, tools=TOOLS)


if __name__ == "__main__":
    main()

"""The exception for what the user can fix (name the bad value, what is allowed): one ``error:`` line, no traceback."""

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn


class ProjectError(Exception):
    """An error caused by input the user can change; its message is shown without a traceback."""


class DataError(ProjectError):
    """The data set is missing, incomplete, corrupted or cannot be split as asked."""


@contextmanager
def exit_on_project_error() -> Iterator[None]:
    """Turn a :class:`ProjectError` raised inside into its ``error:`` line and exit status 2 (the tool commands)."""
    try:
        yield
    except ProjectError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one ``error:`` line (exit 2) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)

"""Every private name of a library the template uses, in one place, each for something no public API does.

``tests/test_compat.py`` checks each against the installed libraries, so a rename fails that test loudly
instead of silently turning a feature off.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any


def restart_training_batches(trainer: Any) -> None:
    """Make the fit loop draw its batches afresh from the training loader, whose sampler was just moved (to a
    mid-epoch resume's position): Lightning made the loader's iterator before the checkpoint set the epoch."""
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is not None:  # None before the loop has set it up: it then starts afresh anyway
        iter(fetcher)


def shut_down_threads() -> None:
    """What Python does first at its shutdown: the threading module's exit callbacks (they stop idle
    ThreadPoolExecutor workers, which a plain join would wait on), then the join of non-daemon threads."""
    threading._shutdown()


def run_exit_handlers() -> None:
    """The handlers registered with :mod:`atexit`, run now, while the interpreter is fully alive."""
    atexit._run_exitfuncs()

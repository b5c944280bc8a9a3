"""How a process that joined a gloo process group ends: a gloo worker thread taking the GIL during the interpreter's
shutdown aborts a finished run (``terminate called without an active exception``, exit -6; ``fully_shard``'s modules
keep the group alive), so such a process ends with ``os._exit`` once the exit handlers ran and the output is flushed."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

from project.toolkit.compat import run_exit_handlers, shut_down_threads


def in_gloo_process_group() -> bool:
    """Whether this process has joined a gloo process group (without importing torch when nothing has)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"


def leave_gloo_process_group() -> None:
    """Destroy this process's gloo group (an exit handler; Lightning never does), joining its threads where nothing
    else holds it. NCCL groups are left alone: destroying one after a failed collective can hang."""
    if in_gloo_process_group():
        sys.modules["torch.distributed"].destroy_process_group()


def end_program(outcome: BaseException | None) -> None:
    """End the process now if it has a gloo group, as Python would after ``outcome`` (None: returned; an exception is
    printed), in Python's order up to its shutdown: threads, exit handlers, flushed output, ``os._exit``."""
    if not in_gloo_process_group():
        return
    status = 0 if outcome is None else 130 if isinstance(outcome, KeyboardInterrupt) else 1
    if isinstance(outcome, SystemExit) and isinstance(outcome.code, int | None):
        status = outcome.code or 0
    elif isinstance(outcome, SystemExit):  # a message: printed, as Python does
        print(outcome.code, file=sys.stderr)
    elif outcome is not None:
        sys.excepthook(type(outcome), outcome, outcome.__traceback__)
    shut_down_threads()
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to flush
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):  # C's own buffers (native libraries' printf)
        ctypes.CDLL(None).fflush(None)
    os._exit(status)

"""How a process that joined a gloo process group ends, so that a run that finished cannot abort on its way out.

A gloo worker thread lets go of a finished collective's tensors after the caller has moved on, and letting go of
a tensor that Python also holds takes the GIL. If the worker asks for the GIL just before Python starts shutting
down and gets it during the shutdown, Python ends the thread inside a C++ destructor that cannot unwind, and the
whole process aborts: ``terminate called without an active exception``, exit status -6 (seen in a core dump:
the worker destroying an ``AsyncBroadcastWork`` during ``Py_FinalizeEx``'s last garbage collection; about one
fsdp run in seven on 2 CPU processes). Destroying the group would join its worker threads first, but only once
nothing holds the group any more, and ``fully_shard``'s modules keep theirs to the end.

So ``python -m project`` ends such a process the way ``os._exit`` exists for: after the exit handlers have run
and the output is flushed, without the interpreter's shutdown (:func:`end_program`). A process without a gloo
group (one device, NCCL, the tool commands) exits as usual.
"""

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
    """Destroy this process's gloo process group, if it has one; an exit handler (registered by the CLI).

    Lightning never destroys the group. Destroying it frees it, and joins its worker threads, when nothing else
    holds it (ddp); it is local to the process, so it is safe after a failure too. NCCL groups are left alone,
    since destroying one after a failed collective can hang.
    """
    if in_gloo_process_group():
        sys.modules["torch.distributed"].destroy_process_group()


def exit_status(code: object) -> int:
    """The status Python exits with for ``SystemExit(code)``, printing ``code`` where Python would."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def end_program(outcome: BaseException | None) -> None:
    """End ``python -m project`` now, if this process has a gloo group, as Python would have ended it after
    ``outcome`` (None: the program returned; a ``SystemExit``; another exception, printed as Python prints it,
    status 1, or 130 for Ctrl-C as a shell reports it). Python's own order up to its shutdown: the threading
    module's exit callbacks and the join of non-daemon threads, then the exit handlers; then the output is
    flushed and the process ends (``os._exit``). Returns where the process has no gloo group."""
    if not in_gloo_process_group():
        return
    if outcome is None:
        status = 0
    elif isinstance(outcome, SystemExit):
        status = exit_status(outcome.code)
    else:
        sys.excepthook(type(outcome), outcome, outcome.__traceback__)
        status = 130 if isinstance(outcome, KeyboardInterrupt) else 1
    shut_down_threads()
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to flush
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):  # C's own buffers (native libraries' printf)
        ctypes.CDLL(None).fflush(None)
    os._exit(status)

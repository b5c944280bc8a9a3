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

import atexit
import contextlib
import os
import sys
import threading


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


def end_program(code: int | str | None) -> None:
    """End ``python -m project`` with ``code`` (``SystemExit``'s meaning) now, if this process has a gloo group:
    join the program's own threads, run the exit handlers, flush, ``os._exit``. Returns where there is none."""
    if not in_gloo_process_group():
        return
    if isinstance(code, str):  # as Python does with SystemExit("message")
        print(code, file=sys.stderr)
        code = 1
    for thread in threading.enumerate():  # Python joins non-daemon threads before its exit handlers
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # noqa: SLF001 - the handlers Python would run, while it is fully alive
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to flush
            stream.flush()
    os._exit(code or 0)

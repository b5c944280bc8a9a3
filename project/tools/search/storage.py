"""Where the study lives, and how workers share it: a journal file (the default; several processes on one machine)
or a database URL (workers on several machines), as Optuna documents. A database's trials send heartbeats: one
silent past its grace period (its worker was killed) is failed and queued again. Optuna's journal has no heartbeat:
here a running trial whose worker's process on this machine is gone is failed and queued again, by a worker holding
the journal's lock, under which it also counts the study's trials and takes its next one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from project.toolkit.errors import ProjectError

WORKER = "worker"  # a trial's user attribute: host:pid of the search process running it
HEARTBEAT_S = 60  # a database's trials: how often each says it is alive; failed after twice that in silence
MAX_RETRY = 3  # how often a trial whose worker died is queued again


def open_storage(given: str) -> tuple[Any, Path | None]:
    """The study's storage for a database URL or a journal file's path, and the journal's lock file (None for a
    database)."""
    import optuna

    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)
    if "://" in given:
        heartbeat = {"heartbeat_interval": HEARTBEAT_S, "grace_period": 2 * HEARTBEAT_S}
        try:
            return optuna.storages.RDBStorage(given, **heartbeat, heartbeat_stale_trial_callback=retry), None
        except Exception as err:  # a driver missing, a URL not understood, a server not reached: one line
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ProjectError(
                f"search --storage {given}: Optuna cannot open this database ({reason}); give a journal file's path, "
                "or a database URL such as postgresql://user:password@host/db"
            ) from None
    path = Path(given)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        backend = optuna.storages.journal.JournalFileBackend(str(path))
    except OSError as err:
        raise ProjectError(f"search --storage {given}: cannot write a journal file there ({err.strerror})") from None
    return optuna.storages.JournalStorage(backend), path.with_name(path.name + ".workers.lock")


@contextlib.contextmanager
def turn(lock: Path | None) -> Iterator[Callable[[], None]]:
    """A worker's turn at the journal, from counting the study's trials until its new trial is marked with the worker
    (it calls what this yields): no other worker counts or recovers meanwhile. A database needs none."""
    if lock is None:
        yield lambda: None
        return
    with open(lock, "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        yield lambda: fcntl.flock(file, fcntl.LOCK_UN)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        pass
    return False


def recover_stale_trials(study: Any, lock: Path | None) -> list[int]:
    """Fail and queue again (with their options) the running trials whose worker is gone: in a database those whose
    heartbeat stopped (Optuna's), in a journal those of workers on this machine whose process is gone (the numbers of
    these). Call it in the journal's :func:`turn`."""
    import optuna

    if lock is None:
        optuna.storages.fail_stale_trials(study)
        return []
    host, recovered = socket.gethostname(), []
    for trial in study.get_trials(states=(optuna.trial.TrialState.RUNNING,)):  # copies: the retry edits them
        worker_host, _, pid = str(trial.user_attrs.get(WORKER, "")).rpartition(":")
        if worker_host == host and pid.isdigit() and _gone(int(pid)):
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)(study, trial)
            recovered.append(trial.number)
    return recovered


def counted_trials(study: Any) -> int:
    """The trials the study's count includes: finished (complete or pruned) and running."""
    import optuna

    states = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING
    return len(study.get_trials(deepcopy=False, states=states))

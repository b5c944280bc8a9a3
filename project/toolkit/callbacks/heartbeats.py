"""Notice a process of a run on another machine that stopped answering, for :class:`~.guards.Guards`.

Each process writes a beat into the run's rendezvous store (the TCPStore at ``MASTER_ADDR:MASTER_PORT`` that
torch's env:// rendezvous, torchrun and Lightning under SLURM all start on node 0) and reads the others'. A beat
that has not moved for ``lost_after`` seconds, or a store that has not answered for as long, means that process or
its machine is gone, or the network to it: a collective waiting on it would never return. The store is reached
through a connection of its own, each exchange in a thread given up after a few seconds: a read from a machine cut
off returns only when TCP gives up (minutes), whatever the store's own timeout.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from project.toolkit.log import get_logger

log = get_logger(__name__)

PREFIX = "project/heartbeat"
DONE = "done"  # a process's last beat: it ended its part of the run, it is not lost


class Heartbeats:
    """The beats of every process of a run, seen from this one (global ``rank`` of ``world``, on ``node``)."""

    def __init__(self, rank: int, world: int, node: int, lost_after: float) -> None:
        self.rank, self.world, self.node, self.lost_after = rank, world, node, lost_after
        self.address = (os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", "0") or 0))
        self._store: dist.TCPStore | None = None
        self._timeout = max(1.0, min(10.0, lost_after / 4))  # seconds an exchange with the store may take
        self._beats = 0
        self._answered = time.monotonic()  # when the store last answered a read
        self._started = self._answered
        self._seen: dict[int, tuple[str, float]] = {}  # rank: (its last beat, when it changed)

    @property
    def usable(self) -> bool:
        """Whether the run's store is known (torchrun sets it; Lightning does, once its process group is set up)."""
        return bool(self.address[0] and self.address[1])

    def _key(self, rank: int) -> str:
        return f"{PREFIX}/{rank}"

    def _connect(self) -> dist.TCPStore:
        if self._store is None:
            host, port = self.address
            timeout = timedelta(seconds=self._timeout)
            self._store = dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
            self._store.set(f"{PREFIX}/node/{self.rank}", str(self.node))
        return self._store

    def _ask(self, exchange: Callable[[dist.TCPStore], Any]) -> Any:
        """``exchange(store)``'s answer, or TimeoutError if it takes longer than the store's timeout (its thread,
        stuck on a machine cut off, is left behind; a daemon, it never holds up the process's end)."""
        answer: dict[str, Any] = {}

        def run() -> None:
            try:
                answer["value"] = exchange(self._connect())
            except (RuntimeError, OSError) as err:  # DistStoreError and DistNetworkError are RuntimeErrors
                answer["error"] = err

        thread = threading.Thread(target=run, name="heartbeat-exchange", daemon=True)
        thread.start()
        thread.join(self._timeout)
        if thread.is_alive() or "error" in answer:
            self._store = None  # a connection that timed out may still deliver a late answer: start a new one
            raise answer.get("error") or TimeoutError(f"no answer within {self._timeout:.0f} s")
        return answer["value"]

    def _mine(self, last: bool = False) -> str:
        self._beats += 1
        return DONE if last else f"{os.getpid()}:{self._beats}"

    def beat(self, last: bool = False) -> None:
        """Write this process's next beat (``last``: it is done). A store that does not answer is noted, not raised."""
        beat = self._mine(last)
        try:
            self._ask(lambda store: store.set(self._key(self.rank), beat))
        except (RuntimeError, OSError) as err:
            log.debug("heartbeat store at %s:%s: %s", *self.address, err)

    def start(self) -> None:
        """Begin watching: a process that never beats at all is judged from now."""
        self._started = time.monotonic()
        self.beat()

    def lost(self, within: float | None = None) -> str | None:
        """Beat, then say what is lost if a process or the store went unheard for ``within`` seconds (``lost_after``
        by default); None while every process answers."""
        within = self.lost_after if within is None else within
        others = [rank for rank in range(self.world) if rank != self.rank]
        beat = self._mine()

        def exchange(store: dist.TCPStore) -> dict[int, tuple[str, str]]:
            store.set(self._key(self.rank), beat)
            present = [rank for rank in others if store.check([self._key(rank)])]
            keys = [key for rank in present for key in (self._key(rank), f"{PREFIX}/node/{rank}")]
            values = [value.decode() for value in store.multi_get(keys)] if keys else []
            return {rank: (values[2 * i], values[2 * i + 1]) for i, rank in enumerate(present)}

        gone = "that machine or the network to it is lost"
        try:
            heard = self._ask(exchange)
        except (RuntimeError, OSError):
            silent = time.monotonic() - self._answered
            if silent < within:
                return None
            host, port = self.address
            return f"node 0 (the run's rendezvous, {host}:{port}) has not answered for {silent:.0f} s: {gone}"
        now = self._answered = time.monotonic()
        for rank, (value, _) in heard.items():
            if self._seen.get(rank, ("", 0.0))[0] != value:
                self._seen[rank] = (value, now)
        for rank in others:
            value, since = self._seen.get(rank, ("", self._started))
            if value != DONE and now - since >= within:
                node = heard[rank][1] if rank in heard else "?"
                return (
                    f"rank {rank} of {self.world} (node {node}) has not been heard from for {now - since:.0f} s: {gone}"
                )
        return None

"""The watcher across machines (project/toolkit/callbacks/heartbeats.py) against a real TCPStore in this process:
a rank whose beats stop is named once ``within`` has passed, a rank that ended is not, and a store that stops
answering is named as node 0. The whole path, on network namespaces, is tests/faults/test_lost_machine.py."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from project.toolkit.callbacks.guards import Guards
from project.toolkit.callbacks.heartbeats import Heartbeats
from project.toolkit.errors import ProjectError
from tests.support.runs import free_port_below_ephemeral_range


@pytest.fixture
def store_address(monkeypatch: pytest.MonkeyPatch):
    """A run's rendezvous store, as rank 0 of a run holds it, at MASTER_ADDR:MASTER_PORT."""
    port = free_port_below_ephemeral_range()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield store
    del store


def test_a_rank_whose_beats_stop_is_named_after_the_bound(store_address) -> None:
    watchers = [Heartbeats(rank, 3, node=rank, lost_after=0.6) for rank in range(3)]
    for watcher in watchers:
        watcher.start()
    assert watchers[0].lost() is None
    for _ in range(4):  # ranks 0 and 1 go on beating, rank 2 is silent
        time.sleep(0.2)
        watchers[0].beat()
        said = watchers[1].lost()
        assert said is None or said.startswith("rank 2 of 3")
    said = watchers[0].lost()
    assert said is not None and said.startswith("rank 2 of 3 (node 2) has not been heard from for ")
    assert "rank 1" not in said
    assert watchers[0].lost(within=60) is None  # a longer bound: not yet


def test_a_rank_that_ended_is_not_lost(store_address) -> None:
    watchers = [Heartbeats(rank, 2, node=rank, lost_after=0.3) for rank in range(2)]
    for watcher in watchers:
        watcher.start()
    watchers[1].beat(last=True)
    time.sleep(0.5)
    assert watchers[0].lost() is None


def test_a_store_that_stops_answering_is_named_as_node_0(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port_below_ephemeral_range()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    watcher = Heartbeats(1, 2, node=1, lost_after=0.5)
    watcher.start()
    assert watcher.lost() is None
    del store  # node 0 is gone, and its store with it
    time.sleep(0.6)
    said = watcher.lost() or watcher.lost()
    assert said is not None and said.startswith(f"node 0 (the run's rendezvous, 127.0.0.1:{port}) has not answered")


def test_a_bound_that_is_not_a_positive_number_is_refused() -> None:
    with pytest.raises(ProjectError, match=r"--guards.lost_after=0: must be a number of seconds above 0"):
        Guards(lost_after=0)


def test_a_store_that_never_answers_is_named_without_the_watcher_waiting_on_it(monkeypatch: pytest.MonkeyPatch):
    """A machine cut off: its connection is open, nothing comes back, and a store's read would wait for minutes (until
    TCP gives up), whatever the store's own timeout. Each look must still return within about the timeout."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts, and never answers
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(silent.getsockname()[1]))
    watcher = Heartbeats(1, 2, node=1, lost_after=2.0)  # 1 s a look at most
    watcher.start()
    started = time.monotonic()
    said = None
    while said is None and time.monotonic() - started < 10:
        said = watcher.lost()
    assert said is not None and said.startswith("node 0 (the run's rendezvous, 127.0.0.1:")
    assert time.monotonic() - started < 5
    # Closing it resets the connections the watcher gave up on: their threads end now, not at the interpreter's exit,
    # where a thread leaving torch's C++ aborts the process.
    silent.close()
    deadline = time.monotonic() + 10
    while any(t.name == "heartbeat-exchange" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "heartbeat-exchange" for t in threading.enumerate())

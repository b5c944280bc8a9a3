"""Helpers of the tests that run the template, in several rooms: a command that must fail in one line, a free port
for a process group, and Lightning's log records."""

from __future__ import annotations

import logging
import random
import socket
from pathlib import Path

import pytest

from project.__main__ import main


def one_error_line(subcommand: str, args: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run ``python -m project SUBCOMMAND ARGS`` in this process, which must exit with status 2 and ONE
    ``error:`` line on stderr, last, with no traceback and no usage dump; that line."""
    with pytest.raises(SystemExit) as exit_info:
        main([subcommand, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "usage:" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert err.strip().splitlines()[-1] == errors[0]  # nothing after it
    return errors[0]


def free_port_below_ephemeral_range() -> int:
    """A free loopback port that the kernel never hands out as a client's source port. With one from
    the ephemeral range, a node connecting before the rendezvous server listens can, rarely, be given
    that very port and connect to itself (TCP simultaneous open), and the run then hangs."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")  # Linux; elsewhere assume the usual start
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    for port in random.sample(range(max(1024, low - 10_000), low), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail(f"no free port below {low}")


class Records(logging.Handler):
    """Every record Lightning logs while attached (its own handler writes to the stderr of import time,
    out of pytest's reach)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

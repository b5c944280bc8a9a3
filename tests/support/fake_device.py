"""A stand-in for an asynchronous device's clock, for the timing tests that count marks and waits."""

from __future__ import annotations

import time


class FakeAsyncDevice:
    """A device clock whose marks are numbered events and whose ``seconds`` between two marks are
    known: 10 ms per mark apart. It counts the waits, which on a GPU are what stalls the host."""

    def __init__(self) -> None:
        self.marks = 0
        self.waits = 0
        self.waits_at_mark: list[int] = []  # the wait count when each mark was taken

    def mark(self) -> int:
        self.marks += 1
        self.waits_at_mark.append(self.waits)
        return self.marks

    def wait(self) -> float:
        self.waits += 1
        return time.perf_counter()

    def seconds(self, start: int, end: int) -> float:
        return (end - start) * 0.010

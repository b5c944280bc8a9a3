"""How a process with a gloo process group ends (project/toolkit/process_exit.py): with its code, after its exit
handlers, its output flushed, and never by an abort when a gloo worker lets go of a tensor during shutdown."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch.distributed as dist

import project.toolkit.entry as entry
from project.toolkit.process_exit import leave_gloo_process_group
from tests.test_strategies import free_port_below_ephemeral_range

REPO = Path(__file__).resolve().parents[1]

# A process in a gloo group of one that prints without a newline, registers an exit handler and ends by
# end_program(CODE).
ONE_PROCESS = """
import atexit, sys
import torch.distributed as dist
from project.toolkit.process_exit import end_program

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
atexit.register(print, "exit handler ran")
print("unflushed", end="")
end_program({code!r})
print("went on")
"""

# The abort, staged: rank 0 leaves a broadcast (from rank 1) to its gloo worker and ends. Its last exit handlers
# (C functions, called straight from C) hold the GIL from 0.5 s to about 2.5 s, while the broadcast lands at 1 s:
# the worker asks for the GIL then, and gets it in the shutdown, when SlowShutdown's __del__ sleeps. Ended by
# Python (without end_program), rank 0 aborts there every time (torch 2.15, Python 3.11: "terminate called
# without an active exception", -6); ended by end_program it exits 0.
TWO_PROCESSES = """
import atexit, sys, time
rank = int(sys.argv[1])
if rank == 0:
    atexit.register(sum, range(200_000_000))  # registered first, run last
    atexit.register(time.sleep, 0.5)

import torch
import torch.distributed as dist
from project.toolkit.process_exit import end_program

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
if rank == 1:
    time.sleep(1.0)
    dist.broadcast(torch.zeros(4), 1)
else:
    TENSOR = torch.ones(4)
    dist.broadcast(TENSOR, 1, async_op=True)

    class SlowShutdown:
        def __del__(self, sleep=time.sleep) -> None:
            sleep(1.0)

    SLOW = SlowShutdown()
end_program(0)
"""


def run_script(path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(path), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("code, status, stderr", [(0, 0, ""), (None, 0, ""), (3, 3, ""), ("bad value", 1, "bad value")])
def test_a_process_with_a_gloo_group_ends_with_its_code_after_its_exit_handlers(
    tmp_path: Path, code: int | str | None, status: int, stderr: str
) -> None:
    script = tmp_path / "one.py"
    script.write_text(ONE_PROCESS.format(port=free_port_below_ephemeral_range(), code=code))
    out, err = run_script(script).communicate(timeout=120)
    assert out == "unflushedexit handler ran\n"  # flushed, the handler run, nothing after end_program
    assert err.strip() == stderr


def test_a_process_without_a_gloo_group_goes_on(tmp_path: Path) -> None:
    script = tmp_path / "none.py"
    script.write_text("from project.toolkit.process_exit import end_program\nend_program(3)\nprint('went on')\n")
    done = run_script(script)
    out, _ = done.communicate(timeout=120)
    assert (done.returncode, out) == (0, "went on\n")


@pytest.mark.slow
def test_a_collective_that_lands_during_shutdown_cannot_abort_the_process(tmp_path: Path) -> None:
    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESSES.format(port=free_port_below_ephemeral_range()))
    ranks = [run_script(script, str(rank)) for rank in (0, 1)]
    ended = [(rank.wait(timeout=120), rank.communicate()[1]) for rank in ranks]
    assert ended == [(0, ""), (0, "")]


@pytest.mark.parametrize("ending, code", [("returns", 0), ("exits 2", 2)])
def test_the_program_ends_through_end_program(monkeypatch: pytest.MonkeyPatch, ending: str, code: int) -> None:
    """``python -m project fit ...`` (no ``args``) hands its exit code to end_program; a call from Python does not."""

    def cli_main(*args: object, **kwargs: object) -> str:
        if ending == "exits 2":
            raise SystemExit(2)
        return "cli"

    ended = []
    monkeypatch.setattr("project.toolkit.cli.main", cli_main)
    monkeypatch.setattr(entry, "end_program", ended.append)
    monkeypatch.setattr(sys, "argv", ["project", "fit"])
    with pytest.raises(SystemExit) if code else nullcontext():
        entry.main()
    assert ended == [code]
    with pytest.raises(SystemExit) if code else nullcontext():
        entry.main(["fit"])
    assert ended == [code]  # not again


def test_a_gloo_process_group_is_left_at_exit() -> None:
    leave_gloo_process_group()  # none yet: nothing to do
    address = f"tcp://127.0.0.1:{free_port_below_ephemeral_range()}"
    dist.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    try:
        leave_gloo_process_group()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():  # keep a failure here from leaking the group into other tests
            dist.destroy_process_group()

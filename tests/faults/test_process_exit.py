"""How a process with a gloo process group ends (project/toolkit/cli/process_exit.py): with its code, after its exit
handlers, its output flushed, and never by an abort when a gloo worker lets go of a tensor during shutdown."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch.distributed as dist

import project.toolkit.cli as entry
from project.toolkit.cli.process_exit import leave_gloo_process_group
from tests.support.runs import free_port_below_ephemeral_range

REPO = Path(__file__).resolve().parents[2]

# A process in a gloo group of one, with an idle thread pool (its worker is no daemon thread), that prints
# without a newline, registers an exit handler and ends by end_program(OUTCOME).
ONE_PROCESS = """
import atexit, sys
from concurrent.futures import ThreadPoolExecutor
import torch.distributed as dist
from project.toolkit.cli.process_exit import end_program

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
sys.excepthook = sys.__excepthook__  # Python's own, without the "[rank0]: " torch.distributed puts before it
POOL = ThreadPoolExecutor(1)  # kept: its idle worker waits for work until told to stop
POOL.submit(int).result()
atexit.register(print, "exit handler ran")
print("unflushed", end="")
end_program({outcome})
print("went on")
"""

# The abort, staged: rank 0 leaves a broadcast (from rank 1, which sends it 0.5 s in) to its gloo worker and ends.
# Its last exit handler, a C function called straight from C, holds the GIL from the start for longer than that
# (COUNT is sized so by the test), so the worker asks for the GIL while Python is still alive and gets it only
# in the shutdown, when SlowShutdown's __del__ sleeps. Ended by Python (sys.exit instead of end_program), rank 0
# aborts there every time (checked by hand with torch 2.15, Python 3.11: "terminate called without an active
# exception", -6); ended by end_program it exits 0.
TWO_PROCESSES = """
import atexit, sys, time
rank = int(sys.argv[1])
if rank == 0:
    atexit.register(sum, range({count}))  # registered first, run last

import torch
import torch.distributed as dist
from project.toolkit.cli.process_exit import end_program

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
if rank == 1:
    time.sleep(0.5)
    dist.broadcast(torch.zeros(4), 1)
else:
    TENSOR = torch.ones(4)
    dist.broadcast(TENSOR, 1, async_op=True)

    class SlowShutdown:
        def __del__(self, sleep=time.sleep) -> None:
            sleep(1.0)

    SLOW = SlowShutdown()
end_program(None)
"""


def start_script(path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(path), *args],
        cwd=REPO,  # PYTHONPATH names the repository already (tests/conftest.py)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ended(process: subprocess.Popen) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of ``process``; killed if it has not ended within two minutes."""
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        err += "\n(killed: still running after 120 s)"
    return process.returncode, out, err


@pytest.mark.parametrize(
    "outcome, status, stderr",
    [
        ("None", 0, ""),  # the program returned
        ("SystemExit(None)", 0, ""),
        ("SystemExit(3)", 3, ""),
        ("SystemExit(True)", 1, ""),
        ("SystemExit('bad value')", 1, "bad value"),
        ("SystemExit(2.5)", 1, "2.5"),
        ("RuntimeError('boom')", 1, "RuntimeError: boom"),
        ("KeyboardInterrupt()", 130, "KeyboardInterrupt"),
    ],
)
def test_a_process_with_a_gloo_group_ends_as_python_would_after_its_exit_handlers(
    tmp_path: Path, outcome: str, status: int, stderr: str
) -> None:
    script = tmp_path / "one.py"
    script.write_text(ONE_PROCESS.format(port=free_port_below_ephemeral_range(), outcome=outcome))
    returncode, out, err = ended(start_script(script))
    assert returncode == status, err
    assert out == "unflushedexit handler ran\n"  # flushed, the handler run, nothing after end_program
    assert err.strip() == stderr


def test_a_process_without_a_gloo_group_goes_on(tmp_path: Path) -> None:
    script = tmp_path / "none.py"
    script.write_text("from project.toolkit.cli.process_exit import end_program\nend_program(3)\nprint('went on')\n")
    returncode, out, err = ended(start_script(script))
    assert (returncode, out) == (0, "went on\n"), err


def count_summed_in(seconds: float) -> int:
    """How many integers ``sum(range(n))`` adds up in about ``seconds`` on this machine."""
    started = time.perf_counter()
    sum(range(2_000_000))
    return int(2_000_000 * seconds / (time.perf_counter() - started))


@pytest.mark.slow
def test_a_collective_that_lands_during_shutdown_cannot_abort_the_process(tmp_path: Path) -> None:
    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESSES.format(port=free_port_below_ephemeral_range(), count=count_summed_in(1.5)))
    ranks = [ended(process) for process in [start_script(script, str(rank)) for rank in (0, 1)]]
    assert [status for status, _, _ in ranks] == [0, 0], ranks
    assert not any("terminate called" in err for _, _, err in ranks), ranks


@pytest.mark.parametrize("outcome", [None, SystemExit(2), RuntimeError("boom")])
def test_the_program_ends_through_end_program(monkeypatch: pytest.MonkeyPatch, outcome: BaseException | None) -> None:
    """``python -m project fit ...`` (no ``args``) hands how it ended to end_program; a call from Python does not."""

    def cli_main(*args: object, **kwargs: object) -> str:
        if outcome is not None:
            raise outcome
        return "cli"

    ended = []
    monkeypatch.setattr("project.toolkit.cli.lightning_cli.main", cli_main)
    monkeypatch.setattr(entry, "end_program", ended.append)
    monkeypatch.setattr(sys, "argv", ["project", "fit"])
    for args in (None, ["fit"]):
        with pytest.raises(type(outcome)) if outcome else nullcontext():
            entry.main(args)
        assert ended == [outcome]  # once: not for the call with args
    assert ended[0] is outcome


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

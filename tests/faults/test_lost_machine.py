"""A machine of a two-machine ddp run lost mid-epoch (tests/support/machines.py: network namespaces with their own
addresses): its link cut, or its process killed. Without a watcher across machines the survivor waits in a
collective for ever, without a word, and SIGTERM (what SLURM sends before it kills) does not end it either: the stop
is agreed through a collective too. Here every survivor ends within ``--guards.lost_after`` seconds (10 s once
SIGTERM came) with one ``error:`` line naming the lost rank or node and what was saved, ``last.ckpt`` stays whole,
and the run resumed on two machines ends with the weights of an unbroken run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from tests.integration.test_strategies import last_checkpoint
from tests.integration.test_strategy_runs import run_project
from tests.integration.test_two_machines import MASTER_PORT, assert_same_weights, start_on_machines, wait_for_machines
from tests.support.machines import Machines

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

LOST_AFTER = 30  # seconds: the bound the survivor must end within, above SIGTERM's 10


class SlowFrom(Callback):
    """From global step ``step`` on, each step of this process takes ``seconds`` longer (the run is mid-epoch while
    the test acts); at that step, rank 0 writes ``mark``."""

    def __init__(self, step: int = 11, seconds: float = 0.5, mark: str = "") -> None:
        self.step, self.seconds, self.mark = step, seconds, mark

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            Path(self.mark).write_text(str(time.time()))
        if trainer.global_step >= self.step:
            time.sleep(self.seconds)


def job(tiny_args: list[str], root: Path) -> list[str]:
    """2 epochs of 8 steps, a checkpoint every 3 steps, ddp on 2 processes, deterministic."""
    return [
        *tiny_args[:-1],
        "--trainer.strategy=ddp",
        "--trainer.max_epochs=2",
        "--trainer.deterministic=true",
        "--checkpoint.every_n_train_steps=3",
        f"--guards.lost_after={LOST_AFTER}",
        f"--trainer.default_root_dir={root}",
    ]


def errors(log: Path) -> list[str]:
    said = log.read_text()
    assert "Traceback" not in said, said[-3000:]
    return [line for line in said.splitlines() if line.startswith("error:")]


def start_and_reach_step(
    machines: Machines, tiny_args: list[str], root: Path, cwd: Path, timeout: float = 120
) -> tuple[list[subprocess.Popen], list[Path]]:
    """The job on both machines, slowed from step 11 on; once rank 0 has reached it, the processes and their logs."""
    mark = cwd / "at-step-11"
    slow = [f"--trainer.callbacks+={__name__}.SlowFrom", f"--trainer.callbacks.mark={mark}"]
    processes, logs = start_on_machines(machines, [*job(tiny_args, root), *slow], cwd)
    deadline = time.monotonic() + timeout
    while not mark.exists():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            pytest.fail("never reached the step:\n" + "\n".join(log.read_text()[-3000:] for log in logs))
        time.sleep(0.1)
    return processes, logs


def test_a_machine_cut_off_mid_epoch_ends_the_run_on_both_sides_and_it_resumes_exactly(
    two_machines: Machines, tiny_args: list[str], tmp_path: Path
) -> None:
    root = tmp_path / "broken"
    processes, logs = start_and_reach_step(two_machines, tiny_args, root, tmp_path)
    two_machines.cut(1)  # machine 1 is now unreachable, its process still running
    cut = time.monotonic()
    processes[0].send_signal(signal.SIGTERM)  # a preemption notice reaches machine 0 during the partition
    ended: list[float | None] = [None, None]  # seconds from the cut to each process's end
    while None in ended and time.monotonic() - cut < 3 * LOST_AFTER:
        time.sleep(0.2)
        now = time.monotonic() - cut
        ended = [e if e is not None or p.poll() is None else now for e, p in zip(ended, processes, strict=True)]
    codes = wait_for_machines(processes, logs, timeout=0)
    assert codes == [1, 1], "\n".join(log.read_text()[-3000:] for log in logs)
    assert ended[0] < 25, f"machine 0 ended {ended[0]:.0f} s after SIGTERM"  # SLURM's KillWait is 30 s
    assert LOST_AFTER <= ended[1] < LOST_AFTER + 20, f"machine 1 ended {ended[1]:.0f} s after the cut"

    last = root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    step = torch.load(last, weights_only=False)["global_step"]  # whole: it loads
    assert step in (9, 12)  # cut after step 11; Lightning saves by steps once val/acc exists (epoch 1)
    shown = last.relative_to(tmp_path)  # as the runs show it: relative to where they run
    saved = f"Saved: {shown} (step {step}); resume with the same command and --ckpt_path=last"
    (error0,) = errors(logs[0])
    assert error0.startswith("error: rank 1 of 2 (node 1) has not been heard from for 1") and error0.endswith(saved)
    (error1,) = errors(logs[1])
    node0 = f"error: node 0 (the run's rendezvous, {two_machines.addresses[0]}:{MASTER_PORT}) has not answered for"
    assert error1.startswith(node0) and "stopping rank 1 too" in error1 and error1.endswith(saved)

    # the link back, the same command with --ckpt_path=last on both machines; then an unbroken run to compare with
    two_machines.mend(1)
    processes, logs = start_on_machines(two_machines, [*job(tiny_args, root), "--ckpt_path=last"], tmp_path)
    assert wait_for_machines(processes, logs) == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    unbroken = tmp_path / "unbroken"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run_project("fit", *job(tiny_args, unbroken), "--trainer.devices=2", cwd=tmp_path, env=env)
    assert_same_weights(last_checkpoint(root, version=1), last_checkpoint(unbroken))


def test_a_machine_whose_process_is_killed_is_named_by_the_other(
    two_machines: Machines, tiny_args: list[str], tmp_path: Path
) -> None:
    root = tmp_path / "run"
    processes, logs = start_and_reach_step(two_machines, tiny_args, root, tmp_path)
    processes[0].kill()  # machine 0: rank 0, and with it the run's rendezvous
    killed = time.monotonic()
    codes = wait_for_machines(processes, logs, timeout=LOST_AFTER)
    assert codes == [-signal.SIGKILL, 1], logs[1].read_text()[-3000:]
    assert time.monotonic() - killed < LOST_AFTER
    (error,) = errors(logs[1])
    node0 = f"error: node 0 (the run's rendezvous, {two_machines.addresses[0]}:{MASTER_PORT}) has not answered for"
    assert error.startswith(node0) and "; stopping rank 1 too. Saved: " in error

"""ddp and fsdp across two "machines": network namespaces of this host, each with its own interface and address
(tests/support/machines.py), started as a user with two machines would: by environment (``MASTER_ADDR`` on
machine 0's address, ``NODE_RANK``) and by ``torchrun --nnodes=2``. Each ends with the weights of one machine with
two processes at the same global batch and seed, and node 0 alone writes the run folder. Two network stacks of one
host over TCP, not two machines' hardware: NCCL and InfiniBand are not tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.integration.test_strategies import last_checkpoint
from tests.integration.test_strategy_runs import run_project
from tests.support.machines import Machines

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

MASTER_PORT = 29500  # free on every machine: each namespace has ports of its own


def node_env(machines: Machines, node_rank: int, **extra: str) -> dict[str, str]:
    """What a user sets on machine ``node_rank``: node 0's address and port, this machine's index. One thread a
    process, as in the one-machine run it is compared with (CPU kernels round by thread count)."""
    return {
        **os.environ,
        "MASTER_ADDR": machines.addresses[0],
        "MASTER_PORT": str(MASTER_PORT),
        "NODE_RANK": str(node_rank),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def start_on_machines(
    machines: Machines, args: list[str], cwd: Path, torchrun: bool = False, env: dict[str, str] | None = None
) -> tuple[list[subprocess.Popen], list[Path]]:
    """``python -m project fit ARGS --trainer.num_nodes=2 --trainer.devices=1`` on each machine (under torchrun
    with ``torchrun``); the processes and their logs."""
    processes, logs = [], [cwd / f"node{rank}.log" for rank in range(len(machines.names))]
    for node_rank, log in enumerate(logs):
        launcher = [sys.executable]
        if torchrun:
            launcher += ["-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node_rank}"]
            launcher += [f"--master_addr={machines.addresses[0]}", f"--master_port={MASTER_PORT}"]
        command = [*launcher, "-m", "project", "fit", *args, "--trainer.num_nodes=2", "--trainer.devices=1"]
        with log.open("w") as output:
            options = {"cwd": cwd, "stdout": output, "stderr": subprocess.STDOUT}
            processes.append(
                machines.popen(node_rank, command, env={**node_env(machines, node_rank), **(env or {})}, **options)
            )
    return processes, logs


def wait_for_machines(processes: list[subprocess.Popen], logs: list[Path], timeout: float = 240) -> list[int]:
    """Every process's exit status; a failure with the logs if one still runs at ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    codes = [p.poll() for p in processes]
    if None in codes:
        tails = "\n".join(f"--- {log.name}:\n{log.read_text()[-3000:]}" for log in logs)
        pytest.fail(f"still running after {timeout} s (exit codes {codes}):\n{tails}")
    return codes


def assert_same_weights(run: dict, expected: dict) -> None:
    assert run["global_step"] == expected["global_step"]
    assert run["state_dict"].keys() == expected["state_dict"].keys()
    for name, tensor in expected["state_dict"].items():
        torch.testing.assert_close(run["state_dict"][name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(("strategy", "torchrun"), [("ddp", False), ("fsdp", True)], ids=["ddp-env", "fsdp-torchrun"])
def test_two_machines_end_with_the_weights_of_one_machine_with_two_processes(
    strategy: str, torchrun: bool, two_machines: Machines, tiny_args: list[str], tmp_path: Path
) -> None:
    common = [
        *tiny_args[:-1],  # the run folder is each set-up's own
        f"--trainer.strategy={strategy}",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=1",
        "--trainer.deterministic=true",
        "--trainer.enable_progress_bar=false",
    ]
    one = tmp_path / "one_machine"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run_project("fit", *common, "--trainer.devices=2", f"--trainer.default_root_dir={one}", cwd=tmp_path, env=env)

    two = tmp_path / "two_machines"
    processes, logs = start_on_machines(
        two_machines, [*common, f"--trainer.default_root_dir={two}"], tmp_path, torchrun
    )
    codes = wait_for_machines(processes, logs)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)

    assert_same_weights(last_checkpoint(two), last_checkpoint(one))
    assert [p.name for p in (two / "lightning_logs").iterdir()] == ["version_0"]  # written once, by node 0
    timing = json.loads((two / "lightning_logs" / "version_0" / "timing.json").read_text())
    assert (timing["num_nodes"], timing["world_size"]) == (2, 2)
    assert timing["peak_memory_devices"] == ["rank0", "rank1"]  # every machine's rank in it

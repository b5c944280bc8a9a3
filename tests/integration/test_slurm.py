"""SLURM, for real: a one-node cluster on this machine (tests/support/slurm_cluster.py) runs scripts/slurm/train.sbatch
with 2 tasks, requeues and cancels it, and srun starts runs with task counts that do not fit. Marked ``slurm``:
``make test-slurm`` installs SLURM where it is missing and runs these; ``make test`` leaves them out. Where SLURM is
not installed or will not start, they are skipped with the reason. The check of the task counts
(``check_slurm_tasks``) is also tested here on its own, without SLURM, in every ``make test``."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from project.toolkit.cli.checks import check_slurm_tasks
from project.toolkit.cli.lightning_cli import prints_errors
from project.toolkit.errors import ProjectError
from tests.integration.test_strategy_runs import REPO, run_project
from tests.support.fixtures import TINY_RUN
from tests.support.slurm_cluster import SlurmCluster, slurm_cluster, two_node_slurm_cluster  # noqa: F401 (fixtures)

SCRIPT = REPO / "scripts" / "slurm" / "train.sbatch"

# tests/conftest.py's tiny_args, for a run folder given per run: 160 training images in global batches of 20 (8 steps
# an epoch), 2 epochs, a small nn.Sequential (tests/support/user_nets.py), deterministic kernels.
TINY = [
    *TINY_RUN,
    "--model.arch=tests.support.user_nets.sequential_convnet",
    "--trainer.max_epochs=2",
    "--trainer.deterministic=true",
]
STEPS = 16
# Two tasks of one CPU each on the one node. One thread per process in every run compared: CPU kernels split their
# work by thread count, and so round differently.
ALLOCATION = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


class SlurmProbe(Callback):
    """Writes what each process of a run took its place from to ``<out>/rank<R>.json``: the cluster environment
    Lightning chose, whether that environment or Lightning's launcher started the processes (the launcher gives those
    it starts a LOCAL_RANK), the ranks, SLURM's task id."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        environment = trainer.strategy.cluster_environment
        record = {
            "environment": type(environment).__name__,
            "started_by": "the cluster" if environment.creates_processes_externally else "Lightning",
            "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
            "global_rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "slurm_procid": os.environ.get("SLURM_PROCID"),
            "node": os.environ.get("SLURMD_NODENAME"),
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


class Pace(Callback):
    """Makes every training step of rank ``rank`` take ``seconds`` longer, so that a signal sent while the run trains
    lands in the middle of an epoch, with the ranks apart, as a preemption finds them: the other rank is then waiting
    for this one inside a collective (the next step's gradient all-reduce, say). Once training reaches global step
    ``step``, rank 0 writes the SLURM job id to ``mark``."""

    def __init__(self, seconds: float = 0.5, mark: str = "", step: int = 0, rank: int = 1) -> None:
        self.seconds, self.mark, self.step, self.rank = seconds, mark, step, rank

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if self.mark and trainer.global_step == self.step and trainer.is_global_zero:
            Path(self.mark).write_text(os.environ.get("SLURM_JOB_ID", ""))
        if trainer.global_rank == self.rank:
            time.sleep(self.seconds)


def pace(mark: Path, step: int) -> list[str]:
    callback = f"--trainer.callbacks+={__name__}.Pace"
    return [callback, f"--trainer.callbacks.mark={mark}", f"--trainer.callbacks.step={step}"]


def final_weights(root: Path, version: int) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(root / f"lightning_logs/version_{version}/checkpoints/last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == STEPS
    return checkpoint["state_dict"]


def assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0, msg=name)


def sbatch(cluster: SlurmCluster, folder: Path, *args: str, wait: bool = False, timeout: float = 60) -> str:
    """Submit scripts/slurm/train.sbatch with 2 tasks on the one node, ``args`` after the script's name, its output
    in ``folder/slurm-<jobid>.out``; the job id. ``wait``: until the job has ended (``sbatch --wait``, which
    fails if the job did)."""
    command = ["sbatch", "--parsable", *ALLOCATION, f"--output={folder}/slurm-%j.out", f"--chdir={folder}"]
    result = subprocess.run(
        [*command, *(["--wait"] if wait else []), str(SCRIPT), *args],
        env={**cluster.env, **ONE_THREAD},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    job = result.stdout.strip().split(";")[0]
    output = next(folder.glob(f"slurm-{job}.out"), None) if job else None
    said = output.read_text() if output else ""
    assert result.returncode == 0, f"sbatch: exit {result.returncode}\n{result.stderr}\n{said[-4000:]}"
    return job


def job_output(folder: Path, job: str = "*") -> str:
    """What the job wrote (all jobs' output in ``folder`` for ``*``): its tasks' stdout and stderr, SLURM's notes."""
    return "".join(path.read_text() for path in sorted(folder.glob(f"slurm-{job}.out")))


def wait_for(condition: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting after {timeout:.0f} s for {what}")
        time.sleep(interval)


@pytest.fixture(scope="module")
def unbroken_ddp_run(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """The final weights of a 2-process ddp run of the same job started directly (Lightning starts the second
    process), outside SLURM: what every run under SLURM must end with."""
    root = tmp_path_factory.mktemp("unbroken")
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM_")}
    direct = ["--trainer.strategy=ddp", "--trainer.devices=2", f"--trainer.default_root_dir={root}"]
    run_project("fit", *TINY, *direct, cwd=root, env={**env, **ONE_THREAD})
    return final_weights(root, 0)


@pytest.mark.slurm
def test_the_sbatch_script_trains_with_slurms_ranks_and_ends_as_a_direct_ddp_run(
    slurm_cluster: SlurmCluster,  # noqa: F811
    unbroken_ddp_run: dict,
    tmp_path: Path,
) -> None:
    probe = [f"--trainer.callbacks+={__name__}.SlurmProbe", f"--trainer.callbacks.out={tmp_path / 'probe'}"]
    run = [*TINY, f"--trainer.default_root_dir={tmp_path}", *probe]
    job = sbatch(slurm_cluster, tmp_path, *run, wait=True, timeout=300)
    said = job_output(tmp_path, job)
    # Lightning took its ranks from SLURM, each task being one of them; it started no process of its own
    records = [json.loads((tmp_path / "probe" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    slurm = {"environment": "SLURMEnvironment", "started_by": "the cluster", "LOCAL_RANK": None, "world_size": 2}
    node = slurm_cluster.nodes[0]
    assert records == [{**slurm, "global_rank": r, "slurm_procid": str(r), "node": node} for r in (0, 1)]
    assert said.count("SLURM auto-requeueing enabled") == 2 and "Traceback" not in said
    assert_same_weights(final_weights(tmp_path, 0), unbroken_ddp_run)
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["version_0"]  # rank 0 alone wrote


# Two ways a running job is stopped and put back in the queue: a preemption (or an administrator's requeue), which
# sends SIGTERM to every process of the job, batch script included; and the warning of train.sbatch's
# --signal=TERM@120 before the time limit, which reaches the tasks alone (scancel --signal=TERM does the same, at
# once), so that the script itself requeues the job once they have saved (they exit 143).
PREEMPTIONS = {"scontrol requeue": ["scontrol", "requeue"], "time-limit warning": ["scancel", "--signal=TERM"]}


def stop_mid_epoch_and_resume(
    cluster: SlurmCluster,  # noqa: F811
    folder: Path,
    preemption: str,
    allocation: list[str],
    extra: tuple[str, ...] = (),
) -> str:
    """Run train.sbatch on ``allocation`` (``extra``: more options of the fit); once every process trains in the
    middle of epoch 1 (steps 9 to 16), the ranks apart (see :class:`Pace`), stop the job by ``preemption``: each
    process saves last.ckpt and ends, the job comes back and train.sbatch resumes it from that checkpoint. The job's
    output, once it has ended."""
    mark = folder / "mid-epoch"
    args = [*TINY, f"--trainer.default_root_dir={folder}", *pace(mark, step=9), *extra]
    sbatch_wait = subprocess.Popen(
        ["sbatch", "--wait", *allocation, f"--output={folder}/slurm-%j.out", f"--chdir={folder}", str(SCRIPT)] + args,
        env={**cluster.env, **ONE_THREAD},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: mark.exists() and mark.read_text() or sbatch_wait.poll() is not None, 180, "step 9")
        assert sbatch_wait.poll() is None, f"{sbatch_wait.communicate()[0]}\n{job_output(folder)[-4000:]}"
        job = mark.read_text()
        cluster.run(*PREEMPTIONS[preemption], job)
        # SLURM holds a requeued job back for 2 minutes, time for the stopped one to end; let it go once that has
        # ended, and a second has passed: the new start's credential must be dated after the old one's revocation.
        wait_for(lambda: cluster.job_state(job) == "PENDING", 60, f"job {job} to be requeued", interval=0.5)
        wait_for(lambda: not cluster.processes(job), 60, f"the processes of job {job} to end", interval=0.2)
        time.sleep(1.5)
        cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now")
        out, _ = sbatch_wait.communicate(timeout=300)
    finally:
        if sbatch_wait.poll() is None:
            sbatch_wait.kill()
            sbatch_wait.communicate()
    said = job_output(folder, job)
    assert sbatch_wait.returncode == 0, f"{out}\n{said[-6000:]}"
    stopped = torch.load(folder / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=False)
    assert stopped["epoch"] == 1 and 9 <= stopped["global_step"] < STEPS, "not saved in the middle of epoch 1"
    assert f"Stopped by SIGTERM at epoch 1, step {stopped['global_step']}; saved" in said
    assert "requeued (restart 1): resuming from the newest last.ckpt" in said
    assert "version_0/checkpoints/last.ckpt" in said.split("requeued (restart 1)")[1]  # what it resumed from
    return said


@pytest.mark.slurm
def test_a_job_warned_of_its_time_limit_mid_epoch_is_requeued_resumes_and_ends_as_an_unbroken_run(
    slurm_cluster: SlurmCluster,  # noqa: F811
    unbroken_ddp_run: dict,
    tmp_path: Path,
) -> None:
    """The script requeues the job itself. An ``scontrol requeue``, which SLURM does, is the two-node test's."""
    stop_mid_epoch_and_resume(slurm_cluster, tmp_path, "time-limit warning", ALLOCATION)
    assert_same_weights(final_weights(tmp_path, 1), unbroken_ddp_run)


@pytest.mark.slurm
@pytest.mark.multinode
def test_a_two_node_job_requeued_mid_epoch_resumes_on_both_nodes_as_an_unbroken_run(
    two_node_slurm_cluster: SlurmCluster,  # noqa: F811
    unbroken_ddp_run: dict,
    tmp_path: Path,
) -> None:
    """sbatch -N 2, one task a node, each node a machine with its own address: the ranks meet at node 0's address
    (Lightning resolves it from SLURM's node list), are requeued together, and resume on both nodes."""
    probe = [f"--trainer.callbacks+={__name__}.SlurmProbe", f"--trainer.callbacks.out={tmp_path / 'probe'}"]
    allocation = ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1"]
    stop_mid_epoch_and_resume(two_node_slurm_cluster, tmp_path, "scontrol requeue", allocation, tuple(probe))
    records = [json.loads((tmp_path / "probe" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [record["node"] for record in records] == two_node_slurm_cluster.nodes
    assert_same_weights(final_weights(tmp_path, 1), unbroken_ddp_run)


@pytest.mark.slurm
def test_scancel_leaves_a_loadable_checkpoint_and_no_process(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    root = tmp_path / f"run-{uuid.uuid4().hex}"  # a name that only this run's processes carry
    root.mkdir()
    mark = root / "training"
    job = sbatch(slurm_cluster, root, *TINY, f"--trainer.default_root_dir={root}", *pace(mark, step=3))
    wait_for(lambda: mark.exists() or slurm_cluster.job_state(job) not in ("PENDING", "RUNNING"), 180, "step 3")
    assert mark.exists(), f"job {job} is {slurm_cluster.job_state(job)}:\n{job_output(root, job)[-4000:]}"
    slurm_cluster.run("scancel", job)
    cancelled = time.monotonic()

    def left() -> str:  # the job's processes (batch script, srun, the tasks) still running
        return subprocess.run(["pgrep", "-af", root.name], capture_output=True, text=True).stdout

    while left() and time.monotonic() - cancelled < 20:
        time.sleep(0.2)
    assert not left(), f"still running 20 s after scancel:\n{left()}"
    wait_for(lambda: slurm_cluster.job_state(job) == "CANCELLED", 30, f"job {job} to end", interval=0.5)
    said = job_output(root, job)
    assert "Stopped by SIGTERM at epoch" in said, said[-4000:]  # saved on the way out, not killed at KillWait
    saved = torch.load(root / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=False)
    assert 3 <= saved["global_step"] < STEPS and saved["state_dict"]


# ------------------------------------------------------------------------------------- task counts under srun


def task_environment(**variables: str | int) -> dict[str, str]:
    """The variables srun gives task 0 of a job named ``python``, with ``variables`` on top (None: unset)."""
    environ = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NAME": "python",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
    }
    environ.update({name: str(value) for name, value in variables.items()})
    return {name: value for name, value in environ.items() if value != "None"}


@pytest.mark.parametrize(
    ("devices", "num_nodes", "variables"),
    [
        (2, 1, {}),
        ("2", None, {}),
        ([0, 1], 1, {}),
        ("auto", 1, {}),  # Lightning decides; its own check remains
        (4, 2, {"SLURM_NTASKS": 8, "SLURM_NTASKS_PER_NODE": 4, "SLURM_NNODES": 2}),
        (1, 1, {"SLURM_NTASKS": 1, "SLURM_NTASKS_PER_NODE": None, "SLURM_STEP_ID": None}),  # one-task batch script
        (2, 1, {"SLURM_JOB_NAME": "interactive", "SLURM_NTASKS_PER_NODE": None}),  # the user starts the processes
        (3, 1, {"SLURM_NTASKS": None}),  # not under SLURM
    ],
)
def test_task_counts_that_fit_the_trainer_pass(devices: Any, num_nodes: Any, variables: dict) -> None:
    check_slurm_tasks(devices, num_nodes, task_environment(**variables))


@pytest.mark.parametrize(
    ("devices", "num_nodes", "variables", "message"),
    [
        (
            2,
            1,
            {"SLURM_NTASKS_PER_NODE": None},
            "SLURM started 2 tasks from --ntasks=2 (-n) without --ntasks-per-node, which Lightning needs to place one "
            "process per device: use `srun --ntasks-per-node=2` (or `#SBATCH --ntasks-per-node=2`) instead of -n, "
            "with --trainer.devices=2 --trainer.num_nodes=1",
        ),
        (
            1,
            1,
            {},
            "SLURM starts 2 task(s) per node (--ntasks-per-node=2), one process per device, but "
            "--trainer.devices=1: write --trainer.devices=2 (or run --ntasks-per-node=1)",
        ),
        (
            2,
            2,
            {},
            "the SLURM job has 1 node(s) (--nodes=1), but --trainer.num_nodes=2: write --trainer.num_nodes=1 (or "
            "ask SLURM for --nodes=2)",
        ),
        (
            2,
            2,
            {"SLURM_NTASKS": 3, "SLURM_NNODES": 2},
            "SLURM started 3 task(s) (SLURM_NTASKS=3), but 2 per node on 2 node(s) is 4, the processes "
            "--trainer.devices=2 --trainer.num_nodes=2 waits for: leave out --ntasks (-n) and give "
            "--ntasks-per-node=2 --nodes=2",
        ),
        (
            2,
            1,
            {"SLURM_STEP_ID": None},
            "this process is not one of the job's 2 tasks (SLURM_NTASKS=2, but no SLURM_STEP_ID: it was started "
            "without srun), so it would wait for processes that never start: run `srun python -m project ...` with "
            "`#SBATCH --ntasks-per-node=2`, one task per device (scripts/slurm/train.sbatch)",
        ),
    ],
    ids=["ntasks-without-per-node", "devices", "num-nodes", "total", "without-srun"],
)
def test_task_counts_that_do_not_fit_get_one_line_saying_what_to_write(
    devices: Any, num_nodes: Any, variables: dict, message: str
) -> None:
    with pytest.raises(ProjectError) as refused:
        check_slurm_tasks(devices, num_nodes, task_environment(**variables))
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("environ", "prints"),
    [
        ({}, True),
        ({"LOCAL_RANK": "0"}, True),
        ({"LOCAL_RANK": "1"}, False),
        ({"LOCAL_RANK": "0", "SLURM_PROCID": "2"}, True),  # torchrun inside a SLURM job: one line per machine
        ({"SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, True),
        ({"SLURM_PROCID": "1", "SLURM_LOCALID": "1"}, False),
        ({"SLURM_PROCID": "2", "SLURM_LOCALID": "0"}, False),  # srun: task 0 alone, not one per node
    ],
)
def test_one_process_of_a_run_prints_its_error_line(environ: dict, prints: bool) -> None:
    assert prints_errors(environ) is prints


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("srun", "trainer", "expected"),
    [
        (["-n", "2"], ["--trainer.devices=2"], "without --ntasks-per-node"),
        (["--ntasks-per-node=2"], ["--trainer.devices=1"], "write --trainer.devices=2"),
    ],
    ids=["ntasks-without-per-node", "devices"],
)
def test_srun_with_task_counts_that_do_not_fit_prints_one_error_line(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
    srun: list[str],
    trainer: list[str],
    expected: str,
) -> None:
    command = ["srun", *srun, "--cpus-per-task=1", "python", "-m", "project", "fit", *TINY, "--trainer.strategy=ddp"]
    result = subprocess.run(
        [*command, *trainer, f"--trainer.default_root_dir={tmp_path}"],
        env=slurm_cluster.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    said = result.stdout + result.stderr
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, said[-4000:]
    assert len(errors) == 1 and expected in errors[0], said[-4000:]
    assert "Traceback" not in said and not (tmp_path / "lightning_logs").exists()

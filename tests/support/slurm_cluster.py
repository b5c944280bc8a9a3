"""A real SLURM cluster on this machine, for the tests marked ``slurm`` (tests/integration/test_slurm.py): one node,
or one node per "machine" of tests/support/machines.py (a slurmd in each network namespace, at its own address).

:func:`start_cluster` writes a munge key and a ``slurm.conf`` into a folder of its own, starts ``munged``,
``slurmctld`` and ``slurmd`` in the foreground of processes it holds (so stopping them is certain), and waits
until ``sinfo`` shows the node idle. Every command is pointed at that config by ``SLURM_CONF`` (see
:attr:`SlurmCluster.env`); nothing under /etc is read or written. The :func:`slurm_cluster` fixture (session
scope) starts it once and stops every daemon at the end, :func:`two_node_slurm_cluster` the same on two machines;
where SLURM is not installed, or cannot be started here, they skip the tests that use them with one line saying why.
``make test-slurm`` installs SLURM first.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.machines import Machines, machines_or_skip

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")


class ClusterUnavailable(Exception):
    """SLURM is not installed here, or would not start: the one-line reason to skip with."""


@dataclass
class SlurmCluster:
    """A running cluster: its folder, config, node names, the environment its commands need (this process's, plus
    ``SLURM_CONF``) and the daemons' processes (``slurmd-<node>`` for each node's)."""

    root: Path
    conf: Path
    nodes: list[str]
    cpus: int
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """This process's environment as it is now (the tests' PYTHONPATH included), pointed at this cluster's
        config, with this interpreter's ``python`` first on PATH (the jobs' ``srun python``), and without the
        variables of a SLURM job that pytest itself might run in (they would misdirect srun and Lightning)."""
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))
        }
        bin_dir = str(Path(sys.executable).parent)
        env.update(SLURM_CONF=str(self.conf), PATH=os.pathsep.join([bin_dir, env.get("PATH", os.defpath)]))
        return env

    def run(self, *command: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM command (``sbatch``, ``squeue`` ...) against this cluster; its output as text."""
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)}: exit {result.returncode}\n{result.stdout}\n{result.stderr}")
        return result

    def job_state(self, job_id: str) -> str:
        """``PENDING``, ``RUNNING``, ``COMPLETED`` ... as ``scontrol show job`` says; '' once it has forgotten it."""
        result = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        fields = dict(word.split("=", 1) for word in result.stdout.split() if "=" in word)
        return fields.get("JobState", "")

    def node_state(self, *nodes: str) -> str:
        """The state of ``nodes`` (all by default): ``idle`` when every one is; several (``idle,down*``) otherwise."""
        result = self.run("sinfo", "--noheader", "--nodes", ",".join(nodes or self.nodes), "--format=%T", check=False)
        return ",".join(sorted(set(result.stdout.split())))

    def log(self, daemon: str) -> str:
        path = self.root / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def processes(self, job: str | None = None) -> list[int]:
        """Every process of this cluster still running: its daemons, the slurmstepd they started and the jobs' own
        processes, each of which has this cluster's ``SLURM_CONF`` in its environment. With ``job``: that job's
        slurmstepd (``slurmstepd: [<job>.batch]``) and processes (``SLURM_JOB_ID=<job>``) alone."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                ours = job is None or f"SLURM_JOB_ID={job}".encode() in environ
                ours = ours or f"[{job}.".encode() in (entry / "cmdline").read_bytes()
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if mark in environ and ours:
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """Stop every job, then every daemon (SIGTERM, SIGKILL after 10 s), then any process of the cluster still
        there (SIGKILL): nothing is left running."""
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--quiet", f"--user={os.getuid()}", timeout=15, check=False)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.run("squeue", "--noheader", check=False).stdout.strip():
                time.sleep(0.5)
        for name in reversed(list(self.daemons)):  # the slurmds first: they end the jobs' processes they started
            process = self.daemons.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for pid in self.processes():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def missing_programs() -> list[str]:
    return [name for name in (*DAEMONS, *COMMANDS) if shutil.which(name) is None]


def free_port() -> int:
    """A free TCP port for slurmctld or slurmd: below 15000, where no ddp run of a job listens (see
    :func:`first_job_id`), and below any ephemeral range (never a client connection's source port)."""
    for port in random.sample(range(10_000, 15_000), 200):
        if _port_free(port):
            return port
    raise ClusterUnavailable("no free TCP port between 10000 and 15000 for slurmctld and slurmd")


def first_job_id() -> int:
    """A job id to count from whose ddp port is free: Lightning's SLURMEnvironment listens on 15000 + the job id's
    last 4 digits, so two clusters on one machine (two test sessions) that both counted from 1 would collide."""
    for first in random.sample(range(1000, 9900, 100), 40):
        if all(_port_free(15000 + first + offset) for offset in range(0, 100, 10)):
            return first
    return 1


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def slurm_conf(root: Path, nodes: dict[str, str], cpus: int, controller: str = "127.0.0.1") -> str:
    """``nodes`` (name: address) in one partition, slurmctld at ``controller``; every file the daemons write under
    ``root``. No cgroups (containers rarely have them): processes are tracked through /proc, tasks are not bound to
    cores."""
    ctld_port, slurmd_port = free_port(), free_port()
    while slurmd_port == ctld_port:
        slurmd_port = free_port()
    return "\n".join(
        [
            "ClusterName=tests",
            f"FirstJobId={first_job_id()}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({controller})",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root / 'munge.socket'}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool-%n'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "LaunchParameters=use_interactive_step",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "ReturnToService=2",
            "JobRequeue=1",
            # seconds between SIGTERM and SIGKILL when a job ends early (scancel, requeue, time limit)
            "KillWait=30",
            "MinJobAge=300",
            "InactiveLimit=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "Waittime=0",
            *(f"NodeName={node} NodeAddr={address} CPUs={cpus} State=UNKNOWN" for node, address in nodes.items()),
            f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
            "",
        ]
    )


def start_cluster(root: Path, machines: Machines | None = None, timeout: float = 60) -> SlurmCluster:
    """Start munged, slurmctld and a slurmd (one on each of ``machines``, named like it; else one for this machine)
    with a config under ``root``, and wait for the nodes to be idle. Raises :class:`ClusterUnavailable` (after
    stopping whatever it started) where that cannot be done."""
    missing = missing_programs()
    if missing:
        raise ClusterUnavailable(f"SLURM is not installed here (no {', '.join(missing)}); make test-slurm installs it")
    if os.geteuid() != 0:
        raise ClusterUnavailable("starting slurmd needs root (it runs the jobs as their users); CI runs as root")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)  # munged refuses a key or socket in a folder others can write to
    (root / "state").mkdir(exist_ok=True)
    if machines is None:
        nodes, controller = {socket.gethostname().split(".")[0]: "127.0.0.1"}, "127.0.0.1"
    else:
        nodes, controller = dict(zip(machines.names, machines.addresses, strict=True)), machines.host_address
    for node in nodes:
        (root / f"spool-{node}").mkdir(exist_ok=True)
    cpus = max(1, min(2, os.cpu_count() or 1))
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, nodes, cpus, controller))
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    cluster = SlurmCluster(root=root, conf=conf, nodes=list(nodes), cpus=cpus)
    commands = {
        "munged": [
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={root / 'munge.socket'}",
            f"--pid-file={root / 'munged.pid'}",
            f"--log-file={root / 'munged.log'}",
            f"--seed-file={root / 'munged.seed'}",
        ],
        "slurmctld": ["slurmctld", "-D", "-i", "-f", str(conf)],
    }
    for index, node in enumerate(nodes):
        slurmd = ["slurmd", "-D", "-f", str(conf), "-N", node]
        commands[f"slurmd-{node}"] = slurmd if machines is None else machines.command(index, slurmd, host_sys=True)
    try:
        for name, command in commands.items():
            with (root / f"{name}.out").open("w") as out:
                cluster.daemons[name] = subprocess.Popen(
                    command, env=cluster.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            _wait_for_daemon(cluster, name, timeout)
        deadline = time.monotonic() + timeout
        while (state := cluster.node_state()) != "idle":
            if time.monotonic() > deadline:
                raise ClusterUnavailable(
                    f"nodes {list(nodes)} are {state or 'unknown'}, not idle, after {timeout:.0f} s"
                )
            time.sleep(0.5)
    except BaseException as error:
        cluster.stop()
        if isinstance(error, ClusterUnavailable):
            raise
        raise ClusterUnavailable(f"SLURM would not start here: {error}") from error
    return cluster


def _wait_for_daemon(cluster: SlurmCluster, name: str, timeout: float) -> None:
    """Until ``name`` answers (its socket or port); raise with the last line it logged if it exited."""
    deadline = time.monotonic() + timeout
    while True:
        process = cluster.daemons[name]
        if process.poll() is not None:
            said = (cluster.log(name) + (cluster.root / f"{name}.out").read_text(errors="replace")).strip()
            last = said.splitlines()[-1] if said else "nothing logged"
            raise ClusterUnavailable(f"{name} exited with status {process.returncode}: {last}")
        if name == "munged" and (cluster.root / "munge.socket").exists():
            return
        if name == "slurmctld" and cluster.run("scontrol", "ping", check=False).stdout.count("UP"):
            return
        node_state = cluster.node_state(name.removeprefix("slurmd-")) if name.startswith("slurmd-") else ""
        if node_state not in ("", "down*", "unknown", "unknown*"):
            return
        if time.monotonic() > deadline:
            raise ClusterUnavailable(f"{name} did not come up within {timeout:.0f} s (see {cluster.root})")
        time.sleep(0.3)


@contextlib.contextmanager
def cluster_or_skip(root: Path, machines: Machines | None = None) -> Iterator[SlurmCluster]:
    """:func:`start_cluster`, stopped at the end; a skip with the reason where it cannot be started."""
    try:
        cluster = start_cluster(root, machines)
    except ClusterUnavailable as reason:
        pytest.skip(str(reason))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The one-node cluster, started once for the session and stopped at its end; skips where it cannot be."""
    with cluster_or_skip(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def two_node_slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A cluster of two nodes, each a machine of its own (tests/support/machines.py), for the tests of one module."""
    with machines_or_skip(2) as machines, cluster_or_skip(tmp_path_factory.mktemp("slurm2"), machines) as cluster:
        yield cluster

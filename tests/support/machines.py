"""Separate "machines" on this host for the tests marked ``multinode``: network namespaces, each with its own
interface and address on a bridge, the way two machines share a switch.

:func:`start_machines` makes N namespaces ``<prefix>-<i>``, each joined to a bridge by a veth pair and given
``10.X.Y.(i+1)/24``; the bridge itself (this test's namespace) gets ``.254``, so the test process reaches every
machine. A process started with :meth:`Machines.popen` sees only its machine's network: its own loopback and
address, and a hosts file of its own (``/etc/netns/<name>/hosts``, which ``ip netns exec`` mounts on /etc/hosts)
where the host name and each machine's name resolve as on separate machines. Files are shared, as on machines with
one network file system. :meth:`Machines.cut` takes a machine's link down (its processes keep running,
unreachable), as a failed switch port or cable would. :meth:`Machines.close` kills every process left in the
namespaces and removes them and the bridge, whatever happened; namespaces left by a test session that was killed
are removed by the next one. Needs root (CI runs as root); elsewhere the tests are skipped with one line, or fail
where ``REQUIRE_MULTINODE`` is set (``make test-multinode``).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

NETNS_ETC = Path("/etc/netns")  # ip netns exec mounts <this>/<name>/hosts on /etc/hosts
PREFIX = "ptm"  # namespaces and links: ptm<pid>-<i>, ptm<pid>b (the bridge); names of at most 15 characters


class MachinesUnavailable(Exception):
    """Namespaces cannot be made here: the one-line reason to skip with."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise MachinesUnavailable(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


@dataclass
class Machines:
    """N namespaces on one bridge: their names, addresses, and the processes started in them."""

    names: list[str]
    addresses: list[str]
    bridge: str
    host_address: str  # the bridge's own, in the test's namespace
    processes: list[subprocess.Popen] = field(default_factory=list)

    def outside(self, machine: int) -> str:
        """The bridge's end of ``machine``'s link (its own end is ``eth0``, in its namespace)."""
        return f"{self.bridge[:-1]}v{machine}"

    def command(self, machine: int, command: list[str], host_sys: bool = False) -> list[str]:
        """``command`` as run on ``machine``: in its network namespace, its hosts file on /etc/hosts. ``ip netns exec``
        also mounts a /sys of the namespace's own, without /sys/fs/cgroup; ``host_sys`` keeps this host's (slurmd
        needs its cgroups)."""
        name = self.names[machine]
        if not host_sys:
            return ["ip", "netns", "exec", name, *command]
        hosts = f'mount --bind {NETNS_ETC / name / "hosts"} /etc/hosts && exec "$@"'  # in a mount namespace of its own
        enter = ["unshare", "--mount", "--propagation=private", "nsenter", f"--net=/run/netns/{name}"]
        return [*enter, "sh", "-c", hosts, "sh", *command]

    def popen(self, machine: int, command: list[str], **options: Any) -> subprocess.Popen:
        """Start ``command`` on ``machine`` in a session of its own (so its whole group can be killed)."""
        process = subprocess.Popen(self.command(machine, command), start_new_session=True, **options)
        self.processes.append(process)
        return process

    def cut(self, machine: int) -> None:
        """Take ``machine``'s link down: nothing reaches it, nothing leaves it; its processes keep running."""
        _ip("-n", self.names[machine], "link", "set", "eth0", "down")

    def mend(self, machine: int) -> None:
        """Bring ``machine``'s link back up."""
        _ip("-n", self.names[machine], "link", "set", "eth0", "up")

    def pids(self, machine: int) -> list[int]:
        result = _ip("netns", "pids", self.names[machine], check=False)
        return [int(pid) for pid in result.stdout.split()]

    def close(self) -> None:
        """Kill every process started here or still in a namespace, then remove the namespaces and the bridge."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)
        for machine in range(len(self.names)):
            for pid in self.pids(machine):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for index, name in enumerate(self.names):
            _ip("link", "delete", self.outside(index), check=False)  # at once, with its peer; a namespace's go later
            _ip("netns", "delete", name, check=False)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
        _ip("link", "delete", self.bridge, check=False)


def remove_leftovers() -> None:
    """Remove the namespaces and bridges of test sessions that are gone (killed before they could clean up)."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = name[len(PREFIX) :].split("-")[0]
        if name.startswith(PREFIX) and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "delete", name, check=False)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():  # bridges and the bridge's ends of links
        name = line.split(":")[1].strip().split("@")[0]
        owner = re.match(r"\d*", name[len(PREFIX) :]).group()
        if name.startswith(PREFIX) and owner and not Path(f"/proc/{owner}").exists():
            _ip("link", "delete", name, check=False)


def start_machines(count: int) -> Machines:
    """Make ``count`` machines on one bridge (see the module's docstring); :meth:`Machines.close` undoes it."""
    if os.geteuid() != 0:
        raise MachinesUnavailable("network namespaces need root (CI runs as root)")
    remove_leftovers()
    tag = f"{PREFIX}{os.getpid()}"
    subnet = f"10.{random.randint(100, 199)}.{random.randint(0, 255)}"
    machines = Machines(
        names=[f"{tag}-{i}" for i in range(count)],
        addresses=[f"{subnet}.{i + 1}" for i in range(count)],
        bridge=f"{tag}b",
        host_address=f"{subnet}.254",
    )
    try:
        _ip("link", "add", machines.bridge, "type", "bridge")
        _ip("addr", "add", f"{machines.host_address}/24", "dev", machines.bridge)
        _ip("link", "set", machines.bridge, "up")
        for i, (name, address) in enumerate(zip(machines.names, machines.addresses, strict=True)):
            outside = machines.outside(i)
            _ip("netns", "add", name)
            _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", outside, "master", machines.bridge, "up")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
        # as on a machine: its own host name names its address (gloo binds to that), the others' names theirs
        named = "".join(f"{address} {name}\n" for name, address in zip(machines.names, machines.addresses, strict=True))
        for name, address in zip(machines.names, machines.addresses, strict=True):
            (NETNS_ETC / name).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / name / "hosts").write_text(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n{named}")
        _wait_until_reachable(machines)
    except BaseException:
        machines.close()
        raise
    return machines


def _wait_until_reachable(machines: Machines, timeout: float = 10) -> None:
    """Until machine 0 reaches every other's address (a bridge port forwards only after its link is up)."""
    probe = "import socket,sys;socket.create_connection((sys.argv[1],9),1)"
    deadline = time.monotonic() + timeout
    for address in machines.addresses[1:]:
        while True:
            command = machines.command(0, ["python3", "-c", probe, address])
            result = subprocess.run(command, capture_output=True, text=True, timeout=30)
            if "refused" in result.stderr:  # the machine answered: nothing listens on port 9
                break
            if time.monotonic() > deadline:
                raise MachinesUnavailable(f"machine 0 cannot reach {address}: {result.stderr.strip()[-200:]}")
            time.sleep(0.2)


@contextlib.contextmanager
def machines_or_skip(count: int) -> Iterator[Machines]:
    """:func:`start_machines`, closed at the end; a skip with the reason where they cannot be made (a failure
    where ``REQUIRE_MULTINODE`` is set)."""
    try:
        machines = start_machines(count)
    except MachinesUnavailable as reason:
        if os.environ.get("REQUIRE_MULTINODE"):
            pytest.fail(f"REQUIRE_MULTINODE is set, but: {reason}")
        pytest.skip(str(reason))
    try:
        yield machines
    finally:
        machines.close()


@pytest.fixture
def two_machines() -> Iterator[Machines]:
    """Two machines on one bridge, removed after the test."""
    with machines_or_skip(2) as machines:
        yield machines

"""Where a figure was taken: the machine in one line (:func:`machine_description`), and the full record a
published result needs to be compared or reproduced (:func:`run_environment`)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from project.toolkit.host_memory import host_allocator

GIT_TIMEOUT_S = 5.0  # git on a slow network file system should not hold up a report


def machine_description() -> str:
    """The machine a measurement ran on, in one line (no host name): system, CPU cores, GPUs, torch.

    >>> "torch" in machine_description()
    True
    """
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    accelerators = f"{len(gpus)} x {gpus[0]}" if gpus else "no GPU"
    cores = usable_cores()
    return f"{platform.system()} {platform.machine()}, {cores} CPU cores, {accelerators}, torch {torch.__version__}"


def usable_cores() -> int:
    """The CPU cores this process may run on (a container's or ``taskset``'s limit, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's name: ``model name`` of ``/proc/cpuinfo`` on Linux (``platform.processor()`` there is only
    the architecture), else what ``platform`` knows.

    >>> isinstance(cpu_model(), str)
    True
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine() or "unknown"


def template_root() -> Path:
    """The folder that holds the ``project`` package: the template's checkout, when it is one."""
    return Path(__file__).resolve().parents[3]  # project/toolkit/measure/environment.py


def git_state(repo: Path) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout at ``repo``; ``(None, None)`` when ``repo`` is not the top of a
    checkout (e.g. the package was installed into site-packages, which may lie inside some other repository),
    git is missing, or it does not answer within :data:`GIT_TIMEOUT_S`.

    Dirty means a tracked file differs from the commit. Untracked files do not count: runs, logs and
    results are written into the checkout and do not change what the code does.
    """

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != repo.resolve():
        return None, None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    if commit is None or status is None:  # e.g. a repository without any commit yet
        return None, None
    return commit, bool(status)


def _cudnn_version() -> str | None:
    """cuDNN's version as ``major.minor.patch``: torch gives one integer, ``major*1000 + minor*100 + patch``
    up to cuDNN 8 and ``major*10000 + minor*100 + patch`` from cuDNN 9 on."""
    if not torch.backends.cudnn.is_available():
        return None
    number = torch.backends.cudnn.version()
    if number is None:
        return None
    major, rest = divmod(number, 10000) if number >= 90000 else divmod(number, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, ImportError, OSError, RuntimeError):  # a torch without NCCL: CPU-only, macOS, Windows
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def _package_version(name: str) -> str | None:
    """The installed version, read from the package's metadata: no import (``import lightning`` takes seconds)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def run_environment(repo: Path | None = None) -> dict[str, Any]:
    """Everything a reader needs to know where a figure comes from, as JSON-ready values.

    - ``device_name``, ``device_count``: the first CUDA GPU's name and the number of GPUs on this node;
      on a machine without a CUDA GPU, the CPU model and the cores this process may use;
    - ``cpu_model``, ``cpu_cores``: always, as the host feeds the device;
    - ``host_allocator``: how host memory is allocated (:func:`project.toolkit.host_memory.host_allocator`):
      on a CPU it changes a step's time by up to 3x;
    - ``cuda``, ``cudnn``, ``nccl``: the versions torch was built with / loads; None where torch has none
      (a CPU-only build). A CUDA build reports them on a machine without a GPU too;
    - ``torch``, ``lightning``, ``torchvision``, ``python``, ``hostname``;
    - ``git_commit``, ``git_dirty``: of the template's checkout (``repo``, by default the folder holding the
      ``project`` package), None when it is not a git checkout (see :func:`git_state`);
    - ``date``: now, ISO 8601 in UTC.

    >>> sorted(run_environment())[:4]
    ['cpu_cores', 'cpu_model', 'cuda', 'cudnn']
    """
    cpu, cores = cpu_model(), usable_cores()
    if torch.cuda.is_available():
        device_name, device_count = torch.cuda.get_device_name(0), torch.cuda.device_count()
    else:
        device_name, device_count = cpu, cores
    commit, dirty = git_state(template_root() if repo is None else repo)
    return {
        "device_name": device_name,
        "device_count": device_count,
        "cpu_model": cpu,
        "cpu_cores": cores,
        "host_allocator": host_allocator(),
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "nccl": _nccl_version(),
        "torch": torch.__version__,
        "lightning": _package_version("lightning"),
        "torchvision": _package_version("torchvision"),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "git_commit": commit,
        "git_dirty": dirty,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }

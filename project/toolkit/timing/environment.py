"""Where a figure was taken: the machine in one line, and the record a result needs to be compared or reproduced."""

from __future__ import annotations

import platform
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch.utils import collect_env

from project.toolkit.helpers import usable_cores
from project.toolkit.host_memory import host_allocator

GIT_TIMEOUT_S = 5.0  # git on a slow network file system should not hold up a report


def machine_description() -> str:
    """The machine in one line (no host name): system, CPU cores, GPUs, torch."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    accelerators = f"{count} x {torch.cuda.get_device_name(0)}" if count else "no GPU"
    system = f"{platform.system()} {platform.machine()}"
    return f"{system}, {usable_cores()} CPU cores, {accelerators}, torch {torch.__version__}"


def cpu_model() -> str:
    """The CPU's name, from ``lscpu`` where there is one (``platform.processor()`` is only the architecture)."""
    for line in (collect_env.get_cpu_info(collect_env.run) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def template_root() -> Path:
    """The folder that holds the ``project`` package: the template's checkout, when it is one."""
    return Path(__file__).resolve().parents[__name__.count(".")]  # from this module up past its top package


def git_state(repo: Path) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout whose top is ``repo`` (untracked files do not count), else Nones."""

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
    commit, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    return (None, None) if commit is None or status is None else (commit, bool(status))


def _cudnn_version() -> str | None:
    # torch's one integer: major * 10000 + ... from cuDNN 9, major * 1000 before
    number = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
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
    # from the package's metadata: importing lightning takes seconds
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def run_environment(repo: Path | None = None) -> dict[str, Any]:
    """Where a figure comes from, JSON-ready: device, CPU, OS, versions, host, git commit and date (UTC)."""
    cpu, cores = cpu_model(), usable_cores()
    gpu = torch.cuda.is_available()
    commit, dirty = git_state(template_root() if repo is None else repo)
    return {
        "device_name": torch.cuda.get_device_name(0) if gpu else cpu,
        "device_count": torch.cuda.device_count() if gpu else cores,
        "cpu_model": cpu,
        "cpu_cores": cores,
        "host_allocator": host_allocator(),
        "os": collect_env.get_os(collect_env.run),
        "nvidia_driver": collect_env.get_nvidia_driver_version(collect_env.run),
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

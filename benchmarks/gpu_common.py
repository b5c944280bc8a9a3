"""What the GPU commands share (``bash benchmarks/gpu_run.sh`` and its ``--check``): a command run with its output
logged and a timeout, the line without a GPU, and what a run of the template left in its folder."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from project.tools.bench.matrix import run_in_own_session

REPO = Path(__file__).resolve().parents[1]
ERROR_LINES = 8  # of a failing command's output, in a report


def no_gpu_line(tool: str = "gpu-check") -> str | None:
    """The one line ``tool`` prints on a machine without a usable CUDA GPU; None where there is one."""
    if torch.cuda.is_available():
        return None
    build = "yes" if torch.version.cuda else "no"
    return f"{tool}: no CUDA GPU here (torch {torch.__version__}, CUDA build: {build}); nothing to check"


def slug(text: str) -> str:
    """A folder name from a device name.

    >>> slug("NVIDIA H100 80GB HBM3")
    'nvidia-h100-80gb-hbm3'
    """
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _version(folder: Path) -> int:
    suffix = folder.name.removeprefix("version_")
    return int(suffix) if suffix.isdigit() else -1


def newest_run(root: Path) -> Path | None:
    """The newest ``lightning_logs/version_N`` under ``root``: the run folder of the latest command."""
    runs = sorted((root / "lightning_logs").glob("version_*"), key=_version)
    return runs[-1] if runs else None


def newest_json(root: Path, name: str) -> dict[str, Any] | None:
    """The JSON file ``name`` of the latest command's run folder (None if it wrote none)."""
    run = newest_run(root)
    path = run / name if run is not None else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def newest_timing(root: Path) -> dict[str, Any]:
    """The latest command's ``timing.json`` ({} if it wrote none)."""
    return newest_json(root, "timing.json") or {}


def run_logged(command: list[str], log: Path, timeout_s: float) -> tuple[int | None, str, float]:
    """Run ``command`` from the repository root (so ``python -m project`` is this checkout's) with its
    output (stdout and stderr) in ``log``; its exit status (None: timed out, killed), its output and
    its wall time."""
    start = time.perf_counter()
    with open(log, "w") as out:
        code = run_in_own_session(command, out, subprocess.STDOUT, timeout_s, cwd=REPO)
    return code, log.read_text(errors="replace"), time.perf_counter() - start


def last_lines(output: str, count: int = ERROR_LINES) -> list[str]:
    """The last ``count`` non-empty lines: where a traceback or a one-line error is."""
    return [line for line in output.splitlines() if line.strip()][-count:]

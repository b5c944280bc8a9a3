"""Where a figure was taken: the machine, in one line."""

from __future__ import annotations

import os
import platform

import torch


def machine_description() -> str:
    """The machine a measurement ran on, in one line (no host name): system, CPU cores, GPUs, torch.

    >>> "torch" in machine_description()
    True
    """
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    accelerators = f"{len(gpus)} x {gpus[0]}" if gpus else "no GPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.system()} {platform.machine()}, {cores} CPU cores, {accelerators}, torch {torch.__version__}"

"""Checks made before a run does any work, each turning a failure that would come later (a traceback, after minutes or
after a run folder was made) into one ``error:`` line now, or a warning where the setting is allowed on purpose."""

from __future__ import annotations

import difflib
import errno
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

from project.toolkit.dotted import chosen_class
from project.toolkit.errors import ProjectError
from project.toolkit.helpers import human_bytes, usable_cores
from project.toolkit.log import get_logger
from project.toolkit.strategies.registry import ACCELERATOR_CLASSES, COMMON_STRATEGIES

log = get_logger(__name__)


def available_memory_bytes() -> int | None:
    """The host memory free for a new allocation (``MemAvailable``), or None where the system does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_batch_fits_memory(image_size: int, batch_size: int, channels: int = 3, available: int | None = None) -> None:
    """Refuse an image size at which ONE batch of input images, as float32, exceeds the free host memory (a lower
    bound of a step's needs: ``--data.image_size=100000`` would try to allocate 30 GB for one image)."""
    available = available_memory_bytes() if available is None else available
    needed = batch_size * channels * image_size * image_size * 4  # bytes of float32
    if available is not None and needed > available:
        raise ProjectError(
            f"data.image_size={image_size} cannot fit: one batch of {batch_size} images of {channels} x {image_size}"
            f" x {image_size} pixels is {human_bytes(needed)} as float32, and this machine has {human_bytes(available)}"
            " of memory free; lower --data.image_size (the default is 112) or --data.batch_size"
        )


def warn_cpu_oversubscription(devices: Any, accelerator: Any, cuda_available: bool, cores: int | None = None) -> None:
    """Warn when a CPU run asks for more processes than there are CPU cores (fine for checks, not for timings)."""
    on_cpu = accelerator == "cpu" or (accelerator in (None, "auto") and not cuda_available)
    count = devices if isinstance(devices, int) else int(devices) if str(devices).strip().isdigit() else None
    cores = usable_cores() if cores is None else cores
    if on_cpu and count is not None and count > cores:
        text = "trainer.devices=%d starts %d CPU processes on this machine's %d CPU core(s): they share the cores. "
        text += "Fine to check a strategy, but its timings are not those of %d devices; use --trainer.devices=%d or "
        log.warning(text + "fewer to measure", count, count, cores, count, cores)


def check_writable(folder: Path, option: str = "trainer.default_root_dir", value: Any = None) -> None:
    """Refuse a run folder whose nearest existing folder takes no new file (made to check: permissions do not show a
    read-only file system); ``option`` and ``value`` (default: ``folder``) name the setting."""
    existing = Path(folder).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=existing, prefix=".write-check-"):
            pass
    except OSError as err:
        raise ProjectError(
            f"{option}={folder if value is None else value}: cannot write into {existing} ({err.strerror or err}); "
            f"the run folder goes there. Choose a folder you can write to with --{option}"
        ) from None


def check_master_port(environ: Any = None) -> None:
    """Refuse a ``MASTER_PORT`` already taken here, before the processes start (later: ``EADDRINUSE``)."""
    environ = os.environ if environ is None else environ
    value = environ.get("MASTER_PORT")
    if not value:
        return  # Lightning picks a free port itself
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ProjectError(f"MASTER_PORT={value} is not a port: use a number between 1 and 65535, or unset it")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # a port in TIME_WAIT is free: the store reuses it
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", int(value)))
        except OSError:
            raise ProjectError(
                f"MASTER_PORT={value} is already in use on this machine (another run?); unset MASTER_PORT to let the "
                "run pick a free port, or set one that is free"
            ) from None


def data_num_classes(data_config: Any) -> int | None:
    """The ``num_classes`` of the data set class a config chooses, without building it; None if it does not say."""
    value = getattr(chosen_class(data_config), "num_classes", None)
    return value if isinstance(value, int) else None


def data_in_channels(data_config: Any) -> int:
    """The channels of the data set class a config chooses (its ``image_shape``), 3 if it does not say."""
    shape = getattr(chosen_class(data_config), "image_shape", None)
    return shape[2] if isinstance(shape, tuple) and len(shape) == 3 and isinstance(shape[2], int) else 3


def check_trainer_choices(strategy: Any, accelerator: Any, devices: Any) -> None:
    """Refuse an unknown strategy or accelerator, a GPU on a machine without one and a device count that is none,
    naming what is allowed (Lightning's messages name neither the template's strategies nor the cause)."""
    count = devices if isinstance(devices, int) else None
    if isinstance(devices, str) and devices != "auto":
        if not re.fullmatch(r"-?\d+|\d+(,\d+)*,?", devices.strip()):
            count = 0
        elif "," not in devices:
            count = int(devices)
    if count is not None and count < 1 and (count != -1 or accelerator == "cpu"):
        raise ProjectError(
            f"trainer.devices={devices!r} is not allowed: use a number >= 1, a list of device indices, "
            "-1 (all GPUs) or auto"
        )
    known = StrategyRegistry.available_strategies()
    if isinstance(strategy, str) and strategy != "auto" and strategy not in known:
        near = difflib.get_close_matches(strategy, list(dict.fromkeys([*COMMON_STRATEGIES, *known])), n=2)
        hint = f"; did you mean {' or '.join(near)}?" if near else "."
        raise ProjectError(
            f"trainer.strategy={strategy!r} is not a strategy{hint} The template's: {', '.join(COMMON_STRATEGIES)} "
            "(Lightning's other names: docs/strategies.md)"
        )
    if not isinstance(accelerator, str):
        return
    allowed = {"auto", "gpu", *AcceleratorRegistry.available_accelerators(), *ACCELERATOR_CLASSES}
    if accelerator not in allowed:
        raise ProjectError(
            f"trainer.accelerator={accelerator!r} is not an accelerator; choose one of: {', '.join(sorted(allowed))}"
        )
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ProjectError(
            f"trainer.accelerator={accelerator!r}, but this machine has no CUDA GPU that torch can use "
            f"(torch {torch.__version__}); use --trainer.accelerator=cpu or auto"
        )


def check_slurm_tasks(devices: Any, num_nodes: Any, environ: Any = None) -> None:
    """Under srun, refuse task counts other than ``--trainer.devices`` per node x ``--trainer.num_nodes``, saying what
    to write: Lightning would end each task in a traceback, or wait for ranks that never start (no srun, 2+ tasks)."""
    env = os.environ if environ is None else environ
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):  # Lightning's own test
        return

    def count(value: Any) -> int | None:  # a plain positive number; None for "2(x3)", auto, -1 or absent
        text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
        return int(text) if text.isdigit() and int(text) > 0 else None

    ntasks, per_node, nodes = (count(env.get(f"SLURM_{key}")) for key in ("NTASKS", "NTASKS_PER_NODE", "NNODES"))
    listed = devices if isinstance(devices, (list, tuple)) else str(devices).split(",") if "," in str(devices) else None
    wanted = len([d for d in listed if str(d).strip()]) if listed else count(devices)
    wanted_nodes = count(num_nodes) or 1
    if ntasks is None:
        return
    suggested = per_node or (ntasks // nodes if nodes and ntasks % nodes == 0 else ntasks)
    run = f"--trainer.devices={suggested} --trainer.num_nodes={nodes or wanted_nodes}"
    if ntasks > 1 and "SLURM_STEP_ID" not in env:
        problem = (
            f"this process is not one of the job's {ntasks} tasks (SLURM_NTASKS={ntasks}, but no SLURM_STEP_ID: it was "
            "started without srun), so it would wait for processes that never start: run `srun python -m project "
            f"...` with `#SBATCH --ntasks-per-node={suggested}`, one task per device (scripts/slurm/train.sbatch)"
        )
    elif ntasks > 1 and "SLURM_NTASKS_PER_NODE" not in env:
        problem = (
            f"SLURM started {ntasks} tasks from --ntasks={ntasks} (-n) without --ntasks-per-node, which Lightning "
            f"needs to place one process per device: use `srun --ntasks-per-node={suggested}` (or `#SBATCH "
            f"--ntasks-per-node={suggested}`) instead of -n, with {run}"
        )
    elif per_node is not None and wanted is not None and per_node != wanted:
        problem = (
            f"SLURM starts {per_node} task(s) per node (--ntasks-per-node={per_node}), one process per device, but "
            f"--trainer.devices={wanted}: write --trainer.devices={per_node} (or run --ntasks-per-node={wanted})"
        )
    elif nodes is not None and nodes != wanted_nodes:
        problem = (
            f"the SLURM job has {nodes} node(s) (--nodes={nodes}), but --trainer.num_nodes={wanted_nodes}: write "
            f"--trainer.num_nodes={nodes} (or ask SLURM for --nodes={wanted_nodes})"
        )
    elif per_node is not None and nodes is not None and ntasks != per_node * nodes:
        problem = (
            f"SLURM started {ntasks} task(s) (SLURM_NTASKS={ntasks}), but {per_node} per node on {nodes} node(s) is "
            f"{per_node * nodes}, the processes {run} waits for: leave out --ntasks (-n) and give "
            f"--ntasks-per-node={per_node} --nodes={nodes}"
        )
    else:
        return
    raise ProjectError(problem)

"""Checks made before a run does any work, each turning a failure that would come later -- as a traceback,
after minutes, or after a run folder was made -- into one ``error:`` line now (or a warning, where the
setting is allowed on purpose):

- :func:`check_batch_fits_memory`: a batch of input images bigger than this machine's free memory
  (``--data.image_size=100000`` would try to allocate 30 GB for ONE image while resizing it);
- :func:`warn_cpu_oversubscription`: more CPU processes than CPU cores (allowed: two processes on one
  core still check a strategy, which is what the tests and CI do; but their timings are not those of
  N devices, so the run says so);
- :func:`check_writable`: a run folder that cannot be written (a read-only file system);
- :func:`check_master_port`: a ``MASTER_PORT`` someone else already listens on (an unset one is picked
  free by Lightning).
"""

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
from project.toolkit.log import get_logger
from project.toolkit.measure.environment import usable_cores
from project.toolkit.measure.tables import human_bytes
from project.toolkit.strategies import COMMON_STRATEGIES

log = get_logger(__name__)

FLOAT32_BYTES = 4


def available_memory_bytes() -> int | None:
    """The host memory free for a new allocation (``MemAvailable`` of ``/proc/meminfo``), or None where
    the system does not say."""
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
    """Refuse an image size at which ONE batch of input images, as float32, is bigger than the free host
    memory: a lower bound of what a step needs (the network's activations come on top), so only sizes that
    certainly cannot run are refused, before any memory is taken or any folder made."""
    available = available_memory_bytes() if available is None else available
    needed = batch_size * channels * image_size * image_size * FLOAT32_BYTES
    if available is not None and needed > available:
        raise ProjectError(
            f"data.image_size={image_size} cannot fit: one batch of {batch_size} images of {channels} x {image_size}"
            f" x {image_size} pixels is {human_bytes(needed)} as float32, and this machine has {human_bytes(available)}"
            " of memory free; lower --data.image_size (the default is 112) or --data.batch_size"
        )


def warn_cpu_oversubscription(devices: Any, accelerator: Any, cuda_available: bool, cores: int | None = None) -> None:
    """Warn when a CPU run asks for more processes (``--trainer.devices``) than there are CPU cores."""
    on_cpu = accelerator == "cpu" or (accelerator in (None, "auto") and not cuda_available)
    count = devices if isinstance(devices, int) else int(devices) if str(devices).strip().isdigit() else None
    cores = usable_cores() if cores is None else cores
    if on_cpu and count is not None and count > cores:
        log.warning(
            "trainer.devices=%d starts %d CPU processes on this machine's %d CPU core(s): they share the cores. "
            "Fine to check a strategy, but its timings are not those of %d devices; use --trainer.devices=%d or "
            "fewer to measure",
            count,
            count,
            cores,
            count,
            cores,
        )


def check_writable(folder: Path, option: str = "trainer.default_root_dir", value: Any = None) -> None:
    """Refuse a run folder that cannot be written: the nearest folder of ``folder`` that exists must take
    a new file (checked by making one: permissions alone do not show a read-only file system, nor
    anything for root). ``option`` and its ``value`` (default: ``folder``) name the setting in the message."""
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


def port_in_use(port: int, host: str = "") -> bool:
    """Whether another process listens on TCP ``port`` of this machine (a port left in TIME_WAIT by an
    earlier run counts as free, as the process group's store reuses it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def check_master_port(environ: Any = None) -> None:
    """Refuse a ``MASTER_PORT`` that is set and already taken on this machine, before the processes of a
    run are started (they would fail later with ``DistNetworkError ... EADDRINUSE``)."""
    environ = os.environ if environ is None else environ
    value = environ.get("MASTER_PORT")
    if not value:
        return  # Lightning picks a free port itself
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ProjectError(f"MASTER_PORT={value} is not a port: use a number between 1 and 65535, or unset it")
    if port_in_use(int(value)):
        raise ProjectError(
            f"MASTER_PORT={value} is already in use on this machine (another run?); unset MASTER_PORT to let the "
            "run pick a free port, or set one that is free"
        )


def data_num_classes(data_config: Any) -> int | None:
    """The class count of the data set a config chooses (its class's ``num_classes``), read without
    building the data set; None if the class does not say."""
    value = getattr(chosen_class(data_config), "num_classes", None)
    return value if isinstance(value, int) else None


def data_in_channels(data_config: Any) -> int:
    """The channels of the data set a config chooses (its class's ``image_shape``), 3 if it does not say."""
    shape = getattr(chosen_class(data_config), "image_shape", None)
    return shape[2] if isinstance(shape, tuple) and len(shape) == 3 and isinstance(shape[2], int) else 3


def check_trainer_choices(strategy: Any, accelerator: Any, devices: Any) -> None:
    """Refuse an unknown strategy or accelerator name, a GPU on a machine without one, and a device
    count that is no count, naming what is allowed (Lightning's own messages name neither this
    template's strategies nor the cause)."""
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
    allowed = {"auto", "gpu", *AcceleratorRegistry.available_accelerators()}
    if accelerator not in allowed:
        raise ProjectError(
            f"trainer.accelerator={accelerator!r} is not an accelerator; choose one of: {', '.join(sorted(allowed))}"
        )
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ProjectError(
            f"trainer.accelerator={accelerator!r}, but this machine has no CUDA GPU that torch can use "
            f"(torch {torch.__version__}); use --trainer.accelerator=cpu or auto"
        )

"""Which input path a run takes: the data set kept on the device and augmented there in batches if it fits in
:data:`MEMORY_SHARE` of its memory (a CPU run: RAM), else the DataLoader, with workers only to feed an accelerator."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import torch

from project.toolkit.helpers import usable_cores

AUTO: Literal["auto"] = "auto"
MEMORY_SHARE = 0.25  # of the device's memory (a CPU run: RAM per process) on_device=auto may fill
MAX_WORKERS = 4  # num_workers=auto on an accelerator's DataLoader path: at most this many per process
DATA_WAIT_WARNING = 0.10  # a fit whose data wait is above this share of its epoch time is told so


@dataclass(frozen=True)
class Machine:
    """What the choice depends on, for one training process."""

    device: str  # cpu, cuda, xla, mps, ...
    memory_bytes: int | None  # the device's memory (a CPU run: the RAM); None where unknown
    cpus: int  # the CPUs this process's node lets it use
    processes: int = 1  # training processes on the node, sharing its CPUs (and on a CPU run its RAM)


@dataclass(frozen=True)
class InputPath:
    """The chosen path: the data set on the device or not, the DataLoader workers, and why."""

    on_device: bool
    num_workers: int
    reason: str
    from_files: bool = False  # images decoded from files, which stay off the device

    @property
    def name(self) -> str:
        """``on_device`` or ``dataloader``, as ``timing.json`` writes it."""
        return "on_device" if self.on_device else "dataloader"


def choose_input_path(
    on_device: bool | Literal["auto"],
    num_workers: int | Literal["auto"],
    dataset_bytes: int,
    machine: Machine,
    in_trainer: bool = True,
    from_files: bool = False,
) -> InputPath:
    """The input path for ``dataset_bytes`` of images on ``machine`` given the two options (an explicit value
    wins over ``auto``); ``in_trainer=False``: no Trainer would turn the on-device index batches into images;
    ``from_files``: the images are decoded from files in the workers, never kept on the device."""
    if from_files:
        workers, why = _workers(num_workers, machine)
        return InputPath(False, workers, f"images decoded from files; {why}", from_files=True)
    if on_device is True:
        return InputPath(True, 0, "data.on_device=true")
    if on_device is not False and num_workers != AUTO:
        return InputPath(False, int(num_workers), f"data.num_workers={num_workers} asks for the DataLoader path")
    budget = memory_budget(machine)
    if on_device is False:
        because = "data.on_device=false"
    elif not in_trainer:
        because = "no Trainer, whose on_after_batch_transfer would make the images"
    elif machine.device == "xla":  # untried: looking images up on an XLA device may recompile its lazy tensors
        because = "XLA: the data set stays in host memory"
    elif budget is None:
        because = f"the {machine.device} device's memory is unknown"
    else:
        size = f"the data set ({dataset_bytes / 1e6:.0f} MB)"
        where = "the RAM" if machine.device == "cpu" else f"the {machine.device} device's memory"
        shared = (
            f", shared by {machine.processes} processes" if machine.device == "cpu" and machine.processes > 1 else ""
        )
        share = f"{100 * MEMORY_SHARE:.0f} % of {where} ({machine.memory_bytes / 2**30:.0f} GiB{shared})"
        if dataset_bytes <= budget:
            return InputPath(True, 0, f"{size} fits in {share}: kept there, augmented in batches")
        because = f"{size} is more than {share}"
    workers, why = _workers(num_workers, machine)
    return InputPath(False, workers, f"{because}; {why}")


def memory_budget(machine: Machine) -> int | None:
    """Bytes of ``machine``'s memory that ``on_device=auto`` may fill with the data set; None where unknown."""
    if machine.memory_bytes is None:
        return None
    sharers = machine.processes if machine.device == "cpu" else 1
    return int(MEMORY_SHARE * machine.memory_bytes / max(1, sharers))


def _workers(num_workers: int | Literal["auto"], machine: Machine) -> tuple[int, str]:
    """DataLoader workers per process, and why."""
    if num_workers != AUTO:
        return int(num_workers), f"data.num_workers={num_workers}"
    if machine.device == "cpu":
        return 0, "no workers: on a CPU run they would take cores from the training step"
    workers = max(1, min(MAX_WORKERS, machine.cpus // max(1, machine.processes)))
    return workers, f"{workers} workers: min({MAX_WORKERS}, CPUs per process) feed the {machine.device} device"


def data_wait_advice(fraction: float | None, path: InputPath, machine: Machine) -> str | None:
    """One line naming the option that would help a fit whose training waited for its input more than
    :data:`DATA_WAIT_WARNING` of the epoch time; None when it did not."""
    if fraction is None or fraction <= DATA_WAIT_WARNING:
        return None
    said = f"training waited for its input {100 * fraction:.0f} % of the epoch time ({path.name}"
    said += ")" if path.on_device else f", {path.num_workers} workers)"
    if path.on_device:  # what is left is the batched augmentation itself, in the training process
        return (
            f"{said}; a smaller --data.image_size resizes less, or --data.on_device=false "
            "--data.num_workers=N augments in worker processes"
        )
    if path.from_files:
        return f"{said}; more --data.num_workers decode more files at once, a smaller --data.image_size resizes less"
    if machine.device == "cpu":
        return f"{said}; try --data.on_device=true: the data set in memory, augmented in batches"
    hint = f"{said}; try --data.on_device=true (the data set on the {machine.device} device, if it fits)"
    most = machine.cpus // max(1, machine.processes)
    return hint + (f" or --data.num_workers={most}" if path.num_workers < most else "")


def machine_of(trainer: Any) -> Machine:
    """The facts of the machine the ``trainer``'s process trains on (without a Trainer: this CPU)."""
    device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
    processes = max(1, int(getattr(trainer, "num_devices", 1) or 1)) if trainer is not None else 1
    return Machine(device.type, device_memory_bytes(device), usable_cores(), processes)


def device_memory_bytes(device: torch.device) -> int | None:
    """Total memory of ``device``: a CUDA GPU's, the machine's RAM for the CPU; None for any other."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # not a POSIX system
            return None
    return None

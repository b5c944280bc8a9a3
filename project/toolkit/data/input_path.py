"""Which of the two input paths a run takes, and how many DataLoader workers: chosen per run from the
options and the machine, so that the default is the fast path without the user knowing why.

The two paths give the same images (see :mod:`project.toolkit.data.augmentation`):

- ``on_device``: the whole data set (uint8) is kept on the training device -- the GPU, or on a CPU run
  the training process's own memory -- and augmented there in whole batches; the loaders carry only
  indices and use no worker processes;
- ``dataloader``: each image is augmented on its own, in DataLoader worker processes (or, with 0
  workers, in the training process), and the batch is copied to the device.

The rule (:func:`choose_input_path`; ``auto`` is the default of both options, an explicit value wins):

- the data set is kept on the device when it takes at most :data:`MEMORY_SHARE` of the device's memory
  (on a CPU run: of the machine's RAM, shared by the node's training processes): batched augmentation
  costs a fraction of per-image augmentation, and on a GPU it spares the CPU loader that cannot keep up
  with a fast GPU at small images;
- otherwise (a data set too big for the device, a device whose memory is unknown, XLA), the
  DataLoader; with workers only where they add throughput: a GPU (or XLA device) fed from the CPU gets
  ``min(4, CPUs per process)``; a CPU run gets none, as workers would take cores from the training
  step itself (measured in ``benchmarks/results/perf/``).

:func:`machine_of` reads the facts the rule needs from a Trainer; the rule itself is a pure function,
unit-tested for every kind of machine and data size without timing anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import torch

from project.toolkit.measure.environment import usable_cores

AUTO: Literal["auto"] = "auto"
MEMORY_SHARE = 0.25
"""``on_device=auto`` keeps the data set on the device when it takes at most this share of the device's
memory (a CPU run: of the RAM, divided by the training processes on the node); the rest is for the
model, its activations and, on a CPU, the DataLoader path's arrays that the on-device copy sits beside."""
MAX_WORKERS = 4
"""``num_workers=auto`` on the DataLoader path of an accelerator: at most this many per process."""
DATA_WAIT_WARNING = 0.10
"""A fit whose data wait is above this share of its epoch time gets a line saying so (:func:`data_wait_advice`)."""


@dataclass(frozen=True)
class Machine:
    """What the choice depends on, for one training process.

    Args:
        device: The device type the process trains on: ``cpu``, ``cuda``, ``xla``, ``mps``, ...
        memory_bytes: The device's memory (on a CPU run the machine's RAM); None where unknown.
        cpus: The CPUs this process's node lets it use.
        processes: Training processes on the node, which share its CPUs (and on a CPU run its RAM).
    """

    device: str
    memory_bytes: int | None
    cpus: int
    processes: int = 1


@dataclass(frozen=True)
class InputPath:
    """The chosen path: the data set on the device or not, the DataLoader workers, and why."""

    on_device: bool
    num_workers: int
    reason: str

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
) -> InputPath:
    """The input path for ``dataset_bytes`` of images on ``machine``, given the two options (``auto`` or a
    value); ``in_trainer=False`` for a data module used without a Trainer (a loop of one's own), where
    nothing would turn the on-device path's index batches into images.

    >>> gpu = Machine("cuda", memory_bytes=80 * 2**30, cpus=16)
    >>> choose_input_path("auto", "auto", 180_000_000, gpu).name  # CIFAR-10 on an 80 GB GPU
    'on_device'
    >>> big = choose_input_path("auto", "auto", 150 * 10**9, gpu)  # an ImageNet-sized set does not fit
    >>> big.name, big.num_workers, big.reason.split("; ")[0]
    ('dataloader', 4, "the data set (150000 MB) is more than 25 % of the cuda device's memory (80 GiB)")
    >>> choose_input_path("auto", 2, 180_000_000, gpu).name  # an explicit value wins
    'dataloader'
    """
    if on_device is True:
        return InputPath(True, 0, "data.on_device=true")
    if on_device is False:
        workers, why = _workers(num_workers, machine)
        return InputPath(False, workers, f"data.on_device=false; {why}")
    if num_workers != AUTO:
        return InputPath(False, int(num_workers), f"data.num_workers={num_workers} asks for the DataLoader path")
    if not in_trainer:
        workers, why = _workers(num_workers, machine)
        return InputPath(False, workers, f"no Trainer, whose on_after_batch_transfer would make the images; {why}")
    size = f"the data set ({_mb(dataset_bytes)})"
    if machine.device == "xla":
        # Looking images up by index on an XLA device has not been tried: its lazy tensors may recompile.
        workers, why = _workers(num_workers, machine)
        return InputPath(False, workers, f"XLA: the data set stays in host memory; {why}")
    budget = memory_budget(machine)
    if budget is None:
        workers, why = _workers(num_workers, machine)
        return InputPath(False, workers, f"the {machine.device} device's memory is unknown; {why}")
    where = _memory_name(machine)
    if dataset_bytes <= budget:
        return InputPath(
            True, 0, f"{size} fits in {100 * MEMORY_SHARE:.0f} % of {where}: kept there, augmented in batches"
        )
    workers, why = _workers(num_workers, machine)
    return InputPath(False, workers, f"{size} is more than {100 * MEMORY_SHARE:.0f} % of {where}; {why}")


def memory_budget(machine: Machine) -> int | None:
    """Bytes of ``machine``'s memory that ``on_device=auto`` may fill with the data set; None where unknown.

    >>> memory_budget(Machine("cpu", memory_bytes=16 * 2**30, cpus=8, processes=2)) / 2**30  # RAM is shared
    2.0
    >>> memory_budget(Machine("cuda", memory_bytes=16 * 2**30, cpus=8, processes=2)) / 2**30  # a GPU each
    4.0
    """
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


def _mb(count: int) -> str:
    return f"{count / 1e6:.0f} MB"


def _memory_name(machine: Machine) -> str:
    gigabytes = f"{machine.memory_bytes / 2**30:.0f} GiB"
    if machine.device != "cpu":
        return f"the {machine.device} device's memory ({gigabytes})"
    shared = f", shared by {machine.processes} processes" if machine.processes > 1 else ""
    return f"the RAM ({gigabytes}{shared})"


def data_wait_advice(fraction: float | None, path: InputPath, machine: Machine) -> str | None:
    """One line for a fit whose training waited for its input more than :data:`DATA_WAIT_WARNING` of the
    epoch time, naming the option that would help; None when it did not.

    >>> cpu = Machine("cpu", memory_bytes=2**34, cpus=2)
    >>> for part in data_wait_advice(0.3, InputPath(False, 2, "data.num_workers=2"), cpu).split("; "):
    ...     print(part)
    training waited for its input 30 % of the epoch time (dataloader, 2 workers)
    try --data.on_device=true: the data set in memory, augmented in batches
    >>> data_wait_advice(0.05, InputPath(False, 2, ""), cpu) is None
    True
    """
    if fraction is None or fraction <= DATA_WAIT_WARNING:
        return None
    said = f"training waited for its input {100 * fraction:.0f} % of the epoch time ({path.name}"
    said += ")" if path.on_device else f", {path.num_workers} workers)"
    if path.on_device:  # what is left is the batched augmentation itself, in the training process
        return (
            f"{said}; a smaller --data.image_size resizes less, or --data.on_device=false "
            "--data.num_workers=N augments in worker processes"
        )
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

"""What the plan reads from a run (:class:`Measured`, from its ``timing.json``) and where it puts it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from project.toolkit.errors import ProjectError


@dataclass
class Measured:
    """What the plan takes from one run (seconds per step of rank 0, bytes of the whole network)."""

    accelerator: str
    world_size: int
    batch_size: int
    data_wait: float
    forward: float
    backward: float
    optimizer: float
    rest: float
    parameter_bytes: float
    buffer_bytes: float
    activation_bytes_per_sample: float
    optimizer_state_bytes: float
    peak_memory_mb: float | None
    image_bytes_per_sample: float = 0.0
    units: list[list[Any]] = field(default_factory=list)  # [name, forward FLOPs, parameters, output bytes]
    block_seconds: dict[str, Any] | None = None  # the units timed after the fit (block_times.py)
    name: str = ""
    threads: int | None = None  # the run's intra-op threads
    cores: int | None = None  # the machine's cores (a CPU run)
    parameter_numels: dict[str, Any] | None = None  # per unit and the rest: parameter tensors' sizes

    @property
    def step(self) -> float:
        return self.data_wait + self.forward + self.backward + self.optimizer + self.rest

    @property
    def samples_per_second(self) -> float:
        return self.batch_size / self.step

    @property
    def parameters(self) -> int:  # in its units
        return sum(unit[2] for unit in self.units)


@dataclass
class Link:
    """The ring's slowest link: seconds per message, bytes per second; ``here``: between this machine's processes."""

    latency: float
    bandwidth: float
    source: str
    here: bool = False


@dataclass
class Replayed:
    """ddp's and fsdp's seconds per step replayed here, and fsdp's optimizer step over a whole one."""

    ddp_seconds: float
    fsdp_seconds: float
    fsdp_optimizer_factor: float
    how: str


@dataclass
class Target:
    """Where the plan puts the run; ``batch``: ``global`` (split across the devices) or ``per-device``; ``slowdown``:
    how much slower each device runs the run's multi-threaded work than the run did (1: devices of their own)."""

    devices: int
    nodes: int = 1
    batch: str = "global"
    micro_batches: int = 4
    slowdown: float = 1.0

    @property
    def shared_cores(self) -> bool:
        return self.slowdown > 1

    @property
    def world(self) -> int:
        return self.devices * self.nodes


def read_run(path: Path) -> Measured:
    """The :class:`Measured` of a run folder (or a ``timing.json``); a :class:`ProjectError` naming what is missing."""
    file = path / "timing.json" if path.is_dir() else path
    try:
        timing = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ProjectError(f"plan: {file} is not a readable timing.json ({e}); give the run folder of a fit") from None
    anatomy, network = timing.get("step_anatomy"), timing.get("network")
    if not isinstance(anatomy, dict) or not anatomy.get("ranks") or not isinstance(network, dict):
        raise ProjectError(
            f"plan: {file} has no step_anatomy or network (a fit with --timing.anatomy_steps=0, or an older "
            "template's); run the fit again with this template (anatomy_steps > 0, at least 2 batches per epoch)"
        )
    rank = anatomy["ranks"][0]
    forward, backward = rank.get("forward"), rank.get("backward")
    if forward is None or backward is None:  # a pipeline's schedule: split as the FLOPs are (backward ~ 2x)
        compute = rank.get("compute") or 0.0
        forward, backward = compute / 3, 2 * compute / 3
    return Measured(
        accelerator=str(timing.get("accelerator")),
        world_size=int(timing.get("world_size") or 1),
        batch_size=int(timing["batch_size"]),
        data_wait=rank.get("data_wait") or 0.0,
        forward=forward,
        backward=backward,
        optimizer=rank.get("optimizer") or 0.0,
        rest=(rank.get("rest") or 0.0) + (rank.get("communication") or 0.0) + (rank.get("bubble") or 0.0),
        parameter_bytes=network["parameter_bytes"],
        buffer_bytes=network.get("buffer_bytes", 0),
        activation_bytes_per_sample=network.get("activation_bytes_per_sample", 0),
        optimizer_state_bytes=network.get("optimizer_state_bytes", 0),
        peak_memory_mb=(timing.get("peak_memory_mb") or [None])[0],
        image_bytes_per_sample=network.get("input_bytes_per_sample", 3 * int(timing.get("image_size") or 0) ** 2 * 4),
        units=network.get("units", []),
        block_seconds=network.get("block_seconds"),
        name=str(file),
        threads=anatomy.get("threads"),
        cores=(timing.get("environment") or {}).get("cpu_cores"),
        parameter_numels=network.get("parameter_numels"),
    )

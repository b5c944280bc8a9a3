"""What the plan reads from a run (:class:`Measured`, from its ``timing.json`` and ``block_times.json``), the link and
where it puts the run (:class:`Link`, :class:`Target`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from project.toolkit.errors import ProjectError

BLOCK_TIMES = "block_times.json"  # beside timing.json, written by the BlockTimes callback (block_times.py)


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
    block_seconds: dict[str, Any] | None = None  # the units timed after the fit (block_times.json)
    name: str = ""
    threads: int | None = None  # the run's intra-op threads
    cores: int | None = None  # the machine's cores (a CPU run)

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
    """The ring's slowest link: seconds per message, bytes per second, and where the figures come from."""

    latency: float
    bandwidth: float
    source: str


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


def link_from(gbps: float | None, latency_us: float) -> Link:
    """The link given (``--link-gbps``, ``--link-latency-us``), or measured here (:mod:`.link`)."""
    if gbps is not None:
        return Link(latency_us * 1e-6, gbps * 1e9 / 8, f"given: {gbps:g} Gbit/s")
    from project.tools.plan.link import measure_link

    measured = measure_link()
    return Link(measured["latency_s"], measured["bandwidth_bytes_per_s"], "measured here (gloo all_reduce)")


def threads_per_process(run: Measured, devices: int) -> int:
    """The intra-op threads Lightning gives each of ``devices`` processes on the run's machine's cores."""
    return max(1, (run.cores or devices) // devices)


def core_slowdown(run: Measured, shared_cores: str, devices: int, nodes: int = 1) -> float:
    """How much slower each device runs the multi-threaded work than the run did, for ``--shared-cores``; with ``auto``
    on a one-node CPU run, the run's threads over those Lightning gives each of N processes on its cores."""
    if shared_cores != "auto":
        return float(devices * nodes) if shared_cores == "yes" else 1.0
    if run.accelerator != "cpu" or nodes != 1:
        return 1.0
    if not run.threads or not run.cores:
        return float(devices)
    per_process = threads_per_process(run, devices)
    return max(1.0, run.threads / per_process * max(1.0, devices * per_process / run.cores))


def _read_json(file: Path, hint: str) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ProjectError(f"plan: {file} is not a readable {file.name} ({e}); {hint}") from None


def read_run(path: Path) -> Measured:
    """The :class:`Measured` of a run folder (or a ``timing.json``), with the ``block_times.json`` beside it if any;
    a :class:`ProjectError` naming what is missing."""
    file = path / "timing.json" if path.is_dir() else path
    timing = _read_json(file, "give the run folder of a fit")
    anatomy, network = timing.get("step_anatomy"), timing.get("network")
    if not isinstance(anatomy, dict) or not anatomy.get("ranks") or not isinstance(network, dict):
        raise ProjectError(
            f"plan: {file} has no step_anatomy or network (a fit with --timing.anatomy_steps=0, or an older "
            "template's); run the fit again with this template (anatomy_steps > 0, at least 2 batches per epoch)"
        )
    times = file.parent / BLOCK_TIMES
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
        block_seconds=_read_json(times, "time the blocks again, or remove it") if times.is_file() else None,
        name=str(file),
        threads=anatomy.get("threads"),
        cores=(timing.get("environment") or {}).get("cpu_cores"),
    )

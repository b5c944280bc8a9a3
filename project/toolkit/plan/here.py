"""What the plan measures on this machine: its link, how its processes share the cores, ddp's and fsdp's cost."""

from __future__ import annotations

import os
from typing import Any

from project.toolkit.plan.formulas import unit_seconds
from project.toolkit.plan.inputs import Link, Measured, Replayed, Target
from project.toolkit.plan.predict import _block_times, _device_share, _to_run


def core_slowdown(run: Measured, shared_cores: str, devices: int, nodes: int = 1, sharing: float = 1.0) -> float:
    """How much slower each device runs the multi-threaded work than the run did, for ``--shared-cores``; with ``auto``
    on a one-node CPU run, from the threads Lightning gives N processes and the measured ``sharing``."""
    if shared_cores != "auto":
        return float(devices * nodes) if shared_cores == "yes" else 1.0
    if run.accelerator != "cpu" or nodes != 1:
        return 1.0
    if not run.threads or not run.cores:
        return float(devices)
    per_process = threads_per_process(run, devices)
    return max(1.0, run.threads / per_process * max(1.0, devices * per_process / run.cores)) * sharing


def sharing_here(run: Measured, shared_cores: str, devices: int, nodes: int = 1) -> tuple[float, str]:
    """For ``auto`` on a one-node CPU run: how much N processes at once slow each other here (:mod:`.cores`); else 1."""
    if shared_cores != "auto" or run.accelerator != "cpu" or nodes != 1 or devices < 2 or not run.cores:
        return 1.0, ""
    from project.toolkit.plan.cores import measure_core_sharing

    measured = measure_core_sharing(devices, threads_per_process(run, devices))
    note = f"processes computing at once: {measured['factor']:.2f}x measured here ({measured['how']})"
    return measured["factor"], note


def threads_per_process(run: Measured, devices: int) -> int:
    """The intra-op threads Lightning gives each of ``devices`` processes on the run's machine's cores."""
    return max(1, (run.cores or devices) // devices)


def stand_in_work(run: Measured, target: Target) -> list[Any] | None:
    """Each unit's compute on a device of ``target`` (:class:`.replay.UnitWork`); None where the run timed no blocks."""
    from project.toolkit.plan.replay import UnitWork

    times = _block_times(run)
    if times is None:
        return None
    samples = run.batch_size * _device_share(target, target.world)
    scale = {kind: 1.0 if factor is None else factor for kind, factor in _to_run(run, times).items()}

    def seconds(kind: str, i: int) -> float:
        return unit_seconds(times, kind, i, samples) * scale[kind] * target.slowdown

    return [UnitWork(seconds("forward", i), seconds("backward", i), u[3] * samples) for i, u in enumerate(run.units)]


def replay_here(run: Measured, target: Target, link: Link) -> Replayed | None:
    """ddp's and fsdp's cost per step replayed here (:mod:`.replay`) for a one-node CPU run; None elsewhere."""
    devices, numels = target.devices, run.parameter_numels
    here = link.here and run.accelerator == "cpu" and target.nodes == 1 and 2 <= devices <= (os.cpu_count() or 1)
    if not here or not numels or len(numels["units"]) != len(run.units):
        return None
    from project.toolkit.plan.replay import replay_data_parallel

    work = stand_in_work(run, target)
    threads = threads_per_process(run, devices)
    measured = replay_data_parallel(numels["units"], numels["rest"], int(run.buffer_bytes), devices, threads, work)
    return Replayed(*(measured[k] for k in ("ddp_seconds", "fsdp_seconds", "fsdp_optimizer_factor", "how")))


def link_from(gbps: float | None, latency_us: float) -> Link:
    """The link given (``--link-gbps``, ``--link-latency-us``), or measured here (:mod:`.link`)."""
    if gbps is not None:
        return Link(latency_us * 1e-6, gbps * 1e9 / 8, f"given: {gbps:g} Gbit/s")
    from project.toolkit.plan.link import measure_link

    measured = measure_link()
    return Link(measured["latency_s"], measured["bandwidth_bytes_per_s"], "measured here (gloo all_reduce)", here=True)

"""What the plan measures on this machine: its link, how its processes share the cores, and ddp's and fsdp's
cost replayed (for a CPU run planned on the machine it ran on)."""

from __future__ import annotations

import os
from typing import Any

from project.toolkit.plan.formulas import unit_seconds
from project.toolkit.plan.inputs import Link, Measured, Replayed, Target
from project.toolkit.plan.predict import _block_times, _device_share, _to_run


def core_slowdown(run: Measured, shared_cores: str, devices: int, nodes: int = 1, sharing: float = 1.0) -> float:
    """How much slower each device runs the multi-threaded work than the run did (see :class:`Target`):
    ``shared_cores`` is ``--shared-cores`` (``yes``: ``devices x nodes``; ``no``: 1).

    With ``auto``, for a CPU run on one node: N processes of ``max(1, cores // N)`` threads each (what
    Lightning gives them) on the machine's cores, against the run's threads, times ``sharing``: how much
    processes computing at once slow each other on this machine beyond that (:func:`sharing_here`); N where
    the threads and cores are unknown; 1 elsewhere (devices of their own).

    >>> run = Measured("cpu", 1, 32, 0, 0, 0, 0, 0, 1, 0, 0, 0, None, threads=2, cores=2)
    >>> core_slowdown(run, "auto", 2), core_slowdown(Measured(**{**run.__dict__, "threads": 1}), "auto", 2, sharing=1.8)
    (2.0, 1.8)
    """
    if shared_cores != "auto":
        return float(devices * nodes) if shared_cores == "yes" else 1.0
    if run.accelerator != "cpu" or nodes != 1:
        return 1.0
    if not run.threads or not run.cores:
        return float(devices)
    per_process = threads_per_process(run, devices)
    return max(1.0, run.threads / per_process * max(1.0, devices * per_process / run.cores)) * sharing


def sharing_here(run: Measured, shared_cores: str, devices: int, nodes: int = 1) -> tuple[float, str]:
    """For ``--shared-cores auto`` on a one-node CPU run: how much ``devices`` processes computing at once slow
    each other on this machine, measured (:mod:`project.toolkit.plan.cores`), and what was measured; 1
    elsewhere. The plan is then made on the machine whose cores it is about."""
    if shared_cores != "auto" or run.accelerator != "cpu" or nodes != 1 or devices < 2 or not run.cores:
        return 1.0, ""
    from project.toolkit.plan.cores import measure_core_sharing

    measured = measure_core_sharing(devices, threads_per_process(run, devices))
    note = f"processes computing at once: {measured['factor']:.2f}x measured here ({measured['how']})"
    return measured["factor"], note


def threads_per_process(run: Measured, devices: int) -> int:
    """The intra-op threads Lightning gives each of ``devices`` processes on the run's machine's cores.

    >>> threads_per_process(Measured("cpu", 1, 32, 0, 0, 0, 0, 0, 1, 0, 0, 0, None, cores=16), 4)
    4
    """
    return max(1, (run.cores or devices) // devices)


def stand_in_work(run: Measured, target: Target) -> list[Any] | None:
    """Each unit's compute on a device of ``target`` for the replay to stand in for
    (:class:`project.toolkit.plan.replay.UnitWork`: forward and backward seconds, output bytes): the
    plan's compute for it -- its block's times at the device's share of the batch, scaled to the run's
    forward and backward as :func:`share_seconds` scales them, ``slowdown`` x -- and its output at that
    share; ``None`` where the run timed no blocks.

    >>> times = {"batch_sizes": [32, 8], "forward": [[0.2, 0.2], [0.05, 0.05]], "backward": [[0.4, 0.4], [0.1, 0.1]]}
    >>> run = Measured("cpu", 1, 32, 0, 0.4, 0.8, 0, 0, 1, 0, 0, 0, None, units=[["a", 1, 1, 10], ["b", 1, 1, 20]],
    ...                block_seconds=times)
    >>> [tuple(round(x, 3) for x in w) for w in stand_in_work(run, Target(2, slowdown=2.0))]
    [(0.2, 0.4, 160.0), (0.2, 0.4, 320.0)]
    """
    from project.toolkit.plan.replay import UnitWork

    times = _block_times(run)
    if times is None:
        return None
    samples = run.batch_size * _device_share(target, target.world)
    scale = {kind: 1.0 if factor is None else factor for kind, factor in _to_run(run, times).items()}
    return [
        UnitWork(
            *(
                unit_seconds(times, kind, i, samples) * scale[kind] * target.slowdown
                for kind in ("forward", "backward")
            ),
            unit[3] * samples,
        )
        for i, unit in enumerate(run.units)
    ]


def replay_here(run: Measured, target: Target, link: Link) -> Replayed | None:
    """ddp's and fsdp's cost per step replayed (:mod:`project.toolkit.plan.replay`) where the plan is about
    this machine's processes: a CPU run that recorded its tensors' sizes, one node, 2 to as many devices as
    this machine has cores, the link measured here (``link.here``). Each unit's compute is stood in for where
    the run timed its blocks (:func:`stand_in_work`). ``None`` elsewhere: the formulas' collectives then stand.

    >>> run = Measured("cuda", 1, 32, 0, 0.4, 0.8, 0, 0, 1, 0, 0, 0, None, parameter_numels={"units": [], "rest": []})
    >>> replay_here(run, Target(2), Link(1e-4, 2e9, "measured", here=True)) is None  # a GPU run: the formulas
    True
    """
    devices, numels = target.devices, run.parameter_numels
    if (
        not link.here
        or run.accelerator != "cpu"
        or target.nodes != 1
        or not 2 <= devices <= (os.cpu_count() or 1)
        or not numels
        or len(numels["units"]) != len(run.units)
    ):
        return None
    from project.toolkit.plan.replay import replay_data_parallel

    work = stand_in_work(run, target)
    threads = threads_per_process(run, devices)
    measured = replay_data_parallel(numels["units"], numels["rest"], int(run.buffer_bytes), devices, threads, work)
    return Replayed(
        measured["ddp_seconds"], measured["fsdp_seconds"], measured["fsdp_optimizer_factor"], measured["how"]
    )


def link_from(gbps: float | None, latency_us: float) -> Link:
    """The link given (``--link-gbps``, ``--link-latency-us``), or measured here by a gloo all-reduce
    benchmark (:mod:`project.toolkit.plan.link`) where no bandwidth is given."""
    if gbps is not None:
        return Link(latency_us * 1e-6, gbps * 1e9 / 8, f"given: {gbps:g} Gbit/s")
    from project.toolkit.plan.link import measure_link

    measured = measure_link()
    return Link(measured["latency_s"], measured["bandwidth_bytes_per_s"], "measured here (gloo all_reduce)", here=True)

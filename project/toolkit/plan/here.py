"""What the plan measures on this machine: its link (gloo all-reduces fitted to a ring), how much its processes
computing at once slow each other (the same convolutions in N processes, one alone, then all at once: shared physical
cores or memory bandwidth show as more than 1), and ddp's and fsdp's cost (:mod:`.replay`). Only the processes it
starts import torch."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from project.toolkit.plan.formulas import unit_seconds
from project.toolkit.plan.inputs import Link, Measured, Replayed, Target
from project.toolkit.plan.predict import _block_times, _device_share, _to_run

ROUNDS = 5  # the fastest round counts: a round is only ever slowed by what else runs
SHAPE = (16, 32, 32, 32)  # a batch of feature maps (N, C, H, W): a small network's middle layers
SIZES = (1024, 256 * 1024, 4 * 1024 * 1024)  # float32 elements: 4 KiB, 1 MiB, 16 MiB
REPEATS = 20  # the fastest counts: a message is only ever slowed by what else runs


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
    """For ``auto`` on a one-node CPU run: how much N processes at once slow each other here, measured
    (:func:`measure_core_sharing`); else 1."""
    if shared_cores != "auto" or run.accelerator != "cpu" or nodes != 1 or devices < 2 or not run.cores:
        return 1.0, ""
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
    """The link given (``--link-gbps``, ``--link-latency-us``), or measured here (:func:`measure_link`)."""
    if gbps is not None:
        return Link(latency_us * 1e-6, gbps * 1e9 / 8, f"given: {gbps:g} Gbit/s")
    measured = measure_link()
    return Link(measured["latency_s"], measured["bandwidth_bytes_per_s"], "measured here (gloo all_reduce)", here=True)


def _convolutions(torch: Any, x: Any, weight: Any) -> None:
    for _ in range(8):
        torch.nn.functional.conv2d(x, weight, padding=1).sum().backward()


def _sharing_worker(rank: int, threads: int, barrier: Any, results: Any) -> None:
    import torch

    torch.set_num_threads(threads)
    x = torch.randn(*SHAPE).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(SHAPE[1], SHAPE[1], 3, 3, requires_grad=True)
    _convolutions(torch, x, weight)  # warm-up
    alone, together = [], []
    for _ in range(ROUNDS):
        barrier.wait()
        if rank == 0:
            start = time.perf_counter()
            _convolutions(torch, x, weight)
            alone.append(time.perf_counter() - start)
        barrier.wait()
        start = time.perf_counter()
        _convolutions(torch, x, weight)
        together.append(time.perf_counter() - start)
    results.put((rank, min(alone) if alone else None, min(together)))


def sharing_factor(alone: float, together: list[float]) -> float:
    """How much slower each process computes with all at once: their mean time together over one's alone, >= 1."""
    return max(1.0, sum(together) / len(together) / alone)


def measure_core_sharing(processes: int, threads: int) -> dict[str, Any]:
    """Run the rounds with ``processes`` processes of ``threads`` threads; the factor and the times."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    mp.start_processes(_sharing_worker, args=(threads, barrier, results), nprocs=processes, start_method="spawn")
    reports = sorted(results.get(timeout=120) for _ in range(processes))
    alone, together = reports[0][1], [report[2] for report in reports]
    return {
        "factor": sharing_factor(alone, together),
        "alone_seconds": alone,
        "together_seconds": together,
        "how": f"{processes} processes of {threads} thread(s): 3x3 convolutions, forward and backward, one alone "
        f"then all at once, the fastest of {ROUNDS} rounds",
    }


def free_port() -> int:
    """A TCP port on this host that no one listens on now (for a short-lived process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _link_worker(rank: int, world: int, port: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        times = {}
        for size in SIZES:
            tensor = torch.ones(size)
            for _ in range(2):
                dist.all_reduce(tensor)
            samples = []
            for _ in range(REPEATS):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(tensor)
                samples.append(time.perf_counter() - start)
            times[size * 4] = min(samples)
        if rank == 0:
            results.put(times)
    finally:
        dist.destroy_process_group()


def fit_ring(times: dict[int, float], world: int) -> tuple[float, float]:
    """``(latency, bandwidth)`` of the ring's cost: bandwidth from the two largest messages, latency the smallest's."""
    sizes = sorted(times)
    small, middle, large = sizes[0], sizes[-2], sizes[-1]
    per_byte = max((times[large] - times[middle]) / (large - middle), 1e-15)
    bandwidth = 2 * (world - 1) / world / per_byte
    latency = max(times[small] - small * per_byte, 0.0) / (2 * (world - 1))
    return latency, bandwidth


def measure_link(world: int = 2) -> dict[str, Any]:
    """All-reduce ``world`` gloo processes on this host; the fitted latency and bandwidth, and the times."""
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").Queue()
    mp.start_processes(_link_worker, args=(world, free_port(), results), nprocs=world, start_method="spawn")
    times = results.get(timeout=60)
    latency, bandwidth = fit_ring(times, world)
    return {
        "latency_s": latency,
        "bandwidth_bytes_per_s": bandwidth,
        "all_reduce_seconds": {str(k): v for k, v in times.items()},
        "how": f"gloo all_reduce between {world} processes on this host, float32 tensors of 4 KiB-16 MiB",
    }

"""The link between this machine's processes (``plan`` without ``--link-gbps``): gloo all-reduces fitted to a ring."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

SIZES = (1024, 256 * 1024, 4 * 1024 * 1024)  # float32 elements: 4 KiB, 1 MiB, 16 MiB
REPEATS = 20  # the fastest counts: a message is only ever slowed by what else runs


def free_port() -> int:
    """A TCP port on this host that no one listens on now (for a short-lived process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, results: Any) -> None:
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
    mp.start_processes(_worker, args=(world, free_port(), results), nprocs=world, start_method="spawn")
    times = results.get(timeout=60)
    latency, bandwidth = fit_ring(times, world)
    return {
        "latency_s": latency,
        "bandwidth_bytes_per_s": bandwidth,
        "all_reduce_seconds": {str(k): v for k, v in times.items()},
        "how": f"gloo all_reduce between {world} processes on this host, float32 tensors of 4 KiB-16 MiB",
    }

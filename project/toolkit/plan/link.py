"""The link between processes on this machine, measured: a short all-reduce benchmark with gloo
(:func:`measure_link`), for ``python -m project plan`` when no ``--link-gbps`` is given.

Two processes all-reduce float32 tensors of a few sizes (4 KiB to 16 MiB) over gloo on this host; the times
are fitted to the ring all-reduce's cost ``2(N-1) x latency + 2(N-1)/N x bytes / bandwidth``, which gives
the latency per message and the bandwidth the plan uses. On one host this is the loopback through memory
and the CPU (gloo reduces on the CPU), not a network: it is what the processes of a CPU run on this machine
have between them, and it takes the cores others leave free while it runs.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

SIZES = (1024, 256 * 1024, 4 * 1024 * 1024)  # float32 elements: 4 KiB, 1 MiB, 16 MiB
# The fastest of many: a message is only ever slowed by what else runs (the median of 5 gave latencies of
# 145 us and 1.6 ms in two runs a minute apart on an idle 2-core machine).
REPEATS = 20


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
    """``(latency seconds, bandwidth bytes/s)`` from all-reduce seconds by message bytes, for the ring's cost
    ``t = 2(N-1) latency + 2(N-1)/N bytes / bandwidth``: the bandwidth from the two largest messages (their
    difference cancels the latency), the latency from the smallest one (what is left of its time).

    >>> latency, bandwidth = fit_ring({1000: 2e-4 + 1000 / 1e9, 10**6: 2e-4 + 10**6 / 1e9, 10**7: 2e-4 + 0.01}, 2)
    >>> round(latency * 1e6), round(bandwidth / 1e9, 3)
    (100, 1.0)
    """
    sizes = sorted(times)
    small, middle, large = sizes[0], sizes[-2], sizes[-1]
    per_byte = max((times[large] - times[middle]) / (large - middle), 1e-15)
    bandwidth = 2 * (world - 1) / world / per_byte
    latency = max(times[small] - small * per_byte, 0.0) / (2 * (world - 1))
    return latency, bandwidth


def measure_link(world: int = 2) -> dict[str, Any]:
    """All-reduce ``world`` gloo processes on this host; the fitted latency and bandwidth, and the times."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    mp.start_processes(_worker, args=(world, free_port(), results), nprocs=world, start_method="spawn")
    times = results.get(timeout=60)
    latency, bandwidth = fit_ring(times, world)
    return {
        "latency_s": latency,
        "bandwidth_bytes_per_s": bandwidth,
        "all_reduce_seconds": {str(k): v for k, v in times.items()},
        "how": f"gloo all_reduce between {world} processes on this host, float32 tensors of 4 KiB-16 MiB",
    }

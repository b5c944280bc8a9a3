"""How much processes computing at once here slow each other (``plan --shared-cores auto``): N processes run the
same convolutions, one alone, then all at once; shared physical cores or memory bandwidth show as more than 1."""

from __future__ import annotations

import time
from typing import Any

ROUNDS = 5  # the fastest round counts: a round is only ever slowed by what else runs
SHAPE = (16, 32, 32, 32)  # a batch of feature maps (N, C, H, W): a small network's middle layers


def _work(torch: Any, x: Any, weight: Any) -> None:
    for _ in range(8):
        torch.nn.functional.conv2d(x, weight, padding=1).sum().backward()


def _worker(rank: int, threads: int, barrier: Any, results: Any) -> None:
    import torch

    torch.set_num_threads(threads)
    x = torch.randn(*SHAPE).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(SHAPE[1], SHAPE[1], 3, 3, requires_grad=True)
    _work(torch, x, weight)  # warm-up
    alone, together = [], []
    for _ in range(ROUNDS):
        barrier.wait()
        if rank == 0:
            start = time.perf_counter()
            _work(torch, x, weight)
            alone.append(time.perf_counter() - start)
        barrier.wait()
        start = time.perf_counter()
        _work(torch, x, weight)
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
    mp.start_processes(_worker, args=(threads, barrier, results), nprocs=processes, start_method="spawn")
    reports = sorted(results.get(timeout=120) for _ in range(processes))
    alone, together = reports[0][1], [report[2] for report in reports]
    return {
        "factor": sharing_factor(alone, together),
        "alone_seconds": alone,
        "together_seconds": together,
        "how": f"{processes} processes of {threads} thread(s): 3x3 convolutions, forward and backward, one alone "
        f"then all at once, the fastest of {ROUNDS} rounds",
    }

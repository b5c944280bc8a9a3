"""How much processes computing at once on this machine slow each other: :func:`measure_core_sharing`, for
``python -m project plan --shared-cores auto`` on a CPU run.

N processes (spawned, with the intra-op threads each would get) run the same convolution forward and
backward passes: in each round first one process alone, then all N at once. The factor is the time all N
take at once over the time one takes alone (the fastest round of each). On a machine whose cores are its
own it is about 1 while the processes' threads fit the cores; where the cores are not what they seem --
virtual CPUs that are two threads of one physical core, memory bandwidth shared with neighbours -- it is
more, and nothing inside the machine says so. (On the 2-core VM of ``benchmarks/results/plan/`` its
readings were 1.02-1.12x.) It takes a few seconds, most of them starting the processes.
"""

from __future__ import annotations

import time
from typing import Any

ROUNDS = 5  # the fastest round counts: a round is only ever slowed by what else runs
SHAPE = (16, 32, 32, 32)  # a batch of feature maps (N, C, H, W): a small network's middle layers


def _work(torch: Any, x: Any, weight: Any) -> None:
    for _ in range(8):
        y = torch.nn.functional.conv2d(x, weight, padding=1)
        y.sum().backward()


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
    """How much slower each process computes with all of them at once: the mean of their times together
    over the time alone, never below 1.

    >>> sharing_factor(1.0, [2.0, 1.8]), sharing_factor(1.0, [0.9, 0.95])
    (1.9, 1.0)
    """
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

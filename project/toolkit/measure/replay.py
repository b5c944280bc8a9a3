"""What ddp and fsdp themselves cost a training step on this host, replayed: :func:`replay_data_parallel`,
for ``python -m project plan`` on a CPU run (one node, the link measured here).

On a CPU, the data-parallel strategies cost far more than their bytes over the all-reduce's bandwidth: gloo
copies and sums on the cores that compute, DDP copies the gradients into its buckets and back, and FSDP2
copies each unit's shards into one buffer before every gather and the result out tensor by tensor after it,
copies the gradients into one buffer before reducing them (gloo's reduce-scatter is slower than its
all-reduce of the same bytes), and steps its optimizer on sharded tensors, each with a cost of its own. On
the 2-core machine of ``benchmarks/results/plan/`` the formulas gave a quarter or less of fsdp's cost, and a
third of ddp's for the small MobileNetV2. So the plan replays them: N processes (spawned, with the intra-op threads
each would get) build a chain of units holding parameter tensors of the run's network's sizes
(``network.parameter_numels`` in its ``timing.json``) and doing next to no arithmetic, and time its forward
and backward plain, wrapped in ``DistributedDataParallel`` and sharded by ``fully_shard`` as the ``fsdp``
strategy shards (one unit per block with parameters, then the root), and an optimizer step (SGD with
momentum, standing in for the run's: what a sharded step adds is per tensor, not arithmetic) plain and on
the shards. A few seconds for ResNet50, most of them starting the processes.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from project.toolkit.measure.link import free_port

STEPS = 12  # timed steps of each kind, after 2 untimed ones
# The mean, not the fastest nor the median: a step is dozens of collectives and copies, each slowed now and then
# by what else runs, as they are in the run's steps, and the step the plan predicts is a mean too (the step
# anatomy's window: its wall time over its steps).


def _chain(torch: Any, units: list[list[int]], rest: list[int], buffer_bytes: int) -> Any:
    """A network of ``units`` (each a module holding zero-filled parameter tensors of the given sizes) run
    one after another, plus parameters of ``rest``'s sizes and one buffer of ``buffer_bytes`` bytes (what
    ddp broadcasts before every forward) on the root; its forward adds each tensor's sum to a one-element
    input, so that every parameter gets a gradient for next to no arithmetic."""
    from torch import nn

    class Unit(nn.Module):
        def __init__(self, numels: list[int]) -> None:
            super().__init__()
            self.tensors = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in numels)

        def forward(self, x: Any) -> Any:
            for tensor in self.tensors:
                x = x + tensor.sum()
            return x

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.units = nn.ModuleList(Unit(numels) for numels in units if numels)
            self.rest = Unit(rest)
            self.register_buffer("state", torch.zeros(buffer_bytes, dtype=torch.uint8))

        def forward(self, x: Any) -> Any:
            for unit in self.units:
                x = unit(x)
            return self.rest(x)

    return Chain()


def _mean_seconds(work: Callable[[], Any]) -> float:
    import torch.distributed as dist

    samples = []
    for step in range(STEPS + 2):
        dist.barrier()
        start = time.perf_counter()
        work()
        if step >= 2:
            samples.append(time.perf_counter() - start)
    return statistics.fmean(samples)


def _step_seconds(torch: Any, net: Any) -> tuple[float, float]:
    """The mean forward and backward, and the mean optimizer step, of ``net``."""
    x = torch.ones(1)
    passes = _mean_seconds(lambda: net(x).sum().backward())
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    return passes, _mean_seconds(optimizer.step)


def _worker(
    rank: int, world: int, threads: int, port: int, tensors: tuple[list[list[int]], list[int], int], results: Any
) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        plain = _step_seconds(torch, _chain(torch, *tensors))
        ddp = _step_seconds(torch, torch.nn.parallel.DistributedDataParallel(_chain(torch, *tensors)))
        net, mesh = _chain(torch, *tensors), init_device_mesh("cpu", (world,))
        for unit in net.units:
            fully_shard(unit, mesh=mesh)
        fully_shard(net, mesh=mesh)
        results.put((rank, plain, ddp, _step_seconds(torch, net)))
    finally:
        dist.destroy_process_group()


def replay_data_parallel(
    units: list[list[int]], rest: list[int], buffer_bytes: int, world: int, threads: int = 1
) -> dict[str, Any]:
    """ddp's and fsdp's own cost per training step for parameter tensors of these sizes (``units``: per unit;
    ``rest``: the root's) and buffers of ``buffer_bytes`` on ``world`` gloo processes of ``threads`` threads
    here, the slowest rank's:
    ``ddp_seconds`` and ``fsdp_seconds`` (their forward and backward less the plain one) and
    ``fsdp_optimizer_factor`` (an optimizer step on the shards over one on the whole tensors); ``steps``:
    each rank's mean ``[forward and backward, optimizer]`` seconds plain, under ddp and under fsdp."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    args = (world, threads, free_port(), (units, rest, buffer_bytes), results)
    mp.start_processes(_worker, args=args, nprocs=world, start_method="spawn")
    reports = sorted(results.get(timeout=120) for _ in range(world))
    steps = [{"plain": plain, "ddp": ddp, "fsdp": fsdp} for _, plain, ddp, fsdp in reports]
    tensors = sum(map(len, units)) + len(rest)
    return {
        "ddp_seconds": max(0.0, *(s["ddp"][0] - s["plain"][0] for s in steps)),
        "fsdp_seconds": max(0.0, *(s["fsdp"][0] - s["plain"][0] for s in steps)),
        "fsdp_optimizer_factor": max(s["fsdp"][1] / max(s["plain"][1], 1e-9) for s in steps),
        "steps": steps,
        "how": f"replayed over gloo by {world} processes of {threads} thread(s): {tensors} parameter tensors of "
        f"the run's sizes in {sum(1 for u in units if u)} unit(s) + root and {buffer_bytes} bytes of buffers, "
        f"the mean of {STEPS} steps",
    }

"""What ddp and fsdp themselves cost a training step on this host, replayed: :func:`replay_data_parallel`,
for ``python -m project plan`` on a CPU run (one node, the link measured here).

On a CPU, the data-parallel strategies cost far more than their bytes over the all-reduce's bandwidth: gloo
copies and sums on the cores that compute, DDP copies the gradients into its buckets and back, and FSDP2
copies each unit's shards into one buffer before every gather and the result out tensor by tensor after it,
copies the gradients into one buffer before reducing them (gloo's reduce-scatter is slower than its
all-reduce of the same bytes), and steps its optimizer on sharded tensors, each with a cost of its own; all
of it on the cores the compute runs on, which it slows. On the 2-core machine of
``benchmarks/results/plan/`` the formulas gave a quarter or less of fsdp's cost, and a third of ddp's for
the small MobileNetV2.

So the plan replays them. N processes (spawned, with the intra-op threads each would get) build a chain of
units holding parameter tensors of the run's network's sizes (``network.parameter_numels`` in its
``timing.json``); where the run timed its blocks, each unit also stands in for its compute: it rewrites a
scratch tensor of its activations' size as many times as take the block's measured forward (and backward)
time on its share of the batch, so the cores and the memory are about as busy as the real step keeps them,
and the same work takes longer where gloo or the copies run beside it. The processes time the chain's forward
and backward plain, wrapped in ``DistributedDataParallel`` and sharded by ``fully_shard`` as the ``fsdp``
strategy shards (one unit per block with parameters, then the root), and an optimizer step (SGD with
momentum, standing in for the run's: what a sharded step adds is per tensor, not arithmetic) plain and on
the shards. A strategy's cost is its step less the plain one. A few seconds for ResNet50, most of them
starting the processes.
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
SCRATCH_CAP_BYTES = 64 * 2**20  # one scratch tensor per process, shared by the units: never more than this


def _stand_in(torch: Any) -> Any:
    """An autograd function that stands in for a unit's compute: its forward and its backward each rewrite
    a scratch tensor a set number of times."""

    class StandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, scratch: Any, forward: int, backward: int) -> Any:
            ctx.scratch, ctx.backward = scratch, backward
            for _ in range(forward):
                scratch.mul_(1.0)
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            for _ in range(ctx.backward):
                ctx.scratch.mul_(1.0)
            return grad, None, None, None

    return StandIn


def _rewrite_seconds(scratch: Any) -> float:
    """Seconds one rewrite of ``scratch`` takes here (the fastest of 5, after one)."""
    samples = []
    for _ in range(6):
        start = time.perf_counter()
        scratch.mul_(1.0)
        samples.append(time.perf_counter() - start)
    return min(samples[1:])


def _chain(torch: Any, units: list[list[int]], rest: list[int], buffer_bytes: int, work: list[list[float]]) -> Any:
    """A network of ``units`` (each a module holding zero-filled parameter tensors of the given sizes) run
    one after another, plus parameters of ``rest``'s sizes and one buffer of ``buffer_bytes`` bytes (what
    ddp broadcasts before every forward) on the root. Its forward adds each tensor's sum to a one-element
    input, so that every parameter gets a gradient for next to no arithmetic, and where ``work`` has a unit's
    ``[forward seconds, backward seconds, activation bytes]``, stands in for that unit's compute."""
    from torch import nn

    stand_in = _stand_in(torch)
    largest = max([int(w[2]) for w in work] or [4])
    scratch = torch.zeros(max(1, min(largest, SCRATCH_CAP_BYTES) // 4))  # not a buffer: ddp would broadcast it

    class Unit(nn.Module):
        def __init__(self, numels: list[int], forward: float = 0.0, backward: float = 0.0, nbytes: float = 4) -> None:
            super().__init__()
            self.tensors = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in numels)
            self.scratch = scratch[: max(1, min(int(nbytes), SCRATCH_CAP_BYTES) // 4)]
            once = _rewrite_seconds(self.scratch) if forward or backward else 1.0
            self.rewrites = (round(forward / once), round(backward / once))

        def forward(self, x: Any) -> Any:
            for tensor in self.tensors:
                x = x + tensor.sum()
            return stand_in.apply(x, self.scratch, *self.rewrites) if any(self.rewrites) else x

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.units = nn.ModuleList(Unit(numels, *(work[i] if work else ())) for i, numels in enumerate(units))
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


def _worker(rank: int, world: int, threads: int, port: int, chain: tuple[Any, ...], results: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        plain = _step_seconds(torch, _chain(torch, *chain))
        ddp = _step_seconds(torch, torch.nn.parallel.DistributedDataParallel(_chain(torch, *chain)))
        net, mesh = _chain(torch, *chain), init_device_mesh("cpu", (world,))
        for unit in net.units:
            if len(unit.tensors):  # as the strategy shards: the blocks that hold parameters, then the root
                fully_shard(unit, mesh=mesh)
        fully_shard(net, mesh=mesh)
        results.put((rank, plain, ddp, _step_seconds(torch, net)))
    finally:
        dist.destroy_process_group()


def replay_data_parallel(
    units: list[list[int]],
    rest: list[int],
    buffer_bytes: int,
    world: int,
    threads: int = 1,
    work: list[list[float]] | None = None,
) -> dict[str, Any]:
    """ddp's and fsdp's own cost per training step on ``world`` gloo processes of ``threads`` threads here,
    for parameter tensors of these sizes (``units``: per unit; ``rest``: the root's), buffers of
    ``buffer_bytes`` and, where given, each unit's compute stood in for (``work``: per unit ``[forward
    seconds, backward seconds, activation bytes]``). The slowest rank's ``ddp_seconds`` and ``fsdp_seconds``
    (their forward and backward less the plain one) and ``fsdp_optimizer_factor`` (an optimizer step on the
    shards over one on the whole tensors); ``steps``: each rank's mean ``[forward and backward, optimizer]``
    seconds plain, under ddp and under fsdp."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    args = (world, threads, free_port(), (units, rest, buffer_bytes, work or []), results)
    mp.start_processes(_worker, args=args, nprocs=world, start_method="spawn")
    reports = sorted(results.get(timeout=120) for _ in range(world))
    steps = [{"plain": plain, "ddp": ddp, "fsdp": fsdp} for _, plain, ddp, fsdp in reports]
    tensors = sum(map(len, units)) + len(rest)
    compute = f", {sum(w[0] + w[1] for w in work):.3f} s of compute stood in for" if work else ", no compute"
    return {
        "ddp_seconds": max(0.0, *(s["ddp"][0] - s["plain"][0] for s in steps)),
        "fsdp_seconds": max(0.0, *(s["fsdp"][0] - s["plain"][0] for s in steps)),
        "fsdp_optimizer_factor": max(s["fsdp"][1] / max(s["plain"][1], 1e-9) for s in steps),
        "steps": steps,
        "how": f"replayed over gloo by {world} processes of {threads} thread(s): {tensors} parameter tensors of "
        f"the run's sizes in {sum(1 for u in units if u)} unit(s) + root, {buffer_bytes} bytes of buffers{compute}; "
        f"the mean of {STEPS} steps",
    }

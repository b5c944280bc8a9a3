"""What ddp and fsdp cost a CPU run's step here (far more than their bytes over the link), replayed for ``plan``: N
processes time a chain of units of the run's parameter sizes and compute, plain, under DDP and under ``fully_shard``."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from project.toolkit.plan.link import free_port

STEPS = 12  # timed steps of each kind, after 2 untimed ones
SCRATCH_CAP_BYTES = 64 * 2**20  # the one scratch tensor per process that the units share: never more than this
StandIn = tuple[torch.Tensor | None, tuple[int, int]]  # a unit's scratch tensor and its rewrite counts
Tensors = tuple[list[list[int]], list[int], int]  # each unit's parameter sizes, the root's, the buffers' bytes


class UnitWork(NamedTuple):
    """One unit's compute to stand in for: seconds of forward and of backward, and the bytes it writes."""

    forward: float
    backward: float
    nbytes: float


class _StandIn(torch.autograd.Function):
    """A unit's compute stood in for: its forward and backward each rewrite a scratch tensor a set number of times."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scratch: torch.Tensor, forward: int, backward: int) -> torch.Tensor:
        ctx.scratch, ctx.backward = scratch, backward
        for _ in range(forward):
            scratch.mul_(1.0)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        for _ in range(ctx.backward):
            ctx.scratch.mul_(1.0)
        return grad, None, None, None


def rewrites(work: UnitWork, rewrite_seconds: float) -> tuple[int, int]:
    """How many rewrites of a scratch tensor, each taking ``rewrite_seconds``, stand in for ``work``'s passes."""
    return round(work.forward / rewrite_seconds), round(work.backward / rewrite_seconds)


def _rewrite_seconds(scratch: torch.Tensor) -> float:
    samples = []
    for _ in range(6):  # the fastest of 5, after one
        start = time.perf_counter()
        scratch.mul_(1.0)
        samples.append(time.perf_counter() - start)
    return min(samples[1:])


def _scratches(work: list[UnitWork]) -> list[torch.Tensor]:
    # each unit's scratch tensor of its output's size (at most SCRATCH_CAP_BYTES): views of one
    elements = [max(1, min(int(w.nbytes), SCRATCH_CAP_BYTES) // 4) for w in work]
    scratch = torch.zeros(max(elements))
    return [scratch[:n] for n in elements]


def _calibrate(work: list[UnitWork], scratches: list[torch.Tensor], rank: int, world: int) -> list[tuple[int, int]]:
    """Each unit's rewrite counts, the processes calibrating one at a time (alone, as the run's blocks were timed)."""
    counts: list[tuple[int, int]] = []
    for turn in range(world):
        dist.barrier()
        if turn == rank:
            counts = [rewrites(w, _rewrite_seconds(scratch)) for w, scratch in zip(work, scratches, strict=True)]
    dist.barrier()
    return counts


class _Unit(nn.Module):
    def __init__(self, numels: list[int], scratch: torch.Tensor | None, counts: tuple[int, int]) -> None:
        super().__init__()
        self.tensors = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in numels)
        self.scratch, self.counts = scratch, counts  # the scratch is no buffer: ddp would broadcast it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for tensor in self.tensors:
            x = x + tensor.sum()
        return _StandIn.apply(x, self.scratch, *self.counts) if any(self.counts) else x


class _Chain(nn.Module):
    """``units`` of zero-filled parameter tensors, then a root with ``rest``'s and a buffer of ``buffer_bytes``; each
    tensor's sum is added to the one-element input, so every parameter gets a gradient for next to no arithmetic."""

    def __init__(self, units: list[list[int]], rest: list[int], buffer_bytes: int, stand_ins: list[StandIn]) -> None:
        super().__init__()
        self.units = nn.ModuleList(_Unit(n, *s) for n, s in zip(units, stand_ins, strict=True))
        self.rest = _Unit(rest, None, (0, 0))
        self.register_buffer("state", torch.zeros(buffer_bytes, dtype=torch.uint8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units:
            x = unit(x)
        return self.rest(x)


def _mean_seconds(step: Callable[[], Any]) -> float:
    """The mean seconds of ``STEPS`` runs of ``step`` (a mean, as the plan's step is), all starting together."""
    samples = []
    for i in range(STEPS + 2):
        dist.barrier()
        start = time.perf_counter()
        step()
        if i >= 2:
            samples.append(time.perf_counter() - start)
    return statistics.fmean(samples)


def _step_seconds(net: nn.Module) -> tuple[float, float]:
    x = torch.ones(1, requires_grad=True)  # so that a first unit without parameters runs its backward too
    passes = _mean_seconds(lambda: net(x).sum().backward())
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    return passes, _mean_seconds(optimizer.step)


def _worker(
    rank: int, world: int, threads: int, port: int, tensors: Tensors, work: list[UnitWork], results: Any
) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        stand_ins: list[StandIn] = [(None, (0, 0))] * len(tensors[0])
        if work:
            scratches = _scratches(work)
            counts = _calibrate(work, scratches, rank, world)  # once: the three chains do the same work
            stand_ins = list(zip(scratches, counts, strict=True))

        plain = _step_seconds(_Chain(*tensors, stand_ins))
        ddp = _step_seconds(torch.nn.parallel.DistributedDataParallel(_Chain(*tensors, stand_ins)))
        net, mesh = _Chain(*tensors, stand_ins), init_device_mesh("cpu", (world,))
        for unit in net.units:
            if len(unit.tensors):  # as the strategy shards: the blocks that hold parameters, then the root
                fully_shard(unit, mesh=mesh)
        fully_shard(net, mesh=mesh)
        results.put((rank, plain, ddp, _step_seconds(net)))
    finally:
        dist.destroy_process_group()


def replay_data_parallel(
    units: list[list[int]],
    rest: list[int],
    buffer_bytes: int,
    world: int,
    threads: int = 1,
    work: list[UnitWork] | None = None,
) -> dict[str, Any]:
    """ddp's and fsdp's own cost per step on ``world`` gloo processes of ``threads`` threads, for these parameter
    sizes and, where given, each unit's compute (``work``): the slowest rank's seconds, and each rank's ``steps``."""
    import torch.multiprocessing as mp

    if work is not None and len(work) != len(units):
        raise ValueError(f"replay: {len(work)} units of work for {len(units)} units of parameters")
    results = mp.get_context("spawn").Queue()
    args = (world, threads, free_port(), (units, rest, buffer_bytes), work or [], results)
    mp.start_processes(_worker, args=args, nprocs=world, start_method="spawn")
    reports = sorted(results.get(timeout=300) for _ in range(world))
    steps = [{"plain": plain, "ddp": ddp, "fsdp": fsdp} for _, plain, ddp, fsdp in reports]
    tensors = sum(map(len, units)) + len(rest)
    compute = f", {sum(w.forward + w.backward for w in work):.3f} s of compute stood in for" if work else ", no compute"
    return {
        "ddp_seconds": max(0.0, *(s["ddp"][0] - s["plain"][0] for s in steps)),
        "fsdp_seconds": max(0.0, *(s["fsdp"][0] - s["plain"][0] for s in steps)),
        "fsdp_optimizer_factor": max(s["fsdp"][1] / max(s["plain"][1], 1e-9) for s in steps),
        "steps": steps,
        "how": f"replayed over gloo by {world} processes of {threads} thread(s): {tensors} parameter tensors of "
        f"the run's sizes in {sum(1 for u in units if u)} unit(s) + root, {buffer_bytes} bytes of buffers{compute}; "
        f"the mean of {STEPS} steps",
    }

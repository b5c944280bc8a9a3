"""What ddp and fsdp themselves cost a training step on this host, replayed: :func:`replay_data_parallel`,
for ``python -m project plan`` on a CPU run (one node, the link measured here).

On a CPU the data-parallel strategies cost far more than their bytes over the all-reduce's bandwidth: gloo
copies and sums on the cores that compute, DDP copies the gradients into its buckets and back, and FSDP2
copies each unit's shards into one buffer before every gather and the result out tensor by tensor after it,
copies the gradients into one buffer before reducing them, and steps its optimizer on sharded tensors, each
with a cost of its own; all of it on the cores the compute runs on, which it slows. (The plan of commit
a7450ed, which priced the collectives by the ring formulas, gave a sixth or less of fsdp's measured
communication on the 2-core machine of ``benchmarks/results/plan/``.)

So the plan replays them. N processes (spawned, with the intra-op threads each would get) build a chain of
units holding parameter tensors of the run's network's sizes (``network.parameter_numels`` in its
``timing.json``) and its buffers' bytes. Where the run timed its blocks, each unit also stands in for its
compute (:class:`UnitWork`): it rewrites a scratch tensor of its output's size as many times as take its
compute, counted once with each process calibrating alone, so the same work takes longer where gloo or the
copies run beside it. The processes time the chain's forward and backward plain, wrapped in
``DistributedDataParallel`` and sharded by ``fully_shard`` as the ``fsdp`` strategy shards (one unit per
block with parameters, then the root), and an optimizer step (SGD with momentum) plain and on the shards. A
strategy's cost is its step less the plain one. It takes about 3 x 14 steps of the chain (each about the
run's compute on a rank's share) plus starting the processes.
"""

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


class UnitWork(NamedTuple):
    """One unit's compute to stand in for: seconds of forward and of backward, and the bytes it writes."""

    forward: float
    backward: float
    nbytes: float


class _StandIn(torch.autograd.Function):
    """A unit's compute stood in for: its forward and its backward each rewrite a scratch tensor a set
    number of times."""

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
    """How many rewrites of a scratch tensor stand in for ``work``'s forward and backward, one rewrite taking
    ``rewrite_seconds``.

    >>> rewrites(UnitWork(0.01, 0.02, 4096), 0.004)
    (2, 5)
    """
    return round(work.forward / rewrite_seconds), round(work.backward / rewrite_seconds)


def _rewrite_seconds(scratch: torch.Tensor) -> float:
    """Seconds one rewrite of ``scratch`` takes here (the fastest of 5, after one)."""
    samples = []
    for _ in range(6):
        start = time.perf_counter()
        scratch.mul_(1.0)
        samples.append(time.perf_counter() - start)
    return min(samples[1:])


def _scratches(work: list[UnitWork]) -> list[torch.Tensor]:
    """Each unit's scratch tensor of its output's size (at most ``SCRATCH_CAP_BYTES``): views of one."""
    elements = [max(1, min(int(w.nbytes), SCRATCH_CAP_BYTES) // 4) for w in work]
    scratch = torch.zeros(max(elements))
    return [scratch[:n] for n in elements]


def _calibrate(work: list[UnitWork], scratches: list[torch.Tensor], rank: int, world: int) -> list[tuple[int, int]]:
    """Each unit's rewrite counts, the processes calibrating one at a time (each alone, as the run's blocks
    were timed), the others waiting."""
    counts: list[tuple[int, int]] = []
    for turn in range(world):
        dist.barrier()
        if turn == rank:
            counts = [rewrites(w, _rewrite_seconds(scratch)) for w, scratch in zip(work, scratches, strict=True)]
    dist.barrier()
    return counts


class _Unit(nn.Module):
    def __init__(
        self, numels: list[int], scratch: torch.Tensor | None = None, counts: tuple[int, int] = (0, 0)
    ) -> None:
        super().__init__()
        self.tensors = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in numels)
        self.scratch, self.counts = scratch, counts  # the scratch is no buffer: ddp would broadcast it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for tensor in self.tensors:
            x = x + tensor.sum()
        return _StandIn.apply(x, self.scratch, *self.counts) if any(self.counts) else x


class _Chain(nn.Module):
    """``units`` run one after another (each holding zero-filled parameter tensors of the given sizes and,
    where ``stand_ins`` has its scratch tensor and rewrite counts, standing in for its compute), then a root
    holding ``rest``'s tensors and one buffer of ``buffer_bytes`` (what ddp broadcasts before every forward).
    The forward adds each tensor's sum to its one-element input, so that every parameter gets a gradient
    for next to no arithmetic."""

    def __init__(
        self,
        units: list[list[int]],
        rest: list[int],
        buffer_bytes: int,
        stand_ins: list[tuple[torch.Tensor, tuple[int, int]]],
    ) -> None:
        super().__init__()
        self.units = nn.ModuleList(
            _Unit(numels, *stand_ins[i]) if stand_ins else _Unit(numels) for i, numels in enumerate(units)
        )
        self.rest = _Unit(rest)
        self.register_buffer("state", torch.zeros(buffer_bytes, dtype=torch.uint8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units:
            x = unit(x)
        return self.rest(x)


def _mean_seconds(step: Callable[[], Any]) -> float:
    """The mean seconds of ``STEPS`` runs of ``step``, all processes starting each together. The mean, not
    the fastest nor the median: a step is dozens of collectives and copies, each slowed now and then by
    what else runs, as they are in the run's steps, and the step the plan predicts is a mean too (the step
    anatomy's window: its wall time over its steps)."""
    samples = []
    for i in range(STEPS + 2):
        dist.barrier()
        start = time.perf_counter()
        step()
        if i >= 2:
            samples.append(time.perf_counter() - start)
    return statistics.fmean(samples)


def _step_seconds(net: nn.Module) -> tuple[float, float]:
    """The mean forward and backward, and the mean optimizer step, of ``net``."""
    x = torch.ones(1, requires_grad=True)  # so that a first unit without parameters runs its backward too
    passes = _mean_seconds(lambda: net(x).sum().backward())
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    return passes, _mean_seconds(optimizer.step)


def _worker(
    rank: int,
    world: int,
    threads: int,
    port: int,
    tensors: tuple[list[list[int]], list[int], int],
    work: list[UnitWork],
    results: Any,
) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        stand_ins = []
        if work:
            scratches = _scratches(work)
            counts = _calibrate(work, scratches, rank, world)  # once: the three chains do the same work
            stand_ins = list(zip(scratches, counts, strict=True))

        def chain() -> _Chain:
            return _Chain(*tensors, stand_ins)

        plain = _step_seconds(chain())
        ddp = _step_seconds(torch.nn.parallel.DistributedDataParallel(chain()))
        net, mesh = chain(), init_device_mesh("cpu", (world,))
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
    """ddp's and fsdp's own cost per training step on ``world`` gloo processes of ``threads`` threads here,
    for parameter tensors of these sizes (``units``: per unit; ``rest``: the root's), buffers of
    ``buffer_bytes`` and, where given, each unit's compute stood in for (``work``, one per unit). The slowest
    rank's ``ddp_seconds`` and ``fsdp_seconds`` (their forward and backward less the plain one) and
    ``fsdp_optimizer_factor`` (an optimizer step on the shards over one on the whole tensors: on a CPU a step
    over a network's many small tensors is mostly each operation's dispatch, which sharded tensors make
    dearer, so an optimizer of more operations per tensor pays in proportion); ``steps``: each rank's mean
    ``[forward and backward, optimizer]`` seconds plain, under ddp and under fsdp."""
    import torch.multiprocessing as mp

    if work is not None and len(work) != len(units):
        raise ValueError(f"replay: {len(work)} units of work for {len(units)} units of parameters")
    context = mp.get_context("spawn")
    results = context.Queue()
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

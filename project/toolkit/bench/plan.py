"""``python -m project plan RUN_DIR --devices N [--nodes M] [--link-gbps B]``: what a measured run would do
on devices you do not have.

From one finished run's ``timing.json`` -- its step anatomy (:mod:`project.toolkit.measure.anatomy`: data
wait, forward, backward, optimizer, rest per step), the network's parameter, buffer and activation bytes
and its units (:mod:`project.toolkit.measure.network`), its peak memory -- and a link (given, or measured
here by a short gloo all-reduce benchmark, :mod:`project.toolkit.measure.link`), it predicts for single,
dp, ddp, fsdp and pipeline on ``N`` devices per node and ``M`` nodes: the step time and its parts, the
throughput, the scaling efficiency and the peak memory per device. The formulas, and what they leave out,
are in ``docs/plan.md``; each is a function here, tested on known inputs (``tests/test_plan.py``). For a CPU
run on this machine's processes, ddp's and fsdp's cost is replayed instead of priced by the formulas
(:mod:`project.toolkit.measure.replay`).

Reading a ``timing.json`` and computing needs no torch; only what is measured here imports it: the link,
how processes computing at once slow each other (:mod:`project.toolkit.measure.cores`) and the replay.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from project.toolkit.balance import balanced_starts
from project.toolkit.commands import OneLineParser
from project.toolkit.errors import ProjectError, exit_on_project_error
from project.toolkit.measure.tables import number, text_table

PLAN_HELP = "Predict step time, throughput, scaling and memory per device of each strategy on N devices from one run."
STRATEGIES = ("single", "dp", "ddp", "fsdp", "pipeline")
MIB = 2**20
DDP_FIRST_BUCKET = 1 * MIB  # torch's DistributedDataParallel: the first bucket (the last layers) is small
DDP_BUCKET = 25 * MIB  # bucket_cap_mb's default


# --------------------------------------------------------------------------- inputs


@dataclass
class Measured:
    """What the plan takes from one run (seconds per step of rank 0, bytes of the whole network)."""

    accelerator: str
    world_size: int
    batch_size: int
    data_wait: float
    forward: float
    backward: float
    optimizer: float
    rest: float
    parameter_bytes: float
    buffer_bytes: float
    activation_bytes_per_sample: float
    optimizer_state_bytes: float
    peak_memory_mb: float | None
    image_bytes_per_sample: float = 0.0
    units: list[list[Any]] = field(default_factory=list)  # [name, forward FLOPs, parameters, output bytes]
    block_seconds: dict[str, Any] | None = None  # the units timed after the fit (measure/block_times.py)
    name: str = ""
    threads: int | None = None  # the run's intra-op threads
    cores: int | None = None  # the machine's cores (a CPU run)
    parameter_numels: dict[str, Any] | None = None  # per unit and the rest: parameter tensors' sizes

    @property
    def step(self) -> float:
        return self.data_wait + self.forward + self.backward + self.optimizer + self.rest

    @property
    def samples_per_second(self) -> float:
        return self.batch_size / self.step


@dataclass
class Link:
    """The slowest link of the ring: seconds per message and bytes per second; ``here``: measured between
    this machine's processes (a given or assumed link is another machine's)."""

    latency: float
    bandwidth: float
    source: str
    here: bool = False


@dataclass
class Replayed:
    """ddp's and fsdp's own cost per step on the target's processes, replayed with the run's parameter
    tensors (:mod:`project.toolkit.measure.replay`): seconds beside a plain forward and backward, and how
    many times an optimizer step on fsdp's shards takes one on the whole tensors."""

    ddp_seconds: float
    fsdp_seconds: float
    fsdp_optimizer_factor: float
    how: str


@dataclass
class Target:
    """Where the plan puts the run: ``devices`` per node, ``nodes``; ``batch`` is ``global`` (the run's
    global batch split across the devices: the template's convention) or ``per-device`` (each device
    keeps the run's batch: NVIDIA's tables); ``slowdown``: how much slower each device runs the run's
    multi-threaded work (compute, optimizer) than the run did -- 1 for devices of their own; on a CPU, the
    processes' threads over the cores the run's threads had (N processes sharing the cores the run used: N)."""

    devices: int
    nodes: int = 1
    batch: str = "global"
    micro_batches: int = 4
    slowdown: float = 1.0

    @property
    def shared_cores(self) -> bool:
        return self.slowdown > 1

    @property
    def world(self) -> int:
        return self.devices * self.nodes


def read_run(path: Path) -> Measured:
    """The :class:`Measured` of a run folder (or a ``timing.json``); a :class:`ProjectError` naming what is
    missing otherwise."""
    file = path / "timing.json" if path.is_dir() else path
    try:
        timing = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ProjectError(
            f"plan: {file} is not a readable timing.json ({err}); give the run folder of a fit"
        ) from None
    anatomy, network = timing.get("step_anatomy"), timing.get("network")
    if not isinstance(anatomy, dict) or not anatomy.get("ranks") or not isinstance(network, dict):
        raise ProjectError(
            f"plan: {file} has no step_anatomy or network (a fit with --timing.anatomy_steps=0, or an older "
            "template's); run the fit again with this template (anatomy_steps > 0, at least 2 batches per epoch)"
        )
    rank = anatomy["ranks"][0]
    compute = rank.get("compute") or 0.0
    forward = rank.get("forward")
    backward = rank.get("backward")
    if forward is None or backward is None:  # a pipeline's schedule: split as the FLOPs are (backward ~ 2x)
        forward, backward = compute / 3, 2 * compute / 3
    peaks = timing.get("peak_memory_mb") or [None]
    return Measured(
        accelerator=str(timing.get("accelerator")),
        world_size=int(timing.get("world_size") or 1),
        batch_size=int(timing["batch_size"]),
        data_wait=rank.get("data_wait") or 0.0,
        forward=forward,
        backward=backward,
        optimizer=rank.get("optimizer") or 0.0,
        rest=(rank.get("rest") or 0.0) + (rank.get("communication") or 0.0) + (rank.get("bubble") or 0.0),
        parameter_bytes=network["parameter_bytes"],
        buffer_bytes=network.get("buffer_bytes", 0),
        activation_bytes_per_sample=network.get("activation_bytes_per_sample", 0),
        optimizer_state_bytes=network.get("optimizer_state_bytes", 0),
        peak_memory_mb=peaks[0],
        image_bytes_per_sample=network.get("input_bytes_per_sample", 3 * int(timing.get("image_size") or 0) ** 2 * 4),
        units=network.get("units", []),
        block_seconds=network.get("block_seconds"),
        name=str(file),
        threads=anatomy.get("threads"),
        cores=(timing.get("environment") or {}).get("cpu_cores"),
        parameter_numels=network.get("parameter_numels"),
    )


# --------------------------------------------------------------------------- formulas


def ring_all_reduce_seconds(nbytes: float, world: int, link: Link) -> float:
    """Ring all-reduce: ``2(N-1)`` steps, each a latency and ``bytes / N`` over the link.

    >>> ring_all_reduce_seconds(100e6, 4, Link(0.0, 1e9, "given"))
    0.15
    """
    if world < 2:
        return 0.0
    return 2 * (world - 1) * link.latency + 2 * (world - 1) / world * nbytes / link.bandwidth


def all_gather_seconds(nbytes: float, world: int, link: Link) -> float:
    """Ring all-gather (or reduce-scatter) of ``nbytes`` in all: ``N-1`` steps of ``bytes / N``.

    >>> all_gather_seconds(100e6, 4, Link(0.0, 1e9, "given"))
    0.075
    """
    if world < 2:
        return 0.0
    return (world - 1) * link.latency + (world - 1) / world * nbytes / link.bandwidth


def broadcast_seconds(nbytes: float, world: int, link: Link) -> float:
    """A pipelined broadcast: the bytes once over the link, a latency per tree level.

    >>> broadcast_seconds(1e6, 8, Link(1e-5, 1e9, "given"))
    0.00103
    """
    if world < 2:
        return 0.0
    return math.ceil(math.log2(world)) * link.latency + nbytes / link.bandwidth


def gpipe_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of a step with balanced stages: ``(p-1)/(m+p-1)``.

    >>> gpipe_bubble(2, 4), gpipe_bubble(4, 16)
    (0.2, 0.15789473684210525)
    """
    return (stages - 1) / (micro_batches + stages - 1)


def ddp_buckets(parameter_bytes: float, first: float = DDP_FIRST_BUCKET, cap: float = DDP_BUCKET) -> list[float]:
    """DDP's gradient buckets in the order the backward fills them: a small first one, then ``cap`` each.

    >>> [b / MIB for b in ddp_buckets(60 * MIB)]
    [1.0, 25.0, 25.0, 9.0]
    """
    buckets, left = [], parameter_bytes
    for size in [first, *[cap] * math.ceil(parameter_bytes / cap)]:
        if left <= 0:
            break
        buckets.append(min(size, left))
        left -= size
    return buckets


def ddp_exposed_seconds(buckets: list[float], backward: float, world: int, link: Link) -> float:
    """The all-reduce time left after the backward: each bucket is ready once the backward has produced its
    share of the gradients (gradients come at an even rate per byte), the all-reduces run one after another,
    and what runs past the backward's end is exposed.

    >>> link = Link(0.0, 1e9, "given")
    >>> round(ddp_exposed_seconds([50e6, 50e6], backward=0.1, world=2, link=link), 6)  # 0.05 s each, from 0.05 s
    0.05
    >>> round(ddp_exposed_seconds([50e6, 50e6], backward=1.0, world=2, link=link), 6)  # the last one shows
    0.05
    """
    total, ready, finish = sum(buckets), 0.0, 0.0
    for size in buckets:
        ready += size
        start = max(backward * ready / total, finish)
        finish = start + ring_all_reduce_seconds(size, world, link)
    return max(0.0, finish - backward)


def balanced_stages(costs: list[float], stages: int) -> list[list[int]]:
    """Consecutive units in ``stages`` groups whose largest total cost is the smallest possible (the pipeline
    strategy's default split, by FLOPs).

    >>> balanced_stages([1, 1, 1, 1], 2), balanced_stages([3, 1, 1, 1], 2)
    ([[0, 1], [2, 3]], [[0], [1, 2, 3]])
    """
    bounds = [0, *balanced_starts(costs, stages), len(costs)]
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False)]


# --------------------------------------------------------------------------- the predictions


@dataclass
class Prediction:
    strategy: str
    world: int
    parts: dict[str, float]  # seconds per step of the slowest rank
    samples_per_step: int
    memory_mb: list[float | None]  # per device
    note: str = ""

    @property
    def step(self) -> float:
        return sum(self.parts.values())

    @property
    def samples_per_second(self) -> float:
        return self.samples_per_step / self.step


def _device_share(target: Target, devices: int) -> float:
    """The fraction of the run's samples one of ``devices`` data-parallel devices computes."""
    return 1.0 / devices if target.batch == "global" else 1.0


def share_seconds(run: Measured, share: float) -> tuple[float, float]:
    """Forward and backward seconds for ``share`` of the run's batch: the run's own times scaled as its blocks'
    measured times scale from the whole batch to that share (:func:`unit_seconds`: a fixed cost per block plus
    a cost per image, so half a batch takes more than half the time); in proportion to the samples where the
    run has no block times.

    >>> times = {"batch_sizes": [32, 8], "forward": [[0.4], [0.16]], "backward": [[0.8], [0.32]]}
    >>> run = Measured("cpu", 1, 32, 0, 0.4, 0.8, 0, 0, 1, 0, 0, 0, None, units=[["a", 1, 1, 1]], block_seconds=times)
    >>> untimed = Measured(**{**run.__dict__, "block_seconds": None})
    >>> [round(t, 3) for t in share_seconds(run, 0.5)], share_seconds(untimed, 0.5)
    ([0.24, 0.48], (0.2, 0.4))
    """
    times = _block_times(run)
    if share >= 1 or times is None:
        return run.forward * share, run.backward * share
    scale = _to_run(run, times)
    scaled = []
    for kind, measured in (("forward", run.forward), ("backward", run.backward)):
        part = sum(unit_seconds(times, kind, i, run.batch_size * share) for i in range(len(run.units)))
        scaled.append(part * scale[kind] if scale[kind] is not None else measured * share)
    return scaled[0], scaled[1]


def _to_run(run: Measured, times: dict[str, Any]) -> dict[str, float | None]:
    """Per kind (``forward``, ``backward``): what turns the blocks' times into the run's own -- the run's
    seconds over its blocks' at its batch size (timed apart, after the fit); None where the blocks took
    no time."""
    scale: dict[str, float | None] = {}
    for kind, measured in (("forward", run.forward), ("backward", run.backward)):
        whole = sum(unit_seconds(times, kind, i, run.batch_size) for i in range(len(run.units)))
        scale[kind] = measured / whole if whole > 0 else None
    return scale


def _states_mb(run: Measured) -> float:
    """Parameters, gradients and optimizer state, in MiB."""
    return (2 * run.parameter_bytes + run.optimizer_state_bytes) / MIB


def _baseline_mb(run: Measured) -> float | None:
    """What the run's peak holds besides states and activations (the runtime, the data, workspaces)."""
    if run.peak_memory_mb is None:
        return None
    return run.peak_memory_mb - _states_mb(run) - run.activation_bytes_per_sample * run.batch_size / MIB


def _plus(base: float | None, mb: float) -> float | None:
    return None if base is None else base + mb


def predict_single(run: Measured, target: Target) -> Prediction:
    parts = {"data_wait": run.data_wait, "compute": run.forward + run.backward, "communication": 0.0}
    parts |= {"optimizer": run.optimizer, "bubble": 0.0, "rest": run.rest}
    return Prediction("single", 1, parts, run.batch_size, [run.peak_memory_mb])


def predict_ddp(
    run: Measured, target: Target, link: Link, overlap: bool, replayed: Replayed | None = None
) -> Prediction:
    """One process per device: its share of the batch (:func:`share_seconds`), the gradients all-reduced in
    buckets during the backward, BatchNorm's buffers broadcast at each forward, the whole optimizer step on
    every device. With ``overlap`` (GPUs: NCCL runs beside the compute) only what runs past the backward is
    exposed; without it (a CPU: gloo copies and sums on the cores the backward computes on) all of it is,
    and where ``replayed`` the all-reduces and broadcasts cost what they were replayed to cost."""
    q, slow = _device_share(target, target.world), target.slowdown
    world = target.world
    forward, backward = (t * slow for t in share_seconds(run, q))
    buckets = ddp_buckets(run.parameter_bytes)
    broadcast = broadcast_seconds(run.buffer_bytes, world, link) if run.buffer_bytes else 0.0
    if overlap:
        exposed = ddp_exposed_seconds(buckets, backward, world, link) + broadcast
    elif replayed is not None:  # its all-reduces and its buffers' broadcasts, replayed
        exposed = replayed.ddp_seconds
    else:
        exposed = sum(ring_all_reduce_seconds(size, world, link) for size in buckets) + broadcast
    parts = {"data_wait": run.data_wait * q, "compute": forward + backward, "communication": exposed}
    parts |= {"optimizer": run.optimizer * slow, "bubble": 0.0, "rest": run.rest}
    activations = run.activation_bytes_per_sample * run.batch_size * q / MIB
    memory = _plus(_baseline_mb(run), _states_mb(run) + run.parameter_bytes / MIB + activations)  # + buckets
    return Prediction("ddp", world, parts, round(run.batch_size * q * world), [memory] * world)


def predict_fsdp(
    run: Measured, target: Target, link: Link, overlap: bool, replayed: Replayed | None = None
) -> Prediction:
    """FSDP (ZeRO-3), on the device's share of the batch (:func:`share_seconds`): every unit's parameters
    all-gathered before its forward and again before its backward, its gradients reduce-scattered after;
    states sharded, the optimizer stepping ``1/N`` of them. On a CPU (gloo) FSDP2 runs these collectives
    synchronously (none hidden); on GPUs each overlaps the compute of the unit before it. Where ``replayed``
    (a CPU), the collectives (their copies included) and the sharded optimizer step cost what they were
    replayed to cost."""
    q, slow = _device_share(target, target.world), target.slowdown
    world = target.world
    groups = max(1, sum(1 for unit in run.units if unit[2] > 0))
    gather = all_gather_seconds(run.parameter_bytes, world, link) + (groups - 1) * (world - 1) * link.latency
    forward, backward = (t * slow for t in share_seconds(run, q))
    optimizer = run.optimizer * slow / world
    if overlap:
        exposed = max(gather - forward, gather / groups) + max(2 * gather - backward, 2 * gather / groups)
    elif replayed is not None:
        exposed = replayed.fsdp_seconds
        optimizer = run.optimizer * slow * replayed.fsdp_optimizer_factor  # a sharded step's dispatch, replayed
    else:
        exposed = 3 * gather
    parts = {"data_wait": run.data_wait * q, "compute": forward + backward, "communication": exposed}
    parts |= {"optimizer": optimizer, "bubble": 0.0, "rest": run.rest}
    largest_unit = max([unit[2] for unit in run.units] or [0]) * run.parameter_bytes / max(1, _parameters(run))
    activations = run.activation_bytes_per_sample * run.batch_size * q / MIB
    memory = _plus(_baseline_mb(run), _states_mb(run) / world + 2 * largest_unit / MIB + activations)
    return Prediction("fsdp", world, parts, round(run.batch_size * q * world), [memory] * world)


def _parameters(run: Measured) -> int:
    return sum(unit[2] for unit in run.units)


def _block_times(run: Measured) -> dict[str, Any] | None:
    """The run's blocks' measured times where they are those of its units (a run of declared blocks), else None."""
    times = run.block_seconds
    return times if times and len(times["forward"][0]) == len(run.units) else None


def unit_seconds(times: dict[str, Any], kind: str, unit: int, samples: float) -> float:
    """Seconds of ``unit``'s ``kind`` (``forward`` or ``backward``) for ``samples`` images, from its times at the
    measured batch sizes (:mod:`project.toolkit.measure.block_times`): a fixed cost plus a cost per image, the
    line through the two sizes (per image alone where one size was measured).

    >>> times = {"batch_sizes": [32, 8], "forward": [[0.40], [0.16]], "backward": [[0.8], [0.8]]}
    >>> round(unit_seconds(times, "forward", 0, 16), 3), round(unit_seconds(times, "backward", 0, 4), 3)
    (0.24, 0.8)
    """
    sizes = times["batch_sizes"]
    values = [times[kind][k][unit] for k in range(len(sizes))]
    if len(sizes) < 2 or sizes[0] == sizes[1]:
        return values[0] * samples / sizes[0]
    per_image = max(0.0, (values[0] - values[1]) / (sizes[0] - sizes[1]))
    fixed = max(0.0, values[0] - per_image * sizes[0])
    return fixed + per_image * samples


def stage_seconds(run: Measured, groups: list[list[int]], micro_batches: int) -> tuple[list[float], list[float], str]:
    """Forward and backward seconds of each stage (``groups`` of units) for one micro-batch: from the units'
    measured times where the run has them, else the run's forward and backward split as the FLOPs are."""
    micro = run.batch_size / micro_batches
    times = _block_times(run)
    if times is not None:
        forward = [sum(unit_seconds(times, "forward", i, micro) for i in g) for g in groups]
        backward = [sum(unit_seconds(times, "backward", i, micro) for i in g) for g in groups]
        return forward, backward, "stages timed by block"
    costs = [float(unit[1]) for unit in run.units] or [1.0]
    share = [sum(costs[i] for i in g) / sum(costs) for g in groups]
    forward = [run.forward * s / micro_batches for s in share]
    return forward, [run.backward * s / micro_batches for s in share], "stages as their FLOPs"


def gpipe_step_seconds(forward: list[float], backward: list[float], micro_batches: int, message: float) -> float:
    """GPipe's step: every micro-batch through the stages forward, then backward. Each phase is a flow of
    ``m`` equal jobs through the stages: the sum of the stages' times plus ``m - 1`` times the slowest
    stage's, and a message between stages on each of the ``m + p - 2`` slots after the first. With equal
    stages of ``t`` (forward plus backward) that is ``(m + p - 1) t``: the bubble ``(p-1)/(m+p-1)``.

    >>> gpipe_step_seconds([1, 1], [2, 2], 4, 0.0), gpipe_step_seconds([1, 3], [2, 6], 4, 0.0)
    (15.0, 39.0)
    """
    phases = sum(forward) + sum(backward) + (micro_batches - 1) * (max(forward) + max(backward))
    return phases + 2 * (micro_batches + len(forward) - 2) * message


def gpipe_shared_seconds(
    forward: list[float], backward: list[float], micro_batches: int, message: float, slowdown: float
) -> tuple[float, list[float]]:
    """GPipe's step when the stages share the cores (processes on one CPU): the schedule played out with
    each stage's work slowed by how many stages compute at that moment -- ``slowdown`` when all ``p`` do,
    none when one computes alone, in proportion between. Each stage runs its micro-batches' forwards, then
    their backwards; a forward waits for the stage before it, a backward for the stage after it, each
    ``message`` seconds later. Returns the step and each stage's busy (wall) seconds. Without sharing
    (``slowdown`` 1) the step is :func:`gpipe_step_seconds`' with messages only where they delay a stage.

    >>> gpipe_shared_seconds([1, 1], [2, 2], 2, 0.0, 1.0)
    (9.0, [6.0, 6.0])
    >>> gpipe_shared_seconds([1, 1], [2, 2], 2, 0.0, 2.0)  # both stages compute 4 of the 12 s, at half speed
    (12.0, [9.0, 9.0])
    """
    stages, m = len(forward), micro_batches
    # each stage's tasks in order: (phase, micro-batch, seconds of work alone)
    tasks = [
        [("F", i, forward[j]) for i in range(m)] + [("B", i, backward[j]) for i in range(m)] for j in range(stages)
    ]
    done: dict[tuple[int, str, int], float] = {}  # (stage, phase, micro-batch) -> finish time
    position, left, started = [0] * stages, [0.0] * stages, [False] * stages
    busy_seconds, now = [0.0] * stages, 0.0

    def ready_at(j: int) -> float | None:
        """When stage ``j``'s next task may start, or None while what it waits for has not finished."""
        if position[j] == len(tasks[j]):
            return None
        phase, i, _ = tasks[j][position[j]]
        own = done.get((j, *tasks[j][position[j] - 1][:2]), 0.0) if position[j] else 0.0
        if phase == "F":
            needed = (j - 1, "F", i) if j > 0 else None
        else:
            needed = (j + 1, "B", i) if j < stages - 1 else (j, "F", m - 1)
        if needed is None:
            return own
        if needed not in done:
            return None
        return max(own, done[needed] + (message if needed[0] != j else 0.0))

    while any(position[j] < len(tasks[j]) for j in range(stages)):
        starts = [ready_at(j) for j in range(stages)]
        running = [j for j in range(stages) if starts[j] is not None and starts[j] <= now + 1e-15]
        for j in running:
            if not started[j]:
                left[j], started[j] = tasks[j][position[j]][2], True
        waiting = [starts[j] - now for j in range(stages) if starts[j] is not None and starts[j] > now + 1e-15]
        if not running:
            now += min(waiting)
            continue
        rate = 1 / (1 + (slowdown - 1) * (len(running) - 1) / max(1, stages - 1))
        step = min([left[j] / rate for j in running] + waiting)
        now += step
        for j in running:
            left[j] -= step * rate
            busy_seconds[j] += step
            if left[j] <= 1e-12:
                done[(j, *tasks[j][position[j]][:2])] = now
                position[j], started[j] = position[j] + 1, False
    return now, busy_seconds


def predict_pipeline(run: Measured, target: Target, link: Link) -> Prediction:
    """GPipe over ``p`` = the devices, stages balanced by the units' FLOPs as the pipeline strategy splits
    them, each stage taking the time its units were measured to take for a micro-batch of ``batch / m``
    (:func:`stage_seconds`; by FLOPs where the run did not time them), the micro-batches' activations or
    their gradients sent on between stages (:func:`gpipe_step_seconds`); every stage reads the whole
    batch; each stage's optimizer updates its own parameters. With shared cores the schedule is played out
    with the stages slowing each other only while both compute (:func:`gpipe_shared_seconds`)."""
    stages, m = target.world, target.micro_batches
    slow = target.slowdown
    samples = run.batch_size  # one pipeline, no replicas: the whole batch goes through every stage
    costs = [float(unit[1]) or 1.0 for unit in run.units] or [1.0]  # as the strategy counts a block of no FLOPs
    groups = balanced_stages(costs, stages) if len(costs) >= stages else [list(range(len(costs)))]
    forward, backward, how = stage_seconds(run, groups, m)
    boundary = max([run.units[g[-1]][3] for g in groups[:-1]] or [0.0])  # bytes per sample sent on
    message = link.latency + boundary * samples / m / link.bandwidth if len(groups) > 1 else 0.0
    if target.shared_cores:  # the stages slow each other only while they compute at the same time
        schedule, busy_each = gpipe_shared_seconds(forward, backward, m, message, slow)
        busy = max(busy_each)
    else:
        schedule = gpipe_step_seconds(forward, backward, m, message)
        busy = m * max(f + b for f, b in zip(forward, backward, strict=True))  # the slowest stage's compute
    communication = 2 * (m + len(groups) - 2) * message
    bubble = max(0.0, schedule - busy - communication)
    param_share = [sum(run.units[i][2] for i in g) / max(1, _parameters(run)) for g in groups]
    parts = {"data_wait": run.data_wait, "compute": busy, "communication": communication}
    parts |= {"optimizer": run.optimizer * max(param_share) * slow, "bubble": bubble, "rest": run.rest}
    output = [sum(run.units[i][3] for i in g) for g in groups]
    base = _baseline_mb(run)
    memory = [
        _plus(base, _states_mb(run) * p + run.activation_bytes_per_sample * samples * o / max(1, sum(output)) / MIB)
        for p, o in zip(param_share, output, strict=True)
    ]
    return Prediction("pipeline", stages, parts, samples, memory, note=f"GPipe, {m} micro-batches, {how}")


def predict_dp(run: Measured, target: Target, link: Link) -> Prediction:
    """DataParallel (one process, the devices of one node): the batch scattered from the root device, the
    network replicated onto every device each step, the outputs gathered on the root, the gradients
    reduced onto it, one optimizer step there; on a CPU it is one device (DataParallel runs the network as is)."""
    devices = target.devices if run.accelerator not in ("cpu",) else 1
    if devices < 2:
        single = predict_single(run, target)
        return Prediction("dp", 1, single.parts, single.samples_per_step, single.memory_mb, "one device (CPU)")
    q = _device_share(target, devices)
    samples = round(run.batch_size * q * devices)
    copies = (devices - 1) / devices * samples * run.image_bytes_per_sample / link.bandwidth  # scatter the images
    copies += (devices - 1) * run.parameter_bytes / link.bandwidth  # replicate: the parameters to every device
    copies += (devices - 1) * run.parameter_bytes / link.bandwidth  # gradients reduced onto the root
    parts = {"data_wait": run.data_wait * samples / run.batch_size, "compute": (run.forward + run.backward) * q}
    parts |= {"communication": copies, "optimizer": run.optimizer, "bubble": 0.0, "rest": run.rest}
    base = _baseline_mb(run)
    activations = run.activation_bytes_per_sample * run.batch_size * q / MIB
    root = _plus(base, _states_mb(run) + activations)
    other = _plus(base, 2 * run.parameter_bytes / MIB + activations)
    return Prediction("dp", devices, parts, samples, [root] + [other] * (devices - 1), "one process, one node")


def plan(
    run: Measured, target: Target, link: Link, overlap: bool | None = None, replayed: Replayed | None = None
) -> list[Prediction]:
    """Every strategy's prediction for ``target``; ``replayed``: ddp's and fsdp's cost replayed on the
    target's processes (:func:`replay_here`)."""
    if overlap is None:
        overlap = run.accelerator != "cpu"
    return [
        predict_single(run, target),
        predict_dp(run, target, link),
        predict_ddp(run, target, link, overlap, replayed),
        predict_fsdp(run, target, link, overlap, replayed),
        predict_pipeline(run, target, link),
    ]


def scaling_efficiency(prediction: Prediction, run: Measured) -> float:
    """Throughput over ``devices x`` the measured single device's.

    >>> scaling_efficiency(Prediction("ddp", 4, {"compute": 1.25}, 128, []), Measured(
    ...     "cuda", 1, 32, 0, 0.25, 0.5, 0.25, 0, 1, 0, 0, 0, None))
    0.8
    """
    return prediction.samples_per_second / (prediction.world * run.samples_per_second)


# --------------------------------------------------------------------------- the command


def table_rows(predictions: list[Prediction], run: Measured) -> list[list[str]]:
    rows = []
    for p in predictions:
        parts = " / ".join(number(p.parts[k], 3) for k in ("data_wait", "compute", "communication", "optimizer"))
        parts += " / " + " / ".join(number(p.parts[k], 3) for k in ("bubble", "rest"))
        memory = ", ".join(number(mb, 0) for mb in p.memory_mb)
        rows.append(
            [
                p.strategy,
                str(p.world),
                number(p.step, 3),
                parts,
                number(p.samples_per_second, 1),
                number(100 * scaling_efficiency(p, run), 0, " %"),
                memory,
                p.note,
            ]
        )
    return rows


HEADER = [
    "strategy",
    "devices",
    "step s",
    "data / compute / comm / optim / bubble / rest s",
    "samples/s",
    "scaling",
    "peak MiB per device",
    "note",
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m project plan", description=f"{PLAN_HELP} Trains nothing.")
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="a fit's run folder (or its timing.json)")
    parser.add_argument("--devices", type=int, required=True, help="devices per node (processes on a CPU)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument(
        "--link-gbps",
        type=float,
        default=None,
        help="link bandwidth in Gbit/s (default: measured here with gloo, and for a one-node CPU run ddp's and "
        "fsdp's cost replayed here)",
    )
    parser.add_argument("--link-latency-us", type=float, default=10.0, help="with --link-gbps: latency (default 10)")
    parser.add_argument(
        "--batch",
        choices=("global", "per-device"),
        default="global",
        help="global: the run's batch split across the devices (default); per-device: each keeps it",
    )
    parser.add_argument("--micro-batches", type=int, default=4, help="pipeline micro-batches (default 4)")
    parser.add_argument(
        "--shared-cores",
        choices=("auto", "yes", "no"),
        default="auto",
        help="the devices are processes sharing the machine's CPU cores (auto: for a CPU run on 1 node, from "
        "the run's threads and cores and how much processes computing at once slow each other here, measured; "
        "yes: N times slower than the run; no: as fast as the run)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write plan.md and plan.json into this folder")
    return parser.parse_args(argv)


def check_target(args: argparse.Namespace) -> None:
    for name in ("devices", "nodes", "micro_batches"):
        if getattr(args, name) < 1:
            raise ProjectError(f"plan --{name.replace('_', '-')}={getattr(args, name)} is not allowed: it must be >= 1")
    if args.link_gbps is not None and not args.link_gbps > 0:
        raise ProjectError(f"plan --link-gbps={args.link_gbps} is not allowed: it must be a number > 0")


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
    each other on this machine, measured (:mod:`project.toolkit.measure.cores`), and what was measured; 1
    elsewhere. The plan is then made on the machine whose cores it is about."""
    if shared_cores != "auto" or run.accelerator != "cpu" or nodes != 1 or devices < 2 or not run.cores:
        return 1.0, ""
    from project.toolkit.measure.cores import measure_core_sharing

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
    (:class:`project.toolkit.measure.replay.UnitWork`: forward and backward seconds, output bytes): the
    plan's compute for it -- its block's times at the device's share of the batch, scaled to the run's
    forward and backward as :func:`share_seconds` scales them, ``slowdown`` x -- and its output at that
    share; ``None`` where the run timed no blocks.

    >>> times = {"batch_sizes": [32, 8], "forward": [[0.2, 0.2], [0.05, 0.05]], "backward": [[0.4, 0.4], [0.1, 0.1]]}
    >>> run = Measured("cpu", 1, 32, 0, 0.4, 0.8, 0, 0, 1, 0, 0, 0, None, units=[["a", 1, 1, 10], ["b", 1, 1, 20]],
    ...                block_seconds=times)
    >>> [tuple(round(x, 3) for x in w) for w in stand_in_work(run, Target(2, slowdown=2.0))]
    [(0.2, 0.4, 160.0), (0.2, 0.4, 320.0)]
    """
    from project.toolkit.measure.replay import UnitWork

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
    """ddp's and fsdp's cost per step replayed (:mod:`project.toolkit.measure.replay`) where the plan is about
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
    from project.toolkit.measure.replay import replay_data_parallel

    work = stand_in_work(run, target)
    threads = threads_per_process(run, devices)
    measured = replay_data_parallel(numels["units"], numels["rest"], int(run.buffer_bytes), devices, threads, work)
    return Replayed(
        measured["ddp_seconds"], measured["fsdp_seconds"], measured["fsdp_optimizer_factor"], measured["how"]
    )


def describe_replay(replayed: Replayed) -> str:
    """One line of what the replay measured.

    >>> line = describe_replay(Replayed(0.01, 0.1, 2.5, "replayed here"))
    >>> line.startswith("ddp's communication 0.010 s and fsdp's 0.100 s"), line.endswith("(replayed here)")
    (True, True)
    """
    return (
        f"ddp's communication {replayed.ddp_seconds:.3f} s and fsdp's {replayed.fsdp_seconds:.3f} s per step (what "
        f"the compute alone does not take), fsdp's optimizer step {replayed.fsdp_optimizer_factor:.2f}x a whole "
        f"one's ({replayed.how})"
    )


def link_from(gbps: float | None, latency_us: float) -> Link:
    """The link given (``--link-gbps``, ``--link-latency-us``), or measured here by a gloo all-reduce
    benchmark (:mod:`project.toolkit.measure.link`) where no bandwidth is given."""
    if gbps is not None:
        return Link(latency_us * 1e-6, gbps * 1e9 / 8, f"given: {gbps:g} Gbit/s")
    from project.toolkit.measure.link import measure_link

    measured = measure_link()
    return Link(measured["latency_s"], measured["bandwidth_bytes_per_s"], "measured here (gloo all_reduce)", here=True)


def make_plan(args: argparse.Namespace, command: str) -> tuple[str, dict[str, Any]]:
    """The table (text) and the JSON record of ``python -m project plan``."""
    check_target(args)
    run = read_run(args.run_dir)
    sharing, sharing_note = sharing_here(run, args.shared_cores, args.devices, args.nodes)
    slowdown = core_slowdown(run, args.shared_cores, args.devices, args.nodes, sharing)
    target = Target(args.devices, args.nodes, args.batch, args.micro_batches, slowdown)
    link = link_from(args.link_gbps, args.link_latency_us)
    replayed = replay_here(run, target, link)
    predictions = plan(run, target, link, replayed=replayed)
    lines = [
        f"Plan from {run.name}: {run.accelerator}, global batch {run.batch_size}, measured step {run.step:.3f} s",
        f"  ({run.samples_per_second:.1f} samples/s); target {target.devices} device(s) x {target.nodes} node(s),",
        f"  batch {target.batch}, link {link.bandwidth * 8 / 1e9:.2f} Gbit/s + {link.latency * 1e6:.0f} us per message "
        f"({link.source}); each device computes {target.slowdown:.2f}x slower than the run (shared cores"
        + (f"; {sharing_note}" if sharing_note else "")
        + ")."
        + (f"\n  {describe_replay(replayed)}." if replayed else ""),
        "",
        text_table(HEADER, table_rows(predictions, run)),
        "",
        "Formulas and what they leave out: docs/plan.md.",
    ]
    if run.world_size > 1:  # its rank 0's step stands for the run: right for ddp's share, not for a pipeline
        lines.append(
            f"The run had {run.world_size} processes: the plan reads rank 0's step as the run's; "
            "a single-device run is the plan's intended input."
        )
    record = {
        "command": command,
        "run": run.name,
        "target": target.__dict__,
        "core_sharing": sharing_note or None,
        "replayed": replayed.__dict__ if replayed else None,
        "link": link.__dict__,
        "predictions": [
            {
                "strategy": p.strategy,
                "devices": p.world,
                "step_seconds": p.step,
                "parts": p.parts,
                "samples_per_second": p.samples_per_second,
                "scaling_efficiency": scaling_efficiency(p, run),
                "peak_memory_mb": p.memory_mb,
                "note": p.note,
            }
            for p in predictions
        ],
    }
    return "\n".join(lines), record


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m project plan``; ``argv`` replaces ``sys.argv[2:]`` (for tests)."""
    argv = sys.argv[2:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "project", "plan", *argv])
    with exit_on_project_error():
        text, record = make_plan(args, command)
        print(text, flush=True)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "plan.json").write_text(json.dumps(record, indent=2) + "\n")
            (args.out / "plan.md").write_text(f"# Plan\n\nProduced by `{command}`.\n\n```\n{text}\n```\n")

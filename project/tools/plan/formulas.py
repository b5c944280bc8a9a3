"""The plan's formulas, in plain Python (no torch): collectives over a ring, DDP's buckets, stages of balanced cost,
GPipe's schedule, a unit's time at a batch size."""

from __future__ import annotations

import math
from typing import Any

from project.toolkit.strategies.balance import balanced_starts
from project.tools.plan.inputs import Link

MIB = 2**20
DDP_FIRST_BUCKET = 1 * MIB  # torch's DistributedDataParallel: the first bucket (the last layers) is small
DDP_BUCKET = 25 * MIB  # bucket_cap_mb's default


def ring_all_reduce_seconds(nbytes: float, world: int, link: Link) -> float:
    """Ring all-reduce: ``2(N-1)`` steps, each a latency and ``bytes / N`` over the link."""
    return 0.0 if world < 2 else 2 * (world - 1) * link.latency + 2 * (world - 1) / world * nbytes / link.bandwidth


def all_gather_seconds(nbytes: float, world: int, link: Link) -> float:
    """Ring all-gather (or reduce-scatter) of ``nbytes`` in all: ``N-1`` steps of ``bytes / N``."""
    return 0.0 if world < 2 else (world - 1) * link.latency + (world - 1) / world * nbytes / link.bandwidth


def broadcast_seconds(nbytes: float, world: int, link: Link) -> float:
    """A pipelined broadcast: the bytes once over the link, a latency per tree level."""
    return 0.0 if world < 2 else math.ceil(math.log2(world)) * link.latency + nbytes / link.bandwidth


def ddp_buckets(parameter_bytes: float, first: float = DDP_FIRST_BUCKET, cap: float = DDP_BUCKET) -> list[float]:
    """DDP's gradient buckets in the order the backward fills them: a small first one, then ``cap`` each."""
    buckets, left = [], parameter_bytes
    for size in [first, *[cap] * math.ceil(parameter_bytes / cap)]:
        if left <= 0:
            break
        buckets.append(min(size, left))
        left -= size
    return buckets


def ddp_exposed_seconds(buckets: list[float], backward: float, world: int, link: Link) -> float:
    """The all-reduce time left after the backward: a bucket is ready once the backward (even per byte) filled it."""
    total, ready, finish = sum(buckets), 0.0, 0.0
    for size in buckets:
        ready += size
        start = max(backward * ready / total, finish)
        finish = start + ring_all_reduce_seconds(size, world, link)
    return max(0.0, finish - backward)


def balanced_stages(costs: list[float], stages: int) -> list[list[int]]:
    """Consecutive units in ``stages`` groups of balanced cost (the pipeline strategy's default split)."""
    bounds = [0, *balanced_starts(costs, stages), len(costs)]
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False)]


def unit_seconds(times: dict[str, Any], kind: str, unit: int, samples: float) -> float:
    """Seconds of ``unit``'s ``kind`` for ``samples`` images: the line through its times at two batch sizes (or one)."""
    sizes = times["batch_sizes"]
    values = [times[kind][k][unit] for k in range(len(sizes))]
    if len(sizes) < 2 or sizes[0] == sizes[1]:
        return values[0] * samples / sizes[0]
    per_image = max(0.0, (values[0] - values[1]) / (sizes[0] - sizes[1]))
    fixed = max(0.0, values[0] - per_image * sizes[0])
    return fixed + per_image * samples


def gpipe_step_seconds(forward: list[float], backward: list[float], micro_batches: int, message: float) -> float:
    """GPipe's step, forward then backward, each phase a flow of ``m`` jobs through the stages: the stages' sum
    plus ``m - 1`` times the slowest stage, and a message on each of the ``m + p - 2`` slots after the first."""
    phases = sum(forward) + sum(backward) + (micro_batches - 1) * (max(forward) + max(backward))
    return phases + 2 * (micro_batches + len(forward) - 2) * message


def gpipe_shared_seconds(
    forward: list[float], backward: list[float], micro_batches: int, message: float, slowdown: float
) -> tuple[float, list[float]]:
    """GPipe's schedule played out, stages slowed by how many compute at once: the step, each stage's busy seconds."""
    stages, m = len(forward), micro_batches
    # each stage's tasks in order: (phase, micro-batch, seconds of work alone)
    tasks = [
        [("F", i, forward[j]) for i in range(m)] + [("B", i, backward[j]) for i in range(m)] for j in range(stages)
    ]
    done: dict[tuple[int, str, int], float] = {}  # (stage, phase, micro-batch) -> finish time
    position, left, started = [0] * stages, [0.0] * stages, [False] * stages
    busy_seconds, now = [0.0] * stages, 0.0

    def ready_at(j: int) -> float | None:
        # when stage j's next task may start; None while what it waits for has not finished
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
        return None if needed not in done else max(own, done[needed] + (message if needed[0] != j else 0.0))

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

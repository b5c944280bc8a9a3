"""Each strategy's step, throughput and memory per device on the target, from the measured run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from project.tools.plan import formulas
from project.tools.plan.formulas import MIB, unit_seconds
from project.tools.plan.inputs import Link, Measured, Target


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
    return 1.0 / devices if target.batch == "global" else 1.0


def share_seconds(run: Measured, share: float) -> tuple[float, float]:
    """Forward and backward seconds for ``share`` of the run's batch: the run's times scaled as its blocks' times
    scale (:func:`unit_seconds`: half a batch takes more than half the time); in proportion without block times."""
    times = timed_blocks(run)
    if share >= 1 or times is None:
        return run.forward * share, run.backward * share
    scale = _to_run(run, times)
    scaled = []
    for kind, measured in (("forward", run.forward), ("backward", run.backward)):
        part = sum(unit_seconds(times, kind, i, run.batch_size * share) for i in range(len(run.units)))
        scaled.append(part * scale[kind] if scale[kind] is not None else measured * share)
    return scaled[0], scaled[1]


def _to_run(run: Measured, times: dict[str, Any]) -> dict[str, float | None]:
    """Per kind: the run's seconds over its blocks' at its batch size; None where the blocks took no time."""
    scale: dict[str, float | None] = {}
    for kind, measured in (("forward", run.forward), ("backward", run.backward)):
        whole = sum(unit_seconds(times, kind, i, run.batch_size) for i in range(len(run.units)))
        scale[kind] = measured / whole if whole > 0 else None
    return scale


def _states_mb(run: Measured) -> float:
    # parameters, gradients and optimizer state
    return (2 * run.parameter_bytes + run.optimizer_state_bytes) / MIB


def _baseline_mb(run: Measured) -> float | None:
    # what the run's peak holds besides states and activations (the runtime, the data, workspaces)
    if run.peak_memory_mb is None:
        return None
    return run.peak_memory_mb - _states_mb(run) - run.activation_bytes_per_sample * run.batch_size / MIB


def _plus(base: float | None, mb: float) -> float | None:
    return None if base is None else base + mb


def predict_single(run: Measured, target: Target) -> Prediction:
    parts = {"data_wait": run.data_wait, "compute": run.forward + run.backward, "communication": 0.0}
    parts |= {"optimizer": run.optimizer, "bubble": 0.0, "rest": run.rest}
    return Prediction("single", 1, parts, run.batch_size, [run.peak_memory_mb])


def predict_ddp(run: Measured, target: Target, link: Link, overlap: bool) -> Prediction:
    """One process per device, gradients all-reduced in buckets during the backward: with ``overlap`` (NCCL) only what
    runs past the backward is exposed; with gloo all of it."""
    q, slow, world = _device_share(target, target.world), target.slowdown, target.world
    forward, backward = (t * slow for t in share_seconds(run, q))
    buckets = formulas.ddp_buckets(run.parameter_bytes)
    broadcast = formulas.broadcast_seconds(run.buffer_bytes, world, link) if run.buffer_bytes else 0.0
    if overlap:
        exposed = formulas.ddp_exposed_seconds(buckets, backward, world, link) + broadcast
    else:
        exposed = sum(formulas.ring_all_reduce_seconds(size, world, link) for size in buckets) + broadcast
    parts = {"data_wait": run.data_wait * q, "compute": forward + backward, "communication": exposed}
    parts |= {"optimizer": run.optimizer * slow, "bubble": 0.0, "rest": run.rest}
    activations = run.activation_bytes_per_sample * run.batch_size * q / MIB
    memory = _plus(_baseline_mb(run), _states_mb(run) + run.parameter_bytes / MIB + activations)  # + buckets
    return Prediction("ddp", world, parts, round(run.batch_size * q * world), [memory] * world)


def predict_fsdp(run: Measured, target: Target, link: Link, overlap: bool) -> Prediction:
    """FSDP (ZeRO-3): parameters all-gathered before each unit's forward and backward, gradients reduce-scattered:
    with ``overlap`` behind the previous unit's compute; with gloo none hidden."""
    q, slow, world = _device_share(target, target.world), target.slowdown, target.world
    groups = max(1, sum(1 for unit in run.units if unit[2] > 0))
    gather = formulas.all_gather_seconds(run.parameter_bytes, world, link) + (groups - 1) * (world - 1) * link.latency
    forward, backward = (t * slow for t in share_seconds(run, q))
    if overlap:
        exposed = max(gather - forward, gather / groups) + max(2 * gather - backward, 2 * gather / groups)
    else:
        exposed = 3 * gather
    parts = {"data_wait": run.data_wait * q, "compute": forward + backward, "communication": exposed}
    parts |= {"optimizer": run.optimizer * slow / world, "bubble": 0.0, "rest": run.rest}
    largest_unit = max([unit[2] for unit in run.units] or [0]) * run.parameter_bytes / max(1, run.parameters)
    activations = run.activation_bytes_per_sample * run.batch_size * q / MIB
    memory = _plus(_baseline_mb(run), _states_mb(run) / world + 2 * largest_unit / MIB + activations)
    return Prediction("fsdp", world, parts, round(run.batch_size * q * world), [memory] * world)


def timed_blocks(run: Measured) -> dict[str, Any] | None:
    """The run's block times (``block_times.json``) if they time its units; else None."""
    times = run.block_seconds
    return times if times and len(times["forward"][0]) == len(run.units) else None


def stage_seconds(run: Measured, groups: list[list[int]], micro_batches: int) -> tuple[list[float], list[float], str]:
    """Forward and backward seconds of each stage for one micro-batch: by block times, else as the FLOPs split."""
    micro = run.batch_size / micro_batches
    times = timed_blocks(run)
    if times is not None:
        forward = [sum(unit_seconds(times, "forward", i, micro) for i in g) for g in groups]
        backward = [sum(unit_seconds(times, "backward", i, micro) for i in g) for g in groups]
        return forward, backward, "stages timed by block"
    costs = [float(unit[1]) for unit in run.units] or [1.0]
    share = [sum(costs[i] for i in g) / sum(costs) for g in groups]
    forward = [run.forward * s / micro_batches for s in share]
    return forward, [run.backward * s / micro_batches for s in share], "stages as their FLOPs"


def predict_pipeline(run: Measured, target: Target, link: Link) -> Prediction:
    """GPipe over the devices, stages balanced by FLOPs as the pipeline strategy splits them, each taking its
    units' time for a micro-batch (:func:`stage_seconds`), activations and gradients sent between stages."""
    stages, m, slow = target.world, target.micro_batches, target.slowdown
    samples = run.batch_size  # one pipeline, no replicas: the whole batch goes through every stage
    costs = [float(unit[1]) or 1.0 for unit in run.units] or [1.0]  # as the strategy counts a block of no FLOPs
    groups = formulas.balanced_stages(costs, stages) if len(costs) >= stages else [list(range(len(costs)))]
    forward, backward, how = stage_seconds(run, groups, m)
    boundary = max([run.units[g[-1]][3] for g in groups[:-1]] or [0.0])  # bytes per sample sent on
    message = link.latency + boundary * samples / m / link.bandwidth if len(groups) > 1 else 0.0
    if target.shared_cores:  # the stages slow each other only while they compute at the same time
        schedule, busy_each = formulas.gpipe_shared_seconds(forward, backward, m, message, slow)
        busy = max(busy_each)
    else:
        schedule = formulas.gpipe_step_seconds(forward, backward, m, message)
        busy = m * max(f + b for f, b in zip(forward, backward, strict=True))  # the slowest stage's compute
    communication = 2 * (m + len(groups) - 2) * message
    bubble = max(0.0, schedule - busy - communication)
    param_share = [sum(run.units[i][2] for i in g) / max(1, run.parameters) for g in groups]
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
    """DataParallel (one process, one node): scatter, replicate, reduce onto the root; on a CPU, one device."""
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


def plan(run: Measured, target: Target, link: Link, overlap: bool | None = None) -> list[Prediction]:
    """Every strategy's prediction for ``target``; ``overlap``: collectives behind the compute (default: on GPUs)."""
    overlap = run.accelerator != "cpu" if overlap is None else overlap
    ddp_fsdp = [predict_ddp(run, target, link, overlap), predict_fsdp(run, target, link, overlap)]
    return [predict_single(run, target), predict_dp(run, target, link), *ddp_fsdp, predict_pipeline(run, target, link)]


def scaling_efficiency(prediction: Prediction, run: Measured) -> float:
    """Throughput over ``devices x`` the measured single device's."""
    return prediction.samples_per_second / (prediction.world * run.samples_per_second)

"""How much work a figure stands for: a network's FLOPs per image, the device's dense peak, and model FLOPs
utilisation (``samples/s x FLOPs per sample / (devices x peak)``), which compares across networks; beside MFU, the least
bytes a training step moves over its time against the device's peak bandwidth: for a memory-bound network (MobileNetV2:
MFU of a few percent) that, not MFU, says how far a run is from the device's limit."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import torch
from lightning.fabric.utilities.throughput import get_available_flops
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def _conv_backward_flop(
    grad_out_shape: list[int], x_shape: list[int], w_shape: list[int], *args: Any, **kwargs: Any
) -> int:
    """FLOPs of ``aten.convolution_backward``: each gradient asked for costs what the forward did; torch's own formula
    counts a grouped convolution's weight gradient ``groups`` times (https://github.com/pytorch/pytorch/pull/183405)."""
    # the rest of the schema: bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
    transposed, output_mask = args[4], args[7]
    positions = math.prod(x_shape[2:] if transposed else grad_out_shape[2:])
    forward = 2 * grad_out_shape[0] * positions * math.prod(w_shape)  # the weight's shape divides by the groups
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


FLOP_FORMULAS = {torch.ops.aten.convolution_backward: _conv_backward_flop}


def meta_copy(net: nn.Module) -> nn.Module:
    """A deep copy of ``net`` with its parameters and buffers on the ``meta`` device; the weights are never copied."""
    memo: dict[int, Any] = {}
    for p in net.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in net.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(net, memo)


def _counted_pass(
    net: nn.Module, image_size: int, channels_last: bool, in_channels: int, training: bool
) -> FlopCounterMode:
    """A FlopCounterMode that saw a step of a ``meta`` copy of ``net`` on a ``meta`` batch of 2 images: BatchNorm
    trains on 2 or more values, and every count scales with the batch, so the callers halve its counts."""
    model = meta_copy(net).train(training)
    images = torch.empty(2, in_channels, image_size, image_size, device="meta")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    counter = FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)
    with counter, torch.set_grad_enabled(training):
        output = model(images)
        if training:
            output.sum().backward()
    return counter


def model_flops_per_sample(
    net: nn.Module, image_size: int, channels_last: bool = True, in_channels: int = 3
) -> dict[str, int]:
    """FLOPs per image of a training step (``train``) and of ``inference`` on a ``meta`` copy of a plain ``net``."""
    passes = {"train": True, "inference": False}
    feed = (image_size, channels_last, in_channels)
    return {kind: _counted_pass(net, *feed, training).get_total_flops() // 2 for kind, training in passes.items()}


def forward_flops_by_module(
    net: nn.Module, image_size: int, channels_last: bool = True, in_channels: int = 3
) -> dict[str, int]:
    """Inference FLOPs per image of each module of a plain ``net`` that runs, by its name in ``net`` (``""``: ``net``
    itself, which has :func:`model_flops_per_sample`'s ``inference`` count), on a ``meta`` copy."""
    counts = _counted_pass(net, image_size, channels_last, in_channels, training=False).get_flop_counts()
    root = type(net).__name__  # FlopCounterMode's name for the module it ran
    return {
        name.removeprefix(root).removeprefix("."): sum(by_op.values()) // 2
        for name, by_op in counts.items()
        if name == root or name.startswith(root + ".")
    }


# Dense peak TFLOP/s where Lightning's get_available_flops has none or a sparse one: it lists the H200 and the H100 NVL
# by their 2:4-sparsity figures (https://github.com/Lightning-AI/pytorch-lightning/issues/21677) and takes no
# "NVIDIA H200" for an H200. NVIDIA's datasheets: fp32 the CUDA cores' rate; tf32, bf16, fp16 the tensor cores'.
DENSE_TFLOPS: dict[str, dict[str, float]] = {
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
}
# Peak memory bandwidth in TB/s (NVIDIA's datasheets; the A100: its 80GB board's), which Lightning has no table of.
PEAK_TBPS = {"H200 NVL": 4.8, "H200": 4.8, "H100 NVL": 3.9, "H100 PCIe": 2.0, "H100": 3.35, "A100": 2.039, "L4": 0.3}
PRECISIONS = {"32-true": "fp32", "32": "fp32", "bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16"}
PRECISIONS |= {"16-mixed": "fp16", "16-true": "fp16", "16": "fp16"}
# get_available_flops's keys: float32 is the CUDA cores' (it takes TF32 from the matmul switch, not from cuDNN's)
DTYPES: dict[str, torch.dtype | str] = {"fp32": torch.float32, "tf32": "tfloat32", "bf16": torch.bfloat16}
DTYPES |= {"fp16": torch.float16}


def device_row(device_name: str, table: dict[str, Any]) -> str | None:
    """The first row of ``table`` whose every word ``device_name`` has (``H100 NVL`` before ``H100``; no ``L4`` in
    ``L40S``), or None."""
    words = [row for row in table if all(re.search(rf"\b{w}\b", device_name, re.IGNORECASE) for w in row.split())]
    return words[0] if words else None


def precision_column(precision: str | int, tf32: bool) -> str | None:
    """The column a Lightning precision computes its matrix products in; None for others (64-true)."""
    column = PRECISIONS.get(str(precision).lower())
    return "tf32" if column == "fp32" and tf32 else column


def mfu(achieved_tflops_per_second: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation: the achieved rate over the peak (of all devices); None where either is unknown."""
    if achieved_tflops_per_second is None or peak is None or peak <= 0:
        return None
    return achieved_tflops_per_second / peak


def device_peak_tflops(device: torch.device, precision: str) -> float | None:
    """The dense peak TFLOP/s of ONE CUDA ``device`` at a Lightning ``precision``, float32 convolutions as cuDNN's TF32
    switch runs them: :data:`DENSE_TFLOPS`, else Lightning's ``get_available_flops``; None where neither knows it."""
    column = precision_column(precision, tf32=bool(torch.backends.cudnn.allow_tf32))
    if device.type != "cuda" or column is None:
        return None
    row = device_row(torch.cuda.get_device_name(device), DENSE_TFLOPS)
    if row is not None:
        return DENSE_TFLOPS[row][column]
    available = get_available_flops(device, DTYPES[column])
    return available / 1e12 if available else None


# Each parameter's bytes a plain SGD step moves: read in the forward and in the backward, its gradient written and
# read, and the update reading parameter, gradient and momentum and writing parameter and momentum.
PARAMETER_PASSES = 8


def device_peak_tbps(device: torch.device) -> float | None:
    """The peak memory bandwidth of ONE CUDA ``device`` in TB/s; None elsewhere (a CPU, an unlisted GPU)."""
    row = device_row(torch.cuda.get_device_name(device), PEAK_TBPS) if device.type == "cuda" else None
    return PEAK_TBPS[row] if row else None


def training_traffic(
    network: dict[str, Any], precision: str, samples_per_second: float, steps_per_second: float, devices: int
) -> float:
    """Bytes per second all devices move at the least: each sample's input read, its activations saved for the backward
    written and read (float32 in network_profile), each device's parameters :data:`PARAMETER_PASSES` times a step."""
    width = 0.5 if str(precision).startswith(("bf16", "16")) else 1.0  # half-precision activations: half the bytes
    per_sample = network["input_bytes_per_sample"] + 2 * network["activation_bytes_per_sample"] * width
    return samples_per_second * per_sample + devices * steps_per_second * PARAMETER_PASSES * network["parameter_bytes"]

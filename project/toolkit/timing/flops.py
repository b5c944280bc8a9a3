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


# Dense peak TFLOP/s from NVIDIA's datasheets and whitepapers: without the 2:4 sparsity of their headline
# tensor-core figures. fp32 is the CUDA-core rate; tf32, bf16 and fp16 are tensor-core rates.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200 SXM": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
}

# torch.cuda.get_device_name() -> the table's row: the first match wins; word boundaries keep L40 from L4.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    (r"\bH200\b", "H200 SXM"),
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
    (r"\bH100\b.*\b(SXM|HBM3)\b", "H100 SXM"),  # "NVIDIA H100 80GB HBM3"
    (r"\bA100\b", "A100"),
    (r"\bL4\b", "L4"),
)
_PRECISIONS = {"32-true": "fp32", "32": "fp32", "bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16"}
_PRECISIONS |= {"16-mixed": "fp16", "16-true": "fp16", "16": "fp16"}


def device_row(device_name: str) -> str | None:
    """The row of :data:`PEAK_TFLOPS` for a ``torch.cuda.get_device_name()``, or None."""
    return next((row for pattern, row in _DEVICE_PATTERNS if re.search(pattern, device_name, re.IGNORECASE)), None)


def precision_column(precision: str | int, tf32: bool) -> str | None:
    """The :data:`PEAK_TFLOPS` column a Lightning precision computes its matrix products in; None for others."""
    column = _PRECISIONS.get(str(precision).lower())
    return "tf32" if column == "fp32" and tf32 else column


def convolutions_use_tf32() -> bool:
    """Whether float32 convolutions run in TF32 (cuDNN's switch, which sets these networks' peak at ``32-true``)."""
    return bool(torch.backends.cudnn.allow_tf32)


def peak_tflops(device_name: str, precision: str | int, tf32: bool) -> float | None:
    """The dense peak TFLOP/s of ONE device at a Lightning ``precision``; None where the table has no row: no guess."""
    row, column = device_row(device_name), precision_column(precision, tf32)
    return None if row is None or column is None else PEAK_TFLOPS[row][column]


def mfu(achieved_tflops_per_second: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation: the achieved rate over the peak (of all devices); None where either is unknown."""
    if achieved_tflops_per_second is None or peak is None or peak <= 0:
        return None
    return achieved_tflops_per_second / peak


def device_peak_tflops(device: torch.device, precision: str) -> float | None:
    """The dense peak of ONE CUDA ``device``: :data:`PEAK_TFLOPS`, else Lightning's ``get_available_flops``."""
    if device.type != "cuda":
        return None
    peak = peak_tflops(torch.cuda.get_device_name(device), precision, tf32=convolutions_use_tf32())
    column = precision_column(precision, tf32=False)  # the dtype, whatever the TF32 switch
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(column or "")
    if peak is None and dtype is not None:
        from lightning.fabric.utilities.throughput import get_available_flops

        available = get_available_flops(device, dtype)
        peak = available / 1e12 if available else None
    return peak


# Peak memory bandwidth in TB/s, NVIDIA's datasheets, by the rows of PEAK_TFLOPS (A100: the 80GB board's).
PEAK_TBPS = {"H100 SXM": 3.35, "H100 PCIe": 2.0, "H100 NVL": 3.9, "H200 SXM": 4.8, "H200 NVL": 4.8, "A100": 2.039}
PEAK_TBPS |= {"L4": 0.3}
# Each parameter's bytes a plain SGD step moves: read in the forward and in the backward, its gradient written and
# read, and the update reading parameter, gradient and momentum and writing parameter and momentum.
PARAMETER_PASSES = 8


def device_peak_tbps(device: torch.device) -> float | None:
    """The peak memory bandwidth of ONE CUDA ``device`` in TB/s; None elsewhere (a CPU, an unlisted GPU)."""
    if device.type != "cuda":
        return None
    row = device_row(torch.cuda.get_device_name(device))
    return PEAK_TBPS.get(row) if row else None


def training_traffic(
    network: dict[str, Any], precision: str, samples_per_second: float, steps_per_second: float, devices: int
) -> float:
    """Bytes per second all devices move at the least: each sample's input read, its activations saved for the backward
    written and read (float32 in network_profile), each device's parameters :data:`PARAMETER_PASSES` times a step."""
    width = 0.5 if str(precision).startswith(("bf16", "16")) else 1.0  # half-precision activations: half the bytes
    per_sample = network["input_bytes_per_sample"] + 2 * network["activation_bytes_per_sample"] * width
    return samples_per_second * per_sample + devices * steps_per_second * PARAMETER_PASSES * network["parameter_bytes"]

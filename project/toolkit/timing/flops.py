"""How much work a figure stands for: a network's FLOPs per image, model FLOPs utilisation (``samples/s x FLOPs per
sample / (devices x peak)``), which compares across networks, and beside MFU the least bytes a training step moves over
its time, against the device's peak bandwidth: for a memory-bound network (MobileNetV2: MFU of a few percent) that, not
MFU, says how far a run is from the device's limit. The peaks of CUDA devices: :mod:`.peaks`."""

from __future__ import annotations

import copy
import math
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


def mfu(achieved_tflops_per_second: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation: the achieved rate over the peak (of all devices); None where either is unknown."""
    if achieved_tflops_per_second is None or peak is None or peak <= 0:
        return None
    return achieved_tflops_per_second / peak


# Each parameter's bytes a plain SGD step moves: read in the forward and in the backward, its gradient written and
# read, and the update reading parameter, gradient and momentum and writing parameter and momentum.
PARAMETER_PASSES = 8


def training_traffic(
    network: dict[str, Any], precision: str, samples_per_second: float, steps_per_second: float, devices: int
) -> float:
    """Bytes per second all devices move at the least: each sample's input read, its activations saved for the backward
    written and read (float32 in network_profile), each device's parameters :data:`PARAMETER_PASSES` times a step."""
    width = 0.5 if str(precision).startswith(("bf16", "16")) else 1.0  # half-precision activations: half the bytes
    per_sample = network["input_bytes_per_sample"] + 2 * network["activation_bytes_per_sample"] * width
    return samples_per_second * per_sample + devices * steps_per_second * PARAMETER_PASSES * network["parameter_bytes"]

"""How much work a figure stands for: a network's FLOPs per image (:func:`model_flops_per_sample`), the
device's dense peak (:func:`peak_tflops`) and the share of that peak a run achieved (:func:`mfu`).

Model FLOPs utilisation (MFU) is the achieved rate of the network's own arithmetic over the device's peak:
``samples/s x training FLOPs per sample / (devices x peak)``. It says how far a run is from what the hardware
could do, and unlike samples/s it compares across networks and image sizes.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# --------------------------------------------------------------------------- FLOPs of the network


def _conv_backward_flop(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: int,
    output_mask: list[bool],
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    """FLOPs of ``aten.convolution_backward``: each multiply-add of the forward convolution (``x * w`` into
    the output) has exactly one counterpart in the input gradient and one in the weight gradient, so each
    gradient asked for (``output_mask``) costs what the forward did.

    Replaces torch's own formula, which counts the weight gradient of a grouped convolution once per group
    too many: ``groups`` times, 32-960 for MobileNetV2's depthwise convolutions, making its backward 20 x
    its forward (seen with torch 2.15; see pytorch/pytorch PR #183405).

    The forward's multiply-adds are ``batch x positions x weight elements``, where positions are the output's
    spatial positions for a convolution and the input's for a transposed one (the weight's shape already
    divides the channels by the groups). 2 FLOPs per multiply-add, as torch counts.
    """
    positions = math.prod(x_shape[2:] if transposed else grad_out_shape[2:])
    forward = 2 * grad_out_shape[0] * positions * math.prod(w_shape)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


# Grouped convolutions are counted right; everything else as torch counts it.
_FLOP_FORMULAS = {torch.ops.aten.convolution_backward: _conv_backward_flop}


def _counted_flops(run: Any) -> int:
    with FlopCounterMode(display=False, custom_mapping=_FLOP_FORMULAS) as counter:
        run()
    return counter.get_total_flops()


def meta_copy(net: nn.Module) -> nn.Module:
    """A deep copy of ``net`` whose parameters and buffers live on the ``meta`` device: shapes without data.

    The copy is made with the tensors already replaced (``deepcopy``'s memo), so the network's weights are
    never copied -- nor allocated on its device.
    """
    memo: dict[int, Any] = {}
    for p in net.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in net.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(net, memo)


def model_flops_per_sample(
    net: nn.Module, image_size: int, channels_last: bool = True, in_channels: int = 3
) -> dict[str, int]:
    """FLOPs per image of one training step (``train``: forward and backward) and of inference
    (``inference``: forward), counted once by running ``net`` on an ``in_channels x image_size x image_size``
    input.

    What is counted: what :class:`torch.utils.flop_counter.FlopCounterMode` counts -- matrix products and
    convolutions (``mm``, ``addmm``, ``bmm``, ``convolution`` and their backward, attention), at 2 FLOPs per
    multiply-add, with biases left out -- with the weight gradient of grouped convolutions corrected (see
    :func:`_conv_backward_flop`). Not counted: elementwise operations (activations, adds), BatchNorm,
    pooling, the loss, and the optimizer step. For these convolutional networks that is nearly all of the
    arithmetic, and it is the convention MFU figures use. The backward computes no gradient of the input
    image, so ``train`` is a little under 3 x ``inference``.

    ``net`` is not touched: the count runs on a copy on the ``meta`` device (shapes only, no arithmetic:
    a ResNet50 at 112 px takes about a second on a CPU), in training mode for ``train`` (BatchNorm then
    needs 2 or more values per channel, hence a batch of 2, halved) and evaluation mode for ``inference``.
    ``channels_last`` runs the copy in the memory layout training uses; the count does not depend on it.
    Pass a plain network (the LightningModule's ``net``): not one wrapped by a strategy (DataParallel,
    FSDP's sharded parameters) nor compiled.

    >>> model_flops_per_sample(nn.Sequential(nn.Flatten(), nn.Linear(3 * 2 * 2, 5)), image_size=2)
    {'train': 240, 'inference': 120}
    """
    model = meta_copy(net)
    images = torch.empty(2, in_channels, image_size, image_size, device="meta")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)

    def train_step() -> None:
        model.train()
        model(images).sum().backward()

    def inference() -> None:
        model.eval()
        with torch.no_grad():
            model(images)

    # Every counted operation's FLOPs are proportional to the batch, so halving the batch-of-2 count is exact.
    return {"train": _counted_flops(train_step) // 2, "inference": _counted_flops(inference) // 2}


# --------------------------------------------------------------------------- the device's peak

# Dense peak TFLOP/s per device and number format: without the 2:4 structured sparsity that doubles the
# datasheets' headline tensor-core figures ("with sparsity"), which dense training does not use.
# fp32 is the plain FP32 (CUDA core) rate; tf32, bf16 and fp16 are tensor-core rates.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: FP32 67; TF32 989, BF16 1,979, FP16 1,979 with
    # sparsity; dense 494.7 / 989.4 / 989.4 (NVIDIA H100 Tensor Core GPU Architecture whitepaper).
    "H100 SXM": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    # NVIDIA H100 datasheet, H100 PCIe: FP32 51; TF32 756, BF16 1,513, FP16 1,513 with sparsity.
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    # NVIDIA H100 datasheet, H100 NVL (one board): FP32 60; TF32 835, BF16 1,671, FP16 1,671 with sparsity.
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: FP32 67; TF32 989, BF16 1,979, FP16 1,979 with
    # sparsity (the H100 SXM's compute, with more and faster memory).
    "H200 SXM": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    # NVIDIA H200 datasheet, H200 NVL: FP32 60; TF32 835, BF16 1,671, FP16 1,671 with sparsity.
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    # NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5; TF32 156, BF16 312, FP16 312 (dense; twice that with
    # sparsity). The same for the 40GB and 80GB boards, SXM and PCIe.
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    # NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3; TF32 120, BF16 242, FP16 242 with sparsity.
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
}

# torch.cuda.get_device_name() -> the table's row; the first match wins, so the narrower names come first.
# Word boundaries keep "L4" from matching an L40 and "A100" from matching an A100X.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    (r"\bH200\b", "H200 SXM"),  # "NVIDIA H200": the only other H200
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
    (r"\bH100\b.*\b(SXM|HBM3)\b", "H100 SXM"),  # "NVIDIA H100 80GB HBM3"
    (r"\bA100\b", "A100"),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"
    (r"\bL4\b", "L4"),
)


def device_row(device_name: str) -> str | None:
    """The row of :data:`PEAK_TFLOPS` for a ``torch.cuda.get_device_name()``, or None.

    >>> device_row("NVIDIA H100 80GB HBM3"), device_row("NVIDIA A100-SXM4-40GB"), device_row("NVIDIA L40S")
    ('H100 SXM', 'A100', None)
    """
    return next((row for pattern, row in _DEVICE_PATTERNS if re.search(pattern, device_name, re.IGNORECASE)), None)


def precision_column(precision: str | int, tf32: bool) -> str | None:
    """The number format a Lightning precision computes its matrix products in, as a column of
    :data:`PEAK_TFLOPS`; None for any other (64-bit, transformer-engine, ...).

    >>> precision_column("32-true", tf32=True), precision_column("bf16-mixed", False), precision_column("64-true", True)
    ('tf32', 'bf16', None)
    """
    text = str(precision).lower()
    if text in ("32-true", "32"):
        return "tf32" if tf32 else "fp32"
    if text in ("bf16-mixed", "bf16-true", "bf16"):
        return "bf16"
    if text in ("16-mixed", "16-true", "16"):
        return "fp16"
    return None


def convolutions_use_tf32() -> bool:
    """Whether float32 convolutions run in TF32 on the tensor cores: cuDNN's switch, on by default in torch
    (``torch.backends.cudnn.allow_tf32``). It, not the matmul one (``torch.set_float32_matmul_precision``, off
    by default), decides the peak of these convolutional networks at ``32-true``: their classifier's single
    matrix product is a fraction of a percent of their FLOPs."""
    return bool(torch.backends.cudnn.allow_tf32)


def peak_tflops(device_name: str, precision: str | int, tf32: bool) -> float | None:
    """The dense peak TFLOP/s of ONE device named ``device_name`` (``torch.cuda.get_device_name()``) at a
    Lightning ``precision``; ``tf32`` says whether float32 work runs in TF32 (:func:`convolutions_use_tf32`).
    None for a device or precision the table does not hold -- a CPU, an unlisted GPU, 64-bit: no guess.

    >>> peak_tflops("NVIDIA H100 80GB HBM3", "bf16-mixed", tf32=False)
    989.4
    >>> peak_tflops("NVIDIA A100-SXM4-80GB", "32-true", tf32=True), peak_tflops("cpu", "32-true", tf32=False)
    (156.0, None)
    """
    row, column = device_row(device_name), precision_column(precision, tf32)
    if row is None or column is None:
        return None
    return PEAK_TFLOPS[row][column]


def mfu(achieved_tflops_per_second: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation: the achieved rate over the peak, a fraction (0.4 = 40 %); None when either is
    unknown or the peak is not positive.

    For a run: ``achieved = samples per second (all ranks) x model_flops_per_sample(...)["train"] / 1e12`` and
    ``peak = peak_tflops(...) x number of devices``.

    >>> mfu(395.76, 989.4), mfu(None, 989.4), mfu(100.0, None), mfu(100.0, 0.0)
    (0.4, None, None, None)
    """
    if achieved_tflops_per_second is None or peak is None or peak <= 0:
        return None
    return achieved_tflops_per_second / peak


def device_peak_tflops(device: torch.device, precision: str) -> float | None:
    """The dense peak of ONE CUDA ``device`` at a Lightning ``precision``: :data:`PEAK_TFLOPS`, else Lightning's
    ``get_available_flops`` for chips the table lacks; None elsewhere (a CPU)."""
    if device.type != "cuda":
        return None
    peak = peak_tflops(torch.cuda.get_device_name(device), precision, tf32=convolutions_use_tf32())
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(
        precision_column(precision, tf32=False) or ""
    )
    if peak is None and dtype is not None:
        from lightning.fabric.utilities.throughput import get_available_flops

        available = get_available_flops(device, dtype)
        peak = available / 1e12 if available else None
    return peak

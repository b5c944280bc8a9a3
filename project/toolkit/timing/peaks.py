"""The dense peak TFLOP/s and the peak memory bandwidth of one CUDA device, for MFU and the bandwidth share
(:mod:`.flops`); loaded by GPU runs only, since no table holds a CPU's."""

from __future__ import annotations

import re
from typing import Any

import torch
from lightning.fabric.utilities.throughput import get_available_flops

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


def device_peak_tbps(device: torch.device) -> float | None:
    """The peak memory bandwidth of ONE CUDA ``device`` in TB/s; None elsewhere (a CPU, an unlisted GPU)."""
    row = device_row(torch.cuda.get_device_name(device), PEAK_TBPS) if device.type == "cuda" else None
    return PEAK_TBPS[row] if row else None

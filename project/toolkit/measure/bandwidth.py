"""Memory traffic beside MFU: the least bytes a training step moves, over its time, against the device's peak bandwidth;
for a memory-bound network (MobileNetV2: MFU of a few percent) it, not MFU, says how far a run is from the device's."""

from __future__ import annotations

from typing import Any

import torch

from project.toolkit.measure.flops import device_row

# Peak memory bandwidth in TB/s, NVIDIA's datasheets, by the rows of flops.PEAK_TFLOPS (A100: the 80GB board's).
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

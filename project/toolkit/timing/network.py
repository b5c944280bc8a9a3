"""What a network weighs: parameters, buffers, the activations a training step keeps (the bytes the bandwidth figure
counts), and per unit, its declared blocks or else its modules two levels down (what ``python -m project plan`` splits),
counted on a ``meta`` copy."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from project.toolkit.helpers import tensor_bytes
from project.toolkit.timing.flops import FLOP_FORMULAS, meta_copy

Blocks = list[tuple[str, nn.Module]]  # a network's declared blocks, by name


def _units(net: nn.Module) -> dict[nn.Module, str]:
    # each top-level child's children, or the child itself where it has none
    units = {}
    for name, child in net.named_children():
        grandchildren = list(child.named_children())
        for sub_name, sub in grandchildren or [("", child)]:
            units[sub] = f"{name}.{sub_name}" if sub_name else name
    return units or {net: type(net).__name__}


def network_profile(
    net: nn.Module, image_size: int, channels_last: bool = True, in_channels: int = 3, blocks: Blocks | None = None
) -> dict[str, Any]:
    """Counts and bytes, and ``units``: ``[name, forward FLOPs, parameters, output bytes]`` per image, in the forward's
    order; ``blocks`` become the units."""
    # a batch of 2, halved: BatchNorm in training mode needs 2 or more values
    model = meta_copy(nn.Sequential(*[module for _, module in blocks]) if blocks else net).train()
    batch = 2
    images = torch.empty(batch, in_channels, image_size, image_size, device="meta")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    parameters = {id(p) for p in model.parameters()}
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in parameters:
            saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    units = {module: name for (name, _), module in zip(blocks, model, strict=True)} if blocks else _units(model)
    rows: list[list[Any]] = []
    counter = FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)
    start_flops: dict[nn.Module, int] = {}
    handles = []
    for module, name in units.items():

        def before(module: nn.Module, args: Any) -> None:
            start_flops[module] = counter.get_total_flops()

        def after(module: nn.Module, args: Any, output: Any, name: str = name) -> None:
            flops = counter.get_total_flops() - start_flops[module]
            count = sum(p.numel() for p in module.parameters())
            rows.append([name, flops // batch, count, tensor_bytes(output) // batch])

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    return {
        "parameters": sum(p.numel() for p in net.parameters()),
        "input_bytes_per_sample": in_channels * image_size**2 * 4,  # float32, as the loaders give the images
        "parameter_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in net.buffers()),
        "activation_bytes_per_sample": saved[0] // batch,
        "units": rows,
    }

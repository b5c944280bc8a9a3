"""What a network weighs, for ``python -m project plan`` (:mod:`project.toolkit.plan`): its parameters and
buffers, the activations a training step keeps for the backward, and the same per unit (the modules it runs
one after another), counted once per run on a copy on the ``meta`` device (no memory, no arithmetic).

The units are the network's declared blocks where it declares them (``network_blocks``, what fsdp shards
at and a pipeline balances over: :mod:`project.toolkit.strategies.blocks`), run one after the other; else its
modules two levels down where a top-level module has children (ResNet's ``layer1.0``), else the top-level
module itself, in the order the forward finishes them. Each unit records its forward FLOPs, its parameters
and the bytes of its output per sample (what a pipeline stage ending there sends to the next); the sizes of its
parameter tensors, and of those outside every unit, are kept apart (``parameter_numels``: what ddp and fsdp
reduce, gather and copy tensor by tensor, which :mod:`project.toolkit.plan.replay` replays).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from project.toolkit.measure.devices import tensor_bytes
from project.toolkit.measure.flops import _FLOP_FORMULAS, meta_copy


def _units(net: nn.Module) -> dict[nn.Module, str]:
    """The units of ``net``: each top-level child's children, or the child itself where it has none."""
    units = {}
    for name, child in net.named_children():
        grandchildren = list(child.named_children())
        for sub_name, sub in grandchildren or [("", child)]:
            units[sub] = f"{name}.{sub_name}" if sub_name else name
    return units or {net: type(net).__name__}


def _rest_numels(whole: nn.Module, units: Iterable[nn.Module]) -> list[int]:
    """The sizes of ``whole``'s parameter tensors that no unit holds (FSDP's root unit)."""
    in_units = {id(p) for unit in units for p in unit.parameters()}
    return [p.numel() for p in whole.parameters() if id(p) not in in_units]


def network_profile(
    net: nn.Module,
    image_size: int,
    channels_last: bool = True,
    in_channels: int = 3,
    blocks: list[tuple[str, nn.Module]] | None = None,
) -> dict[str, Any]:
    """``parameters`` (count), ``input_bytes_per_sample`` (one float32 image), ``parameter_bytes``,
    ``buffer_bytes``, ``activation_bytes_per_sample`` (the tensors one training forward saves for its
    backward, per image, parameters left out) and ``units``
    (``[name, forward FLOPs, parameters, output bytes]`` per image, in the forward's order),
    ``parameter_numels`` (``units``: each unit's parameter tensors' sizes, in the units' order; ``rest``: those
    of the tensors outside every unit); ``blocks``: the network's declared blocks, which are then the units.

    >>> profile = network_profile(nn.Sequential(nn.Flatten(), nn.Linear(12, 5)), image_size=2)
    >>> profile["parameters"], profile["parameter_bytes"], profile["units"], profile["parameter_numels"]
    (65, 260, [['0', 0, 0, 48], ['1', 120, 65, 20]], {'units': [[], [60, 5]], 'rest': []})
    """
    # One copy of the network, or of its blocks, on the meta device. BatchNorm in training mode needs 2 or
    # more values: a batch of 2, halved.
    model = meta_copy(nn.ModuleList([module for _, module in blocks]) if blocks else net).train()
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
    numels: list[list[int]] = []
    counter = FlopCounterMode(display=False, custom_mapping=_FLOP_FORMULAS)
    start_flops: dict[nn.Module, int] = {}
    handles = []
    for module, name in units.items():

        def before(module: nn.Module, args: Any) -> None:
            start_flops[module] = counter.get_total_flops()

        def after(module: nn.Module, args: Any, output: Any, name: str = name) -> None:
            flops = counter.get_total_flops() - start_flops[module]
            params = sum(p.numel() for p in module.parameters())
            rows.append([name, flops // batch, params, tensor_bytes(output) // batch])
            numels.append([p.numel() for p in module.parameters()])

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            if blocks:
                for block in model:
                    images = block(images)
            else:
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
        "parameter_numels": {
            "units": numels,
            "rest": _rest_numels(net, [m for _, m in blocks]) if blocks else _rest_numels(model, units),
        },
    }

"""Pretrained weights for a network built already (``--model.weights``): torchvision's by name, or a state-dict file,
fitted to the network's classifier size and input channels. Anything that does not fit is one error line."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn

from project.toolkit.errors import ProjectError
from project.toolkit.safe_load import read_checkpoint

LOCAL_FORM = "--model.weights=path/to/state_dict.pt"


def load_weights(net: nn.Module, weights: str, arch: str, head: str | None) -> None:
    """Load ``weights`` into ``net``, built as ``arch`` (a torchvision name or ``package.module.name``): a torchvision
    weight name of ``arch`` (``DEFAULT``, ...) or a state-dict file (or a Lightning checkpoint, its network in ``net``).
    A classifier ``head`` of another size (ImageNet's 1000 classes) stays freshly initialised, 3-channel weights of the
    first convolution are summed for a 1-channel ``net``; the rest must fit exactly, else an error names the keys."""
    state, own = _weights_state(weights, arch), net.state_dict()
    fresh = {f"{head}.weight", f"{head}.bias"} if head else set()
    conv = next((f"{name}.weight" for name, m in net.named_modules() if isinstance(m, nn.Conv2d)), None)
    for key, value in list(state.items()):
        if key not in own or value.shape == own[key].shape:
            continue
        if key in fresh:
            state[key] = own[key]
        elif key == conv and value.dim() == 4 and (value.shape[1], own[key].shape[1]) == (3, 1):
            state[key] = value.sum(dim=1, keepdim=True)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    reshaped = [k for k in own if k in state and state[k].shape != own[k].shape]
    shapes = [f"{k} {tuple(state[k].shape)}, here {tuple(own[k].shape)}" for k in reshaped]
    if missing or unexpected or shapes:
        found = [f"{what}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}" for what, keys in
                 (("missing", missing), ("unexpected", unexpected), ("other shape", shapes)) if keys]  # fmt: skip
        raise ProjectError(
            f"model.weights={weights} does not fit model.arch={arch} ({'; '.join(found)}); pass the state dict of "
            "the same arch (torch.save(net.state_dict(), path))"
        )
    net.load_state_dict(state, strict=True)


def _weights_state(weights: str, arch: str) -> dict[str, torch.Tensor]:
    """The state dict ``weights`` names: torchvision's weights of ``arch``, or a state-dict file's."""
    names = [] if "." in arch else ["DEFAULT", *(w.name for w in torchvision.models.get_model_weights(arch))]
    if weights in names:
        return _torchvision_state(weights, arch)
    path = Path(weights).expanduser()
    if not path.is_file() and names:
        raise ProjectError(
            f"model.weights={weights} is neither a file nor a weight name of {arch}: use one of {', '.join(names)}, "
            f"or a state-dict file ({LOCAL_FORM})"
        )
    if not path.is_file():
        raise ProjectError(
            f"model.weights={weights} is not a file; model.arch={arch} takes a state-dict file only ({LOCAL_FORM}): "
            "weight names such as DEFAULT are for torchvision's archs"
        )
    try:
        state = read_checkpoint(path, "model.weights", mmap=False)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
        raise ProjectError(f"model.weights={weights} is not a readable state-dict file ({_first_line(err)})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # a Lightning checkpoint
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ProjectError(
            f"model.weights={weights} holds no state dict; save one with torch.save(net.state_dict(), path)"
        )
    if any(key.startswith("net.") for key in state):  # the LightningModule's keys: its network is `net`
        state = {key.removeprefix("net."): v for key, v in state.items() if key.startswith("net.")}
    return state


def weights_preprocessing(weights: str | None, arch: str | None) -> dict[str, Any] | None:
    """The data options torchvision's weights ``weights`` of ``arch`` expect, from ``weights.transforms()`` (no
    download): ``image_size`` (its crop), ``resize_size``, ``mean``, ``std``, ``interpolation``; None for a file."""
    try:
        enum = torchvision.models.get_model_weights(arch) if weights and arch and "." not in arch else None
    except ValueError:  # not a torchvision arch: build_network says so
        return None
    if enum is None or weights not in enum.__members__:
        return None
    preset = enum[weights].transforms()
    sizes = {"image_size": preset.crop_size[0], "resize_size": preset.resize_size[0]}
    return {**sizes, "mean": list(preset.mean), "std": list(preset.std), "interpolation": preset.interpolation.value}


def _torchvision_state(name: str, arch: str) -> dict[str, torch.Tensor]:
    """torchvision's weights ``name`` of ``arch``: from torch.hub's cache (``<torch.hub.get_dir()>/checkpoints``, looked
    at first, so a file put there works offline), else downloaded into it."""
    weights = torchvision.models.get_model_weights(arch)[name]
    try:  # torchvision's own loading: some weights have their keys renamed on the way (densenet)
        return torchvision.models.get_model(arch, weights=weights).state_dict()
    except (OSError, RuntimeError) as err:  # no network (URLError is an OSError), a refused or corrupted download
        cache = Path(torch.hub.get_dir()) / "checkpoints"
        raise ProjectError(
            f"model.weights={name} of {arch} must be downloaded from {weights.url} into {cache}, and that failed "
            f"({_first_line(getattr(err, 'reason', err))}); put that file there yourself, or pass a state-dict file: "
            f"{LOCAL_FORM}"
        ) from None


def _first_line(err: object) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]

"""``python -m project export --ckpt_path=best --format=onnx|pt2 --out FILE``: a checkpoint as one graph taking uint8
images ``(N, C, H, W)``, 0-255, of any size and returning the logits ``(N, classes)``. What evaluation and predict do
to an image is inside it (shorter side resized to ``resize_size``, centre crop of ``image_size``, scaling,
normalisation, the data's interpolation), so the graph runs without this project (docs/export.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

from project.toolkit.callbacks.checkpoints import check_checkpoint_file, find_checkpoint
from project.toolkit.dotted import import_object
from project.toolkit.errors import OneLineParser, ProjectError, exit_on_project_error
from project.toolkit.strategies.deepspeed import check_deepspeed_checkpoint

STATE_KEYS = {"mean", "std", "label_names"}  # the data module's entry in a checkpoint (its state_dict)
EXPORT_HELP = "A checkpoint as one graph: uint8 images (N, C, H, W), 0-255, of any size in; the logits out."


class Normalised(nn.Module):
    """``model`` after what predict does to an image: uint8 images of any size, shorter side resized to ``resize``
    (None: ``size``) and centre-cropped to ``size``, then scaled and normalised (``to_model_input``)."""

    def __init__(
        self,
        model: nn.Module,
        mean: list[float],
        std: list[float],
        size: int,
        resize: int | None = None,
        mode: str = "bilinear",
    ) -> None:
        super().__init__()
        self.model, self.size, self.resize, self.mode = model, size, resize or size, mode
        self.register_buffer("scale", torch.tensor([1 / (255 * s) for s in std]).view(1, -1, 1, 1))
        self.register_buffer("shift", torch.tensor([-m / s for m, s in zip(mean, std, strict=True)]).view(1, -1, 1, 1))
        self.register_buffer("square", torch.arange(size), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(self.cropped(images) * self.scale + self.shift)

    def cropped(self, images: torch.Tensor) -> torch.Tensor:
        """``center_crop(resize(images, resize, antialias=True), [size, size])`` as torchvision does it to uint8 images
        (values rounded back to 0-255 integers), with integer arithmetic on the sizes: no branch, any size."""
        height, width = images.shape[-2:]
        short = torch.sym_min(height, width)  # becomes resize; the longer side int(resize * long / short)
        sides = (self.resize * height // short, self.resize * width // short)
        resized = nn.functional.interpolate(images.float(), sides, mode=self.mode, antialias=True, align_corners=False)
        resized = resized.round().clamp(0, 255)
        top, left = (centre_offset(side - self.size) for side in sides)
        # index_select, not a slice: export would pin a slice's strides (the resized size) to the example's
        return resized.index_select(2, self.square + top).index_select(3, self.square + left)


def centre_offset(excess: int) -> int:
    """``round(excess / 2)`` as torchvision's centre crop takes it (half to even), in integer operations."""
    return (excess + excess // 2 % 2) // 2


def export(ckpt_path: str, fmt: str, out: Path, logs: Path, model: str = "", trusted: bool = False) -> str:
    """Write checkpoint ``ckpt_path`` (``last``, ``best`` of the newest run under ``logs``, or a file) to ``out`` as
    ``fmt`` (``onnx``, ``pt2``); ``model``: the LightningModule class if the checkpoint names none; ``trusted``: read
    the file whole, code included (else plain data only). Returns a line."""
    folder = out.absolute().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ProjectError(f"--out {out}: cannot write into {folder}; give a file in a folder you can write to")
    if fmt == "onnx" and not all(importlib.util.find_spec(name) for name in ("onnx", "onnxscript")):
        raise ProjectError("--format=onnx needs the onnx and onnxscript packages: pip install -e '.[export]'")
    path = find_checkpoint(ckpt_path, logs, trusted=trusted) if ckpt_path in ("last", "best") else ckpt_path
    check_deepspeed_checkpoint(path, strategy=None)
    checkpoint = check_checkpoint_file(path, trusted) or {}
    state = next((v for v in checkpoint.values() if isinstance(v, dict) and STATE_KEYS <= v.keys()), {})
    data = checkpoint.get("datamodule_hyper_parameters", {})
    size = data.get("image_size")
    if None in (state.get("mean"), state.get("std"), size):
        raise ProjectError(
            f"--ckpt_path={path} records no mean/std and image_size of its data, which the graph builds in; "
            "export a single-file checkpoint of a fit by this version of the project"
        )
    class_path = checkpoint.get("hyper_parameters", {}).get("_class_path") or model
    module = import_object(class_path).load_from_checkpoint(path, map_location="cpu", weights_only=not trusted)
    net = module.float().to(memory_format=torch.contiguous_format)  # channels_last weights: pt2's saver warns
    resizing = data.get("resize_size"), data.get("interpolation") or "bilinear"
    graph = Normalised(net, state["mean"], state["std"], size, *resizing).eval()
    example = torch.zeros(2, len(state["mean"]), size, size, dtype=torch.uint8)
    dims = {0: torch.export.Dim("batch"), 2: torch.export.Dim("height"), 3: torch.export.Dim("width")}
    program = torch.export.export(graph, (example,), dynamic_shapes={"images": dims})
    names = json.dumps(state["label_names"])
    if fmt == "pt2":
        torch.export.save(program, out, extra_files={"label_names.json": names})
    else:
        onnx_program = torch.onnx.export(program, dynamo=True, output_names=["logits"], verbose=False)
        onnx_program.model.metadata_props["label_names"] = names
        onnx_program.save(out)
    shape, classes = f"(N, {len(state['mean'])}, H, W)", len(state["label_names"])
    return f"exported {path} to {out} ({fmt}): uint8 images {shape}, 0-255, cropped to {size} -> logits (N, {classes})"


def main(argv: list[str] | None = None, model: str = "") -> None:
    """Entry point of ``python -m project export``; ``argv`` replaces ``sys.argv[2:]``; ``model`` as :func:`export`."""
    parser = OneLineParser(prog="python -m project export", description=EXPORT_HELP)
    add = parser.add_argument
    add("--ckpt_path", default="best", help="last, best (of the newest run under --logs; the default) or a file")
    add("--format", choices=("onnx", "pt2"), required=True, help="onnx (onnxruntime and others) or pt2 (torch.export)")
    add("--out", type=Path, required=True, help="the file to write")
    add("--logs", type=Path, default=Path("lightning_logs"), help="the runs' folder (default lightning_logs)")
    add("--weights_only", choices=("true", "false"), default="true", help="false: a trusted file, read whole")
    args = parser.parse_args(sys.argv[2:] if argv is None else argv)
    with exit_on_project_error():
        trusted = args.weights_only == "false"
        print(export(args.ckpt_path, args.format, args.out, args.logs, model, trusted), flush=True)

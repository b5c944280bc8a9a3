"""Checkpoint and weights files read as data. torch's ``weights_only`` load builds tensors and plain containers and
refuses, before it runs, anything else a pickle names (a function it would call, a class it would build); a file that
holds such a thing is refused in one line. In a file the user trusts (Lightning's ``--weights_only=false``), what it
names is allowed by name, and its code runs."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from project.toolkit.compat import SHARDED_METADATA_GLOBALS
from project.toolkit.dotted import import_object
from project.toolkit.errors import ProjectError


def refusal(option: str, path: str | Path, held: str, trusted: bool = False) -> ProjectError:
    """The one line that refuses ``path``, given as ``option``, for holding ``held``; a checkpoint can be trusted."""
    why = "torch refuses even in a trusted file" if trusted else "a safe load refuses (loading it could run code)"
    trust = ", or, if you trust the file, --weights_only=false reads it whole (its code runs)"
    return ProjectError(
        f"{option}={path} holds {held}, which {why}; re-save it as plain data (torch.save(net.state_dict(), path) "
        f"for weights){trust if option == '--ckpt_path' and not trusted else ''}"
    )


def read_checkpoint(path: str | Path, option: str, trusted: bool = False, mmap: bool = True) -> Any:
    """``torch.load`` of ``path`` onto the CPU, plain data only, unless ``trusted``: then what the file names is
    allowed by name first (LightningCLI reads a checkpoint's hyperparameters with ``weights_only=True`` whatever is
    said). Anything refused is one line naming ``option``, the file and what it holds; an unreadable torch file
    raises as torch says."""
    held = unsafe_globals(path) if trusted else None  # before they are allowed: then they no longer count as unsafe
    if held:
        torch.serialization.add_safe_globals([import_object(name) for name in held])
    try:
        return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except pickle.UnpicklingError:
        held = unsafe_globals(path) if held is None else held  # read again only where a load failed
        if not held:
            raise
        raise refusal(option, path, ", ".join(held), trusted) from None


def unsafe_globals(path: str | Path) -> list[str]:
    """What the pickle of ``path`` names beyond torch's safe types; none for a file not in torch's zip format."""
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip-format torch file: torch.load says what it is
        return []


class ShardedMetadataUnpickler(pickle.Unpickler):
    """Reads a sharded checkpoint's ``.metadata`` (a plain pickle, which torch.distributed.checkpoint loads with
    ``pickle.load``), refusing anything but the checkpoint's own bookkeeping types."""

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if dtype or (module, name) in SHARDED_METADATA_GLOBALS or module == "torch.distributed.checkpoint.metadata":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def check_sharded_metadata(folder: Path, option: str) -> None:
    """Refuse, in one line, a sharded checkpoint ``folder`` whose ``.metadata`` holds more than bookkeeping."""
    try:
        with open(folder / ".metadata", "rb") as file:
            ShardedMetadataUnpickler(file).load()
    except pickle.UnpicklingError as err:
        raise refusal(option, folder, f"{err} in its .metadata") from None
    except (OSError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise ProjectError(f"{option}={folder}: its .metadata is unreadable ({type(err).__name__})") from None

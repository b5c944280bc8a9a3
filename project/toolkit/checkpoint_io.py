"""Checkpoint files written atomically, so no reader or crash ever sees half of one, and a full disk said in one line.
Lightning's own save writes its temporary file in the system's temp folder and moves it into place: where that folder
lies on another file system (a tmpfs /tmp, a container's, a cluster's scratch), the move copies over the old file, and
a copy cut short leaves it half-written (https://github.com/Lightning-AI/pytorch-lightning/issues/19970)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from project.toolkit.errors import ProjectError
from project.toolkit.helpers import human_bytes, is_remote, joined, tensor_bytes

# torch's file writer reports a short write (a full disk) as a RuntimeError of its own, not as the OSError.
WRITER_FAILURES = ("inline_container", "PytorchStreamWriter", "file write failed")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write under a temporary name beside the file, then rename it into place: a crash mid-write leaves the previous
    file intact."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if is_remote(path):  # s3://, memory://: Lightning's own save, through fsspec (a file:// URL: its local path)
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        path = joined(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            torch.save(checkpoint, partial)
            os.replace(partial, path)
        except (OSError, RuntimeError) as err:
            if isinstance(err, RuntimeError) and not any(text in str(err) for text in WRITER_FAILURES):
                raise
            raise ProjectError(_write_failure(checkpoint, path, err)) from None
        finally:
            partial.unlink(missing_ok=True)


def _write_failure(checkpoint: dict[str, Any], path: Path, err: BaseException) -> str:
    reason = err.strerror if isinstance(err, OSError) and err.strerror else "the write failed part-way"
    try:
        free = f", {human_bytes(shutil.disk_usage(path.parent).free)} free there"
    except OSError:
        free = ""
    kept = f"; the previous {path.name} is intact" if path.exists() else ""
    if not kept and path.with_name("last.ckpt").exists():
        kept = "; last.ckpt is intact"
    return (
        f"could not save the checkpoint {path.name} into {path.parent} ({reason}): it needs about "
        f"{human_bytes(tensor_bytes(checkpoint))}{free}{kept}. Free some space there, then "
        "resume with the same command and --ckpt_path=last"
    )

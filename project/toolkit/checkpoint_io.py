"""How a checkpoint file is written: atomically, so no reader or crash ever sees half of one. Used by
the checkpoint callbacks and by DeepSpeed's consolidation alike."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from project.toolkit.errors import ProjectError
from project.toolkit.measure.devices import tensor_bytes
from project.toolkit.measure.tables import human_bytes

# What torch's file writer says when a write fails part-way (a full disk, a file size limit): it reports
# the short write as a RuntimeError of its own, not as the OSError underneath.
WRITER_FAILURES = ("inline_container", "PytorchStreamWriter", "file write failed")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a checkpoint next to its target under a temporary name, flush it to disk, then rename
    it into place: a crash (``kill -9``, power loss, full disk) mid-write leaves the previous
    ``last.ckpt`` intact instead of a truncated one. The rename is atomic on POSIX file systems.
    A write that fails (a full disk, a read-only or lost file system) is one :class:`ProjectError`
    naming the folder, the bytes the checkpoint needs and those free there."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        except (OSError, RuntimeError) as err:
            if isinstance(err, RuntimeError) and not any(text in str(err) for text in WRITER_FAILURES):
                raise
            raise ProjectError(_write_failure(checkpoint, path, err)) from None
        finally:
            partial.unlink(missing_ok=True)


def _write_failure(checkpoint: dict[str, Any], path: Path, err: BaseException) -> str:
    """The one line for a checkpoint that could not be written: where, why, how much it needs."""
    reason = err.strerror if isinstance(err, OSError) and err.strerror else "the write failed part-way"
    try:
        free = f", {human_bytes(shutil.disk_usage(path.parent).free)} free there"
    except OSError:
        free = ""
    last = path.with_name("last.ckpt")
    kept = (
        f"; the previous {path.name} is intact"
        if path.exists()
        else f"; {last.name} is intact"
        if last.exists()
        else ""
    )
    return (
        f"could not save the checkpoint {path.name} into {path.parent} ({reason}): it needs about "
        f"{human_bytes(tensor_bytes(checkpoint))}{free}{kept}. Free some space there, then "
        "resume with the same command and --ckpt_path=last"
    )

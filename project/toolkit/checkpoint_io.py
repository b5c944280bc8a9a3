"""How a checkpoint file is written: atomically, so no reader or crash ever sees half of one. Used by
the checkpoint callbacks and by DeepSpeed's consolidation alike."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a checkpoint next to its target under a temporary name, flush it to disk, then rename
    it into place: a crash (``kill -9``, power loss, full disk) mid-write leaves the previous
    ``last.ckpt`` intact instead of a truncated one. The rename is atomic on POSIX file systems."""

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
        finally:
            partial.unlink(missing_ok=True)

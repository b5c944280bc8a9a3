"""The default callback that keeps a CPU run's freed host memory for reuse (:mod:`project.toolkit.host_memory`)."""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.accelerators import CPUAccelerator

from project.toolkit.host_memory import DEFAULT_TRIM_THRESHOLD_MB, keep_freed_host_memory


class HostMemoryReuse(Callback):
    """On a CPU run, glibc's allocator keeps freed memory for the next tensor instead of giving it back to the kernel
    and faulting it in again (faster steps; the peak stays held to the end); accelerator runs are left alone.

    Args:
        trim_threshold_mb: Free memory (MiB) the process keeps before giving some back to the kernel.
    """

    def __init__(self, trim_threshold_mb: int = DEFAULT_TRIM_THRESHOLD_MB) -> None:
        if trim_threshold_mb < 0:
            raise ValueError(f"host_memory_reuse.trim_threshold_mb={trim_threshold_mb}: use 0 or more (MiB)")
        self.trim_threshold_mb = trim_threshold_mb

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Before the first step, in every process of the run (each one calls setup).
        if isinstance(trainer.accelerator, CPUAccelerator):
            keep_freed_host_memory(self.trim_threshold_mb)

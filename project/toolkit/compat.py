"""Every private name of a library the template uses, for what no public API does; tests/unit/test_compat.py pins
them."""

from __future__ import annotations

import atexit
import threading
from typing import Any


def restart_training_batches(trainer: Any) -> None:
    """Make the fit loop draw its batches afresh from the training loader, whose sampler was just moved (to a
    mid-epoch resume's position): Lightning made the loader's iterator before the checkpoint set the epoch."""
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is not None:  # None before the loop has set it up: it then starts afresh anyway
        iter(fetcher)


def shard_over_every_process(strategy: Any) -> None:
    """Make a ModelParallelStrategy shard over every process (plain FSDP): its ``data_parallel_size="auto"`` means
    the node count, and the process count is known only once Lightning has set the strategy up."""
    strategy._data_parallel_size = strategy.num_nodes * strategy.num_processes


def shut_down_threads() -> None:
    """Python's first shutdown step: threading's exit callbacks (stopping idle pool workers), then the thread joins."""
    threading._shutdown()


def run_exit_handlers() -> None:
    """The handlers registered with :mod:`atexit`, run now, while the interpreter is fully alive."""
    atexit._run_exitfuncs()


# What a sharded checkpoint's .metadata names beside torch.distributed.checkpoint.metadata's types and torch's dtypes.
SHARDED_METADATA_GLOBALS = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size")}
SHARDED_METADATA_GLOBALS |= {("torch.serialization", "_get_layout"), ("pathlib", "PosixPath")}

"""Every private Lightning name the template uses, in one place.

Lightning offers no public way to do these few things. Each use is wrapped here, and
``tests/test_compat.py`` checks every name against the installed Lightning, so a rename fails that
test loudly instead of silently turning a feature off (exact resume, the lost-rank watchdog, ...).
Where a public API exists, the template uses it instead.
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.accelerators import _AcceleratorRegistry
from lightning.fabric.accelerators.xla import _XLA_AVAILABLE
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.overrides.distributed import _IndexBatchSamplerWrapper
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

# The text of Lightning's model summary from its columns: the template's summary leaves out the FLOPs
# column when it holds only zeros (project/toolkit/callbacks/quiet.py); ModelSummary.summarize has no option.
format_model_summary = _format_summary_table

# The registries' types, for the ``register_strategies``/``register_accelerators`` class methods.
StrategyRegistryType = _StrategyRegistry
AcceleratorRegistryType = _AcceleratorRegistry


def xla_available() -> bool:
    """Whether torch_xla can be imported (Lightning's own check). A function, not a constant: the check
    imports torch_xla where it is installed, which must wait until ``xla_cpu`` has set ``PJRT_DEVICE``
    and must not slow down the start of every other run."""
    return bool(_XLA_AVAILABLE)


# LightningCLI methods the template's CLI overrides (project/toolkit/cli.py): no public hook runs a
# subcommand inside a try block.
CLI_OVERRIDES = ("_run_subcommand",)


def advance_rich_bar(bar: RichProgressBar, task: Any, completed: int) -> None:
    """Set the count of ``bar``'s ``task`` to ``completed``, leaving the values beside it as they are
    (project/toolkit/callbacks/progress.py): RichProgressBar's own method for it."""
    bar._update(task, completed)


def seen_batch_indices(loader: object) -> list[list[int]] | None:
    """The data-set indices of each batch a DataLoader has given in ``predict``, as Lightning records them
    (it wraps a predicting DataLoader's batch sampler to do so); None for a loader it has not wrapped."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return batch_sampler.seen_batch_indices if isinstance(batch_sampler, _IndexBatchSamplerWrapper) else None


def loggers_write_this_step(trainer: Trainer) -> bool:
    """True on the training steps whose logged values Lightning passes to the loggers (every
    ``log_every_n_steps``): the same test Lightning's own LearningRateMonitor makes."""
    return trainer._logger_connector.should_update_logs or bool(trainer.fast_dev_run)


def lightning_log_step(trainer: Trainer) -> int:
    """The step Lightning writes ``self.log`` values at: the count of training batches that stepped
    the optimizer (the global step in a fit; 0 in a fresh test or predict process). Lightning logs a
    training epoch's own metrics (``train/acc``, ``val/acc``) at this count minus one, the epoch's
    last step."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def drop_placeholder_hp_metric(logger: object) -> None:
    """Stop a TensorBoardLogger from writing its placeholder ``hp_metric=-1`` (with the hparams
    summary) when Lightning logs the hyperparameters at the start of a run; the run's hparams are
    written with real metrics at the end of fit instead (:mod:`project.toolkit.callbacks.views`). The
    logger's ``default_hp_metric`` argument does the same, but Lightning builds the default logger
    itself and a user may configure their own."""
    if isinstance(logger, TensorBoardLogger):
        logger._default_hp_metric = False


def is_subprocess_script_launcher(launcher: object) -> bool:
    """Whether the processes of this run were started by Lightning from this one (``--trainer.devices=N``
    without torchrun/SLURM), so that it holds their ``procs``."""
    return isinstance(launcher, _SubprocessScriptLauncher)


def restart_training_batches(trainer: Trainer) -> None:
    """Make the fit loop draw its batches afresh from the training loader (whose sampler was just
    moved, e.g. to the position of a mid-epoch resume)."""
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is not None:  # None before the loop has set it up: it then starts afresh anyway
        iter(fetcher)


def last_global_step_saved(checkpoint: ModelCheckpoint) -> int:
    """The global step of ``checkpoint``'s latest save (``last.ckpt`` or a top-k file)."""
    return checkpoint._last_global_step_saved


def release_fsdp_name() -> None:
    """Take ``fsdp`` out of the names Lightning ties to its own FSDPStrategy, which it refuses off
    CUDA by looking the name up there; the template registers ``fsdp`` for its FSDP2 strategy,
    which runs on CPUs too. FSDPStrategy keeps its other names (``fsdp_cpu_offload``)."""
    names: list[Any] = FSDPStrategy._registered_strategies
    if "fsdp" in names:
        names.remove("fsdp")

"""Trainer and callback settings the CLI derives from the ones a user gave, before the Trainer is built.

- A default callback that a Trainer flag already switches off (``--trainer.enable_checkpointing=false``,
  ``enable_progress_bar``) is left out: the Trainer refuses a callback of a kind it was told not to use.
  Switching the checkpoint callback off (``--callbacks.checkpoint=false``) turns its flag off in turn, else
  the Trainer would add its own; switching off the progress bar gives Lightning's own.
- ``fast_dev_run`` runs without the ModelCheckpoint: Lightning's rule is that it saves nothing, yet
  its ModelCheckpoint wrote ``last.ckpt`` at the end (into the working directory).
- ``--data.val_size=0`` (train on every image): no validation loop, and checkpoints keep
  ``last.ckpt`` only, as there is no ``val/acc`` to rank them by (``--ckpt_path=best`` then takes it).
- cuDNN autotuning (``--trainer.benchmark``) is on unless the run is deterministic.
- ``predict`` returns no predictions to the command line, which has no use for them (``predictions.csv``
  holds them): ``--return_predictions`` is false unless given. Returning them, Lightning would copy each
  batch's to the CPU as it comes (on a GPU, a wait for the device at every batch) and keep them all.
"""

from __future__ import annotations

from typing import Any

from project.toolkit.cli.run_dirs import setting
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger

log = get_logger(__name__)

# Trainer flags that switch a kind of callback off, and the default callback of that kind.
TRAINER_SWITCHES = {
    "enable_checkpointing": "checkpoint",
    "enable_progress_bar": "progress_bar",
}


def callbacks_switched_off(config: Any, names: list[str]) -> set[str]:
    """The default callbacks (of ``names``) this run leaves out; sets the matching Trainer flags off."""
    trainer = config.trainer
    off = {name for name in names if not config.callbacks[name]}
    if trainer.get("fast_dev_run"):
        off.add("checkpoint")  # Lightning's rule is no checkpoints, yet its ModelCheckpoint wrote last.ckpt
    for flag, name in TRAINER_SWITCHES.items():
        if trainer.get(flag) is False:
            off.add(name)
    if "checkpoint" in off:
        trainer.enable_checkpointing = False  # else the Trainer adds a ModelCheckpoint of its own
    return off


def derive_settings(subcommand: str, config: Any) -> None:
    """Settings that follow from others (see the module's docstring), written into ``config``."""
    trainer = config.trainer
    if trainer.get("benchmark") is None:
        # cuDNN's autotuner picks the fastest convolution kernels for the (fixed) input shape; it
        # may pick differently from run to run, so a deterministic run leaves it off. No effect on CPU.
        trainer.benchmark = not trainer.get("deterministic")
    if setting(config.as_dict(), "data.val_size") == 0:  # also inside data.init_args (--data=Class)
        if subcommand == "validate":
            raise ProjectError("data.val_size=0 holds out no images, so there is nothing to validate; use test")
        trainer.limit_val_batches = 0
        trainer.num_sanity_val_steps = 0
        checkpoint = config.get("checkpoint")
        if checkpoint is not None and str(checkpoint.get("monitor") or "").startswith("val/"):
            checkpoint.monitor = None  # nothing to rank by: last.ckpt only
            checkpoint.save_top_k = 0
        if subcommand == "fit":
            log.info("data.val_size=0: training on every image, no validation; checkpoints keep last.ckpt only")
    if subcommand == "predict" and config.get("return_predictions") is None:
        config.return_predictions = False

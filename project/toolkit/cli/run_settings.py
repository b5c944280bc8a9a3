"""Trainer and callback settings derived from the ones given, before the Trainer is built: a default callback a
Trainer flag switches off is left out (and ``--callbacks.checkpoint=false`` turns its flag off); ``fast_dev_run``
saves no checkpoint; ``--data.val_size=0`` means no validation and ``last.ckpt`` only; cuDNN autotuning unless
deterministic; ``predict`` returns no predictions (``predictions.csv`` holds them) unless ``--return_predictions``.
"""

from __future__ import annotations

from typing import Any

from project.toolkit.cli.run_dirs import setting
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger

log = get_logger(__name__)

# Trainer flags that switch a kind of callback off, and the default callback of that kind.
TRAINER_SWITCHES = {"enable_checkpointing": "checkpoint", "enable_progress_bar": "progress_bar"}


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
    """Settings that follow from others, written into ``config``."""
    trainer = config.trainer
    if trainer.get("benchmark") is None:  # cuDNN's autotuner may pick other kernels from run to run
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

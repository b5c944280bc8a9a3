"""Where a run writes: one run folder per command, under ``<trainer.default_root_dir>/lightning_logs``,
also without a logger, and test/validate/predict of a fit's checkpoint inside that fit's folder.

- ``--trainer.logger=false``: Lightning would write ``config.yaml`` and ``checkpoints/`` straight into
  ``default_root_dir`` (the current directory, often the source tree), and each further run would add
  ``last-v1.ckpt``, ``last-v2.ckpt``, ... beside the first. Here such a run gets the next
  ``version_N`` folder, exactly where the default logger would have put it, so ``--ckpt_path=last``
  finds it and nothing lands in the working directory.
- ``test``/``validate``/``predict`` with a checkpoint from ``.../version_N/checkpoints/``, run with the
  fit's setup (:data:`SAME_SETUP`: else ``timing.json`` would describe two setups as one), write into
  ``version_N`` (TensorBoard events beside the fit's, ``timing.json`` keys merged into the fit's,
  ``predictions.csv``), their config as ``config-<subcommand>.yaml``: in TensorBoard and on disk the
  evaluation sits with the training it evaluates, not in an unrelated ``version_N+1``; and its
  ModelCheckpoint, restored from the fit's checkpoint, finds the folder it was saved in (elsewhere
  Lightning warns, on every evaluation, that the folder has changed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

DEFAULT_LOGGER_NAME = "lightning_logs"  # Lightning's default logger's folder
TENSORBOARD_LOGGER = "lightning.pytorch.loggers.TensorBoardLogger"  # Lightning's default logger


def runs_root(trainer_config: Any) -> Path:
    """The folder holding the ``version_N`` run folders: the logger's ``save_dir/name`` when a logger
    is configured with them, else Lightning's default ``<default_root_dir>/lightning_logs``."""
    root = Path(trainer_config.get("default_root_dir") or os.getcwd())
    init_args = getattr(trainer_config.get("logger"), "init_args", None)
    if init_args is None:
        return root / DEFAULT_LOGGER_NAME
    name = init_args.get("name", DEFAULT_LOGGER_NAME)
    return Path(init_args.get("save_dir") or root) / (name or "")


def next_version(root: Path) -> int:
    """One more than the highest ``version_N`` under ``root`` (0 if none): the default logger's rule."""
    numbers = [int(p.name[8:]) for p in root.glob("version_*") if p.name[8:].isdigit()]
    return max(numbers, default=-1) + 1


def run_folder_of(checkpoint: Any) -> Path | None:
    """``.../version_N`` for a checkpoint at ``.../version_N/checkpoints/<file>``; None for any other path."""
    if not isinstance(checkpoint, (str, Path)):
        return None
    folder = Path(checkpoint).absolute().parent.parent
    if Path(checkpoint).absolute().parent.name != "checkpoints" or not folder.name.startswith("version_"):
        return None
    return folder if folder.name[8:].isdigit() else None


# The options that make an evaluation's timing comparable with its fit's: the run description that
# timing.json holds once for both (the arch comes from the checkpoint).
SAME_SETUP = (
    "trainer.accelerator",
    "trainer.strategy",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.precision",
    "data.init_args.image_size",  # --data chooses the class: its options sit in init_args
    "data.init_args.batch_size",
)


def same_setup(fit_run: Path, config: Any) -> bool:
    """Whether ``config`` sets the :data:`SAME_SETUP` options as the fit of ``fit_run`` did (its
    ``config.yaml``; False without one)."""
    saved = fit_run / "config.yaml"
    if not saved.is_file():
        return False
    fit_config = yaml.safe_load(saved.read_text()) or {}
    for key in SAME_SETUP:
        value, fit_value = config.get(key), fit_config
        for part in key.split("."):
            fit_value = fit_value.get(part) if isinstance(fit_value, dict) else None
        if (value.as_dict() if isinstance(value, Namespace) else value) != fit_value:
            return False
    return True


def arrange_run_folder(subcommand: str, config: Any) -> str | None:
    """Point the run's outputs at its run folder (see the module's docstring) by editing the parsed
    ``config`` of ``subcommand`` before the Trainer is built; return the file name its config is to be
    saved under when that is not ``config.yaml`` (an evaluation writing into a fit's folder).

    Every process of a multi-process run computes this; what Lightning writes from it (config,
    checkpoints, ``timing.json``) rank 0 alone writes, with the folder it broadcasts."""
    trainer = config.trainer
    logger = trainer.get("logger")
    fit_run = run_folder_of(config.get("ckpt_path")) if subcommand != "fit" else None
    if fit_run is not None and not same_setup(fit_run, config):
        fit_run = None
    if logger is False:
        if fit_run is None:
            root = runs_root(trainer)
            fit_run = root / f"version_{next_version(root)}"
            trainer.default_root_dir = str(fit_run)
            return None
        trainer.default_root_dir = str(fit_run)
    elif logger in (None, True) and fit_run is not None:
        trainer.logger = Namespace(
            class_path=TENSORBOARD_LOGGER,
            init_args=Namespace(save_dir=str(fit_run.parent.parent), name=fit_run.parent.name, version=fit_run.name),
        )
    else:
        return None
    return f"config-{subcommand}.yaml"

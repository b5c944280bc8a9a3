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

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from project.toolkit.dotted import section_args

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
    "data.image_size",  # setting() looks inside init_args where --data chose the class
    "data.batch_size",
)


def same_setup(fit_run: Path, config: Any) -> bool:
    """Whether ``config`` sets the :data:`SAME_SETUP` options as the fit of ``fit_run`` did (its
    ``config.yaml``; False without one)."""
    saved = fit_run / "config.yaml"
    if not saved.is_file():
        return False
    fit_config = yaml.safe_load(saved.read_text()) or {}
    own_config = config.as_dict() if isinstance(config, Namespace) else config
    return all(setting(own_config, key) == setting(fit_config, key) for key in SAME_SETUP)


def setting(config: Any, key: str) -> Any:
    """The value of a dotted ``key`` in a config dict, looking inside ``init_args`` where a section is
    given by class (``data: {class_path: ..., init_args: {image_size: 32}}``); None if absent.

    >>> setting({"data": {"class_path": "x.Y", "init_args": {"image_size": 32}}}, "data.image_size")
    32
    >>> setting({"trainer": {"devices": 2}}, "trainer.devices"), setting({}, "trainer.devices")
    (2, None)
    """
    value = config
    for part in key.split("."):
        if isinstance(value, dict) and part not in value and isinstance(value.get("init_args"), dict):
            value = value["init_args"]
        value = value.get(part) if isinstance(value, dict) else None
    return value


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
    elif logger in (None, True):
        # Lightning's default logger, without its placeholder hp_metric=-1: TensorBoardViews logs the real ones.
        where = {"save_dir": trainer.get("default_root_dir") or os.getcwd()}
        if fit_run is not None:
            where = {"save_dir": str(fit_run.parent.parent), "name": fit_run.parent.name, "version": fit_run.name}
        trainer.logger = Namespace(class_path=TENSORBOARD_LOGGER, init_args=Namespace(**where, default_hp_metric=False))
        if fit_run is None:
            return None
    else:
        return None
    return f"config-{subcommand}.yaml"


def run_label(folder: Path) -> str:
    """A run's name for TensorBoard: its folder and setup, ``version_3-ddp-resnet50-2xcpu-b256`` (from its
    ``timing.json``, else its ``config.yaml``; the folder's name alone when neither says)."""
    setup: list[Any] = []
    timing_file, config_file = folder / "timing.json", folder / "config.yaml"
    try:
        if timing_file.is_file():
            timing = json.loads(timing_file.read_text())
            devices = f"{timing['devices']}x{timing['accelerator']}" if "devices" in timing else None
            batch = f"b{timing['batch_size']}" if "batch_size" in timing else None
            setup = [timing.get("strategy"), timing.get("arch"), devices, batch]
        elif config_file.is_file():
            config = yaml.safe_load(config_file.read_text()) or {}
            trainer, model = config.get("trainer") or {}, config.get("model") or {}
            arch = (section_args(model) or {}).get("arch")
            setup = [trainer.get("strategy"), arch, f"{trainer.get('devices')}x{trainer.get('accelerator')}"]
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        setup = []
    words = [str(word) for word in setup if word is not None and not isinstance(word, dict)]
    return "-".join(re.sub(r"[^\w.+]+", "_", word) for word in [folder.name, *words])


def tensorboard_logdir_spec(root: Path) -> str:
    """TensorBoard's ``--logdir_spec`` for the run folders under ``root``, each run named by
    :func:`run_label` (TensorBoard names a run by its folder, ``version_N``, which says nothing of its
    setup); ``--logdir=root`` where there is no run folder (yet)."""
    folders = sorted({p.parent for p in Path(root).rglob("events.out.tfevents.*")})
    if not folders:
        return f"--logdir={root}"
    return "--logdir_spec=" + ",".join(f"{run_label(folder)}:{folder}" for folder in folders)


if __name__ == "__main__":  # make tensorboard: the runs under LOGDIR, named by their setup
    print(tensorboard_logdir_spec(Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_LOGGER_NAME)))

"""The command line: ``python -m project {fit,validate,test,predict}``, a LightningCLI.

Beyond LightningCLI it does these things:
- ``num_classes`` is linked from the data module to the model, so it is never typed twice;
- a ModelCheckpoint is always there (``--checkpoint.*``), keeping ``last.ckpt`` and the best
  ``val/acc`` of each run;
- ``--ckpt_path=last`` / ``best`` also work in a NEW process (the usual case: ``fit``, then
  ``test --ckpt_path=best`` as a second command), by looking in the newest run folder under
  ``<trainer.default_root_dir>/lightning_logs``;
- a :class:`project.timing.TimingCallback` is always there (``--timing.*``): every run reports its
  epoch, iteration and inference times and peak memory (``timing.json`` in the run folder);
- checkpoints are written atomically, checked before use, and training stops at the first
  non-finite loss (:mod:`project.faults`); ``predict`` writes ``predictions.csv``.
Errors the user can fix (:class:`project.errors.ProjectError`) print as one line and exit 2.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI

from project.data import CIFAR10DataModule
from project.errors import ProjectError
from project.faults import AtomicCheckpoints, FiniteLossGuard, check_checkpoint_file
from project.log import get_logger
from project.model import ImageClassifier
from project.predictions import PredictionWriter
from project.reproducibility import ReseedEveryEpoch
from project.timing import TimingCallback

log = get_logger(__name__)

CHECKPOINT_DEFAULTS = {
    "checkpoint.monitor": "val/acc",
    "checkpoint.mode": "max",
    "checkpoint.save_last": True,
    "checkpoint.filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}",
    "checkpoint.auto_insert_metric_name": False,
}


class ProjectCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(CHECKPOINT_DEFAULTS)
        parser.add_lightning_class_args(ReseedEveryEpoch, "reseed_every_epoch")
        parser.add_lightning_class_args(TimingCallback, "timing")
        parser.add_lightning_class_args(FiniteLossGuard, "finite_loss_guard")
        parser.add_lightning_class_args(AtomicCheckpoints, "atomic_checkpoints")
        parser.add_lightning_class_args(PredictionWriter, "predictions")

    def _parse_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path=last|best`` to a file and check the file, before LightningCLI reads the
        model's hyperparameters (``arch``, ...) from it, so a checkpoint named either way restores
        the network it was trained with."""
        subcommand = self.config.get("subcommand")
        if subcommand:
            config = self.config[subcommand]
            value = config.get("ckpt_path")
            if value is None and subcommand != "fit":
                log.warning(
                    "%s runs on the model's freshly initialised weights; pass --ckpt_path=best, last or a file "
                    "to evaluate a trained model",
                    subcommand,
                )
            if value in ("last", "best"):
                config.ckpt_path = find_checkpoint(value, _runs_root(config.trainer), allow_none=subcommand == "fit")
            if config.ckpt_path not in (None, "hpc"):
                check_checkpoint_file(config.ckpt_path)  # a truncated or foreign file: one line naming it
        super()._parse_ckpt_path()


def _runs_root(trainer_config: Any) -> Path:
    """The folder holding the ``version_N`` run folders: the logger's ``save_dir/name`` when a logger
    is configured with them, else Lightning's default ``<default_root_dir>/lightning_logs``."""
    root = Path(trainer_config.get("default_root_dir") or os.getcwd())
    init_args = getattr(trainer_config.get("logger"), "init_args", None)
    if init_args is None:
        return root / "lightning_logs"
    name = init_args.get("name", "lightning_logs")
    return Path(init_args.get("save_dir") or root) / (name or "")


def find_checkpoint(which: str, runs_root: Path, allow_none: bool = False) -> str | None:
    """The ``last.ckpt`` of the newest run under ``runs_root``, or that run's best checkpoint.

    With ``allow_none`` (``fit --ckpt_path=last`` before any run: start from scratch) a missing
    checkpoint returns None; otherwise it is an error.
    """
    runs = sorted(runs_root.glob("version_*/checkpoints/last.ckpt"), key=_version_number)
    if not runs:
        if allow_none:
            log.warning("--ckpt_path=%s: no checkpoint under %s yet; starting from scratch", which, runs_root)
            return None
        raise ProjectError(
            f"--ckpt_path={which}: no run with a checkpoint under {runs_root} "
            "(looked for version_*/checkpoints/last.ckpt); train first, or pass a checkpoint file"
        )
    last = runs[-1]
    if which == "last":
        log.info("--ckpt_path=last: %s", last)
        return str(last)
    state = torch.load(last, map_location="cpu", weights_only=False).get("callbacks", {})
    best = next((s.get("best_model_path") for k, s in state.items() if k.startswith("ModelCheckpoint")), None)
    if not best or not Path(best).is_file():
        raise ProjectError(
            f"--ckpt_path=best: the run of {last} recorded no best checkpoint that still exists ({best!r})"
        )
    log.info("--ckpt_path=best: %s", best)
    return best


def _version_number(last_ckpt: Path) -> int:
    """``.../version_12/checkpoints/last.ckpt`` -> 12, so version_10 sorts after version_9."""
    suffix = last_ckpt.parent.parent.name.removeprefix("version_")
    return int(suffix) if suffix.isdigit() else -1


def main(args: ArgsType = None) -> ProjectCLI:
    """Entry point of ``python -m project``; ``args`` replaces ``sys.argv[1:]`` (for tests)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    package_logger = logging.getLogger("project")
    package_logger.handlers[:] = [handler]
    package_logger.setLevel(logging.INFO)
    package_logger.propagate = False
    try:
        return ProjectCLI(
            ImageClassifier,
            CIFAR10DataModule,
            seed_everything_default=42,
            trainer_defaults={"max_epochs": 10},
            save_config_kwargs={"overwrite": True},
            # bench is dispatched before LightningCLI (project/__main__.py): name it where users look
            parser_kwargs={
                "description": "Train, evaluate and time one image classifier; compare strategies with "
                "`python -m project bench --help`."
            },
            args=args,
        )
    except ProjectError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None

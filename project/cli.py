"""The command line: ``python -m project {fit,validate,test,predict}``, a LightningCLI.

Beyond LightningCLI it does three things:
- ``num_classes`` is linked from the data module to the model, so it is never typed twice;
- a ModelCheckpoint is always there (``--checkpoint.*``), keeping ``last.ckpt`` and the best
  ``val/acc`` of each run;
- ``--ckpt_path=last`` / ``best`` also work in a NEW process (the usual case: ``fit``, then
  ``test --ckpt_path=best`` as a second command), by looking in the newest run folder.
Errors the user can fix (:class:`project.errors.ProjectError`) print as one line and exit 2.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI

from project.data import CIFAR10DataModule
from project.errors import ProjectError
from project.log import get_logger
from project.model import ImageClassifier
from project.reproducibility import ReseedEveryEpoch

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

    def before_fit(self) -> None:
        self._resolve_ckpt_path()

    def before_validate(self) -> None:
        self._resolve_ckpt_path()

    def before_test(self) -> None:
        self._resolve_ckpt_path()

    def before_predict(self) -> None:
        self._resolve_ckpt_path()

    def _resolve_ckpt_path(self) -> None:
        """Turn ``last``/``best`` into a file of the newest run, and check that a path exists."""
        config = self.config_init[self.subcommand]
        value = config.get("ckpt_path")
        if value is None:
            if self.subcommand != "fit":
                log.warning(
                    "%s runs on the model's freshly initialised weights; pass --ckpt_path=best, last or a file "
                    "to evaluate a trained model",
                    self.subcommand,
                )
            return
        if value in ("last", "best"):
            config.ckpt_path = find_checkpoint(value, self._runs_root(), allow_none=self.subcommand == "fit")
        elif value != "hpc" and not Path(value).is_file():
            raise ProjectError(f"--ckpt_path={value}: no such file; pass a checkpoint file, 'last' or 'best'")

    def _runs_root(self) -> Path:
        """Where the run folders (``version_N``) are: the logger's root, as Lightning lays it out."""
        root = getattr(self.trainer.logger, "root_dir", None)
        return Path(root) if root else Path(self.trainer.default_root_dir) / "lightning_logs"


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
            args=args,
        )
    except ProjectError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None

"""The console of a run without Lightning's noise, each piece silenced where it arises, and only it:

- :class:`LogEveryEpoch`: an epoch shorter than ``--trainer.log_every_n_steps`` (a short run, a
  small data set) would be logged less than once per epoch, and Lightning warns about it on every
  such run; the interval is shortened to the epoch instead, so the loss shows every epoch;
- :class:`ModelSummaryWithFlops`: Lightning's model summary has a FLOPs column, all zeros unless
  the model defines an ``example_input_array`` (the template counts FLOPs in its timing callback,
  ``timing.json``); the column and its "0 Total Flops" line are left out when they hold nothing;
- :func:`silence_known_noise`: two messages with no action for a user, filtered by their exact text
  and origin (a message of the same kind from elsewhere still shows): Lightning's advertisement for
  its ``litlogger`` service on every run, and torch's deprecation of ``LeafSpec``, which
  Lightning's own code still uses (a Lightning matter, nothing the user can change).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities import rank_zero_info

from project.toolkit.compat import format_model_summary

LITLOGGER_TIP = "💡 Tip: For seamless cloud logging"


class LogEveryEpoch(Callback):
    """Shortens ``trainer.log_every_n_steps`` to the epoch's length when the epoch is shorter."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        wanted = trainer.log_every_n_steps
        if stage != "fit" or trainer.fast_dev_run or wanted == 0:
            return
        # The count of training batches is Lightning's own (limits, drop_last, ranks), made by loading
        # the training data as configure_optimizers does a moment later; with the interval at 0
        # meanwhile, Lightning's check, made at that load, does not warn.
        trainer.log_every_n_steps = 0
        try:
            batches = trainer.estimated_stepping_batches and trainer.num_training_batches
        finally:
            trainer.log_every_n_steps = wanted
        if 0 < batches < wanted:
            trainer.log_every_n_steps = int(batches)


class ModelSummaryWithFlops(ModelSummary):
    """Lightning's model summary, without the FLOPs column when it holds only zeros."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if total_flops:
            ModelSummary.summarize(
                summary_data, total_parameters, trainable_parameters, model_size, total_training_modes, total_flops
            )
            return
        columns = [column for column in summary_data if column[0] != "FLOPs"]
        table = format_model_summary(
            total_parameters, trainable_parameters, model_size, total_training_modes, 0, *columns
        )
        rank_zero_info("\n" + "\n".join(line for line in table.splitlines() if not line.endswith("Total Flops")))


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def silence_known_noise() -> None:
    """Filter the two messages named in the module's docstring, by exact text and origin."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(LITLOGGER_TIP))
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )

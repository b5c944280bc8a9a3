"""The progress bar: the training loss and the learning rate on it, no ``v_num``; a rich bar where
`rich <https://github.com/Textualize/rich>`_ is installed (``pip install -e '.[progress]'``), else tqdm.

Lightning's bar shows only what is logged with ``prog_bar=True``, and the model puts nothing of the
training steps there: the bar reads its values at every refresh (every step), and reading a loss
that lives on an accelerator makes the host wait for the device each time. This bar reads the loss
and the learning rate only on the steps the loggers write (every ``--trainer.log_every_n_steps``),
which read them then anyway, and shows those values until the next such step. ``v_num`` (the run
folder's number, the same all run long) is left out: the end-of-run summary names the folder. The rich
bar reads all its values on those steps only (and at the end of each epoch): between them only its count
moves, so a value a model logs with ``prog_bar=True`` at every step is shown as of the last logging step.

The loss on the bar is the last logged step's, named ``train/loss_step`` as in TensorBoard; the
epoch's mean is ``train/loss`` (the end-of-run summary's). The bar is finished when a stage's work is
done, before the timing table and the summary are printed, not drawn once more below them.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from project.toolkit.compat import advance_rich_bar, loggers_write_this_step

# What the model logs on the steps the loggers write (project/model.py), and the bar's name for each.
STEP_VALUES = {"train/loss_step": "train/loss_step", "train/lr": "lr"}


def rich_installed() -> bool:
    """Whether ``rich`` can be imported (the ``progress`` extra installs it)."""
    return importlib.util.find_spec("rich") is not None


class TrainingValuesOnBar:
    """Mixin for a Lightning progress bar: the training loss and learning rate, read at the logging
    interval, and no ``v_num``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_values: dict[str, str] = {}

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if loggers_write_this_step(trainer):  # the loggers read these values on this step too
            metrics = trainer.callback_metrics
            for key, shown in STEP_VALUES.items():
                if key in metrics:
                    value = float(metrics[key])
                    self.step_values[shown] = f"{value:.3g}" if shown == "lr" else f"{value:.3f}"
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # type: ignore[misc]

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        shown = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        shown.pop("v_num", None)
        return {**self.step_values, **shown}


class TQDMTrainingBar(TrainingValuesOnBar, TQDMProgressBar):
    """Lightning's tqdm bar with the training loss and learning rate (see :class:`TrainingValuesOnBar`)."""


class RichTrainingBar(TrainingValuesOnBar, RichProgressBar):
    """Lightning's rich bar with the training loss and learning rate (see :class:`TrainingValuesOnBar`).

    Args:
        refresh_rate: Redraws per second, by a thread of rich's own (0: no bar). Lightning's default,
            100, costs that thread about 15 ms of CPU per second (measured on a 2-core CPU), 1.5 % of
            a core, taken from the training processes where they use every core; 10 reads as smoothly.
        kwargs: The other options of Lightning's RichProgressBar (``leave``, ``theme``, ...).
    """

    def __init__(self, refresh_rate: int = 10, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.train_progress_bar_id is None or loggers_write_this_step(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        else:
            # Between the steps the loggers write, the values on the bar stay as they are (see the mixin; the
            # model logs to the bar once per epoch): only the count moves. Reading the values and redrawing at
            # every step, as Lightning's bar does, cost 0.13 ms a step on a CPU; rich's own thread redraws.
            advance_rich_bar(self, self.train_progress_bar_id, batch_idx + 1)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._finish(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_epoch_end(trainer, pl_module)
        if trainer.state.fn == "validate":  # the validate command, not fit's validation epochs
            self._finish(trainer, pl_module)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_test_epoch_end(trainer, pl_module)
        self._finish(trainer, pl_module)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_predict_epoch_end(trainer, pl_module)
        self._finish(trainer, pl_module)

    def _finish(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Draw the bar one last time and let go of the terminal now (its teardown, which Lightning calls only
        after the end-of-stage hooks that print the timing table and the summary; tqdm's bars close at
        each stage's end already)."""
        self.teardown(trainer, pl_module, str(trainer.state.stage or ""))


# The template's default bar (``--callbacks.progress_bar``); its options (``--progress_bar.*``) are
# those of Lightning's RichProgressBar or TQDMProgressBar.
ProgressBar: type[TrainingValuesOnBar] = RichTrainingBar if rich_installed() else TQDMTrainingBar

"""The template's callbacks, one module per concern; those every run has: :data:`DEFAULT_CALLBACKS` (why: config)."""

from __future__ import annotations

from lightning.pytorch import Callback

from project.toolkit.callbacks.checkpoints import Checkpoints
from project.toolkit.callbacks.ema import ExponentialMovingAverage
from project.toolkit.callbacks.evaluation import EvaluationReport
from project.toolkit.callbacks.guards import Guards
from project.toolkit.callbacks.memory_reuse import HostMemoryReuse
from project.toolkit.callbacks.precise_bn import PreciseBatchNorm
from project.toolkit.callbacks.predictions import PredictionWriter
from project.toolkit.callbacks.progress import ProgressBar
from project.toolkit.callbacks.reproducibility import ReseedEveryEpoch
from project.toolkit.callbacks.run_summary import RunSummary
from project.toolkit.callbacks.views import TensorBoardViews
from project.toolkit.timing.callback import TimingCallback

# By the name of their options (--timing.*) and of their switch (--callbacks.timing=false).
DEFAULT_CALLBACKS: dict[str, type[Callback]] = {
    "checkpoint": Checkpoints,
    "reseed_every_epoch": ReseedEveryEpoch,
    "timing": TimingCallback,
    "ema": ExponentialMovingAverage,  # off by default; before precise_bn: the statistics it recomputes are the EMA's
    "precise_bn": PreciseBatchNorm,  # after timing: its seconds are its own figure, not the epoch's
    "tensorboard_views": TensorBoardViews,  # after timing: it reports timing's figures as hparams
    "guards": Guards,
    "evaluation": EvaluationReport,
    "predictions": PredictionWriter,
    "progress_bar": ProgressBar,
    "host_memory_reuse": HostMemoryReuse,
    "run_summary": RunSummary,  # after timing: it names the timing.json written at the same hook
}
# Run as one CallbackGroup: all but those Lightning looks for by type (checkpoint, progress bar, prediction writer).
GROUPED = tuple(
    kind for name, kind in DEFAULT_CALLBACKS.items() if name not in ("checkpoint", "progress_bar", "predictions")
)
CHECKPOINT_DEFAULTS = {"checkpoint.monitor": "val/acc", "checkpoint.mode": "max", "checkpoint.save_last": True}
CHECKPOINT_DEFAULTS |= {"checkpoint.filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}"}
CHECKPOINT_DEFAULTS |= {"checkpoint.auto_insert_metric_name": False}
# The commands a default callback has work in (one not named: every command; the checkpoint and reseed ones stay
# in all, as Lightning warns of a checkpoint's callback missing from a run that loads it).
WORKS_IN: dict[str, set[str]] = {"precise_bn": {"fit"}, "predictions": {"predict"}}
WORKS_IN |= {"evaluation": {"fit", "validate", "test"}, "ema": {"fit"}}
OFF_BY_DEFAULT = {"ema"}  # switched on with --callbacks.ema=true


def left_out_of(command: str) -> set[str]:
    """The default callbacks with no work in ``command`` (:data:`WORKS_IN`)."""
    return {name for name, commands in WORKS_IN.items() if command not in commands}

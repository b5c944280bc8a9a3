"""Lightning's model summary with the network's FLOPs. Lightning counts them only by running the module's
``example_input_array`` through the real model on every rank, which this template leaves unset, so its FLOPs column
reads 0; here each row's forward FLOPs per image are counted on a ``meta`` copy of ``net`` instead."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.model_summary import get_human_readable_count

from project.toolkit.timing.flops import forward_flops_by_module
from project.toolkit.timing.report import counted


class FlopsSummary(ModelSummary):
    """:class:`~lightning.pytorch.callbacks.ModelSummary` whose FLOPs column and total are forward FLOPs per image of
    ``net`` and of the rows inside it; Lightning's figures where the network cannot be counted."""

    flops: dict[str, int] | None = None  # by module name in ``net``; "": ``net`` itself

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":  # before a strategy shards or splits the network
            try:
                self.flops = counted(trainer, pl_module, forward_flops_by_module)
            except (RuntimeError, NotImplementedError, TypeError):  # an operation the meta device cannot run
                self.flops = None

    def summarize(
        self, summary_data: list[tuple[str, list[str]]], *sizes: Any, total_flops: int, **kwargs: Any
    ) -> None:
        columns = dict(summary_data)
        if self.flops is not None and "FLOPs" in columns:
            in_net = [name.partition(".") for name in columns["Name"]]  # "net.features": ("net", ".", "features")
            shown = [
                get_human_readable_count(self.flops.get(inner, 0)) if top == "net" else value
                for (top, _, inner), value in zip(in_net, columns["FLOPs"], strict=True)
            ]
            summary_data = [(("FLOPs/image", shown) if title == "FLOPs" else (title, v)) for title, v in summary_data]
            total_flops = self.flops[""]
        super().summarize(summary_data, *sizes, total_flops=total_flops, **kwargs)


class RichFlopsSummary(FlopsSummary, RichModelSummary):
    """:class:`FlopsSummary` drawn by :class:`~lightning.pytorch.callbacks.RichModelSummary`."""


def with_flops(summary: Callback) -> Callback:
    """In place of the summary Lightning adds by itself (``enable_model_summary``): one with FLOPs, drawn alike."""
    if type(summary) in (ModelSummary, RichModelSummary):
        return RichFlopsSummary() if isinstance(summary, RichModelSummary) else FlopsSummary()
    return summary

"""The strategies Lightning 2 lacks or refuses on a CPU, under the names users know them by:

- ``dp``: DataParallel, one process, the network replicated on every GPU each step;
- ``dp_balanced``: the same, with the loss computed inside each replica;
- ``fsdp``: FSDP2 (``fully_shard``) per block, on CPUs (gloo) as well as GPUs;
- ``pipeline``: the network split into one stage per process, micro-batches pipelined (1: model parallel);
- ``single_xla``: Lightning's one-XLA-device strategy, with a default device so the name works;
- ``xla_cpu`` (an accelerator): torch_xla's CPU device standing in for a TPU.

``ddp``, ``xla`` (every core of a TPU) and single device are Lightning's own.
:func:`register_strategies` runs where the command line starts (:func:`project.toolkit.cli.main`), before any
Trainer reads the registries, and so again in every process a launcher starts with the same command.
What these strategies need of a LightningModule is :mod:`project.toolkit.strategies.contract`.
"""

from __future__ import annotations

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

from project.toolkit.strategies.dp import DataParallelStrategy
from project.toolkit.strategies.fsdp import FullyShardedStrategy
from project.toolkit.strategies.pipeline import PipelineStrategy
from project.toolkit.strategies.xla import SingleXLAStrategy, XLACPUAccelerator

__all__ = [
    "DataParallelStrategy",
    "FullyShardedStrategy",
    "PipelineStrategy",
    "SingleXLAStrategy",
    "XLACPUAccelerator",
    "name_help",
    "register_strategies",
]


def register_strategies() -> None:
    """Make ``--trainer.strategy=dp|dp_balanced|fsdp|pipeline|single_xla`` and ``--trainer.accelerator=xla_cpu``
    known to Lightning (safe to call again).

    >>> register_strategies()
    >>> {"dp", "dp_balanced", "fsdp", "pipeline", "single_xla"} <= set(StrategyRegistry.available_strategies())
    True
    """
    DataParallelStrategy.register_strategies(StrategyRegistry)
    FullyShardedStrategy.register_strategies(StrategyRegistry)
    PipelineStrategy.register_strategies(StrategyRegistry)
    SingleXLAStrategy.register_strategies(StrategyRegistry)
    XLACPUAccelerator.register_accelerators(AcceleratorRegistry)


def name_help() -> dict[str, str]:
    """What ``--trainer.strategy`` and ``--trainer.accelerator`` take, by option: the template's names
    and Lightning's (Lightning's own help names neither). Call after :func:`register_strategies`.

    >>> register_strategies()
    >>> name_help()["--trainer.strategy"]  # doctest: +ELLIPSIS
    "Names: this template's dp, dp_balanced, fsdp, pipeline, single_xla (docs/strategies.md); Lightning's auto, ..."
    """
    texts = {}
    for option, registry, key, lightning_names in (
        ("--trainer.strategy", StrategyRegistry, "strategy", ["auto"]),
        ("--trainer.accelerator", AcceleratorRegistry, "accelerator", ["auto", "gpu"]),
    ):
        ours = sorted(name for name, entry in registry.items() if entry[key].__module__.startswith(__name__))
        # ddp*_find_unused_parameters_{true,false}: one note instead of nine names
        lightning_names += sorted(n for n in registry if n not in ours and "find_unused" not in n)
        texts[option] = f"Names: this template's {', '.join(ours)} (docs/strategies.md); Lightning's " + ", ".join(
            lightning_names
        )
    texts["--trainer.strategy"] += " (and ddp*_find_unused_parameters_true/false)"
    return texts

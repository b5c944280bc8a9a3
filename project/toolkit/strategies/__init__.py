"""The strategies Lightning 2 lacks or refuses on a CPU, under the names users know them by:

- ``dp``: DataParallel, one process, the network replicated on every GPU each step;
- ``dp_balanced``: the same, with the loss computed inside each replica;
- ``fsdp``: FSDP2 (``fully_shard``) per block, on CPUs (gloo) as well as GPUs;
- ``pipeline``: the network split into one stage per process, micro-batches pipelined (1: model parallel);
- ``single_xla``: Lightning's one-XLA-device strategy, with a default device so the name works;
- ``xla_cpu`` (an accelerator): torch_xla's CPU device standing in for a TPU.

``ddp``, ``xla`` (every core of a TPU) and single device are Lightning's own.
:func:`register_strategies` runs where the command line starts, before any Trainer reads the registries (and so
in every process a launcher starts).
What these strategies need of a LightningModule is :mod:`project.toolkit.strategies.contract`.
"""

from __future__ import annotations

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

from project.toolkit.strategies.dp import DataParallelStrategy
from project.toolkit.strategies.fsdp import FullyShardedStrategy
from project.toolkit.strategies.pipeline import PipelineStrategy
from project.toolkit.strategies.xla import SingleXLAStrategy, XLACPUAccelerator

# The names the template offers (docs/strategies.md), for the one line that refuses any other.
COMMON_STRATEGIES = (
    "auto", "single_device", "dp", "dp_balanced", "ddp", "fsdp", "pipeline",
    "deepspeed_stage_2", "deepspeed_stage_3", "xla", "single_xla",
)  # fmt: skip

__all__ = [
    "DataParallelStrategy",
    "FullyShardedStrategy",
    "PipelineStrategy",
    "SingleXLAStrategy",
    "XLACPUAccelerator",
    "COMMON_STRATEGIES",
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

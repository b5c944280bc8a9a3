"""Strategies Lightning 2 lacks or refuses on CPUs (``dp``, ``dp_balanced``, ``fsdp``, ``pipeline``, ``single_xla``),
the ``xla_cpu`` accelerator, and ``ddp`` with faster settings; what they need of a module: :mod:`.contract`."""

from __future__ import annotations

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from project.toolkit.strategies.dp import DataParallelStrategy
from project.toolkit.strategies.fsdp import FullyShardedStrategy
from project.toolkit.strategies.pipeline import PipelineStrategy
from project.toolkit.strategies.xla import SingleXLAStrategy, XLACPUAccelerator

# The names the template offers (docs/strategies.md), for the one line that refuses any other.
COMMON_STRATEGIES = ("auto", "single_device", "dp", "dp_balanced", "ddp", "fsdp", "pipeline", "deepspeed_stage_2")
COMMON_STRATEGIES += ("deepspeed_stage_3", "xla", "single_xla")

__all__ = ["DataParallelStrategy", "FullyShardedStrategy", "PipelineStrategy", "SingleXLAStrategy", "XLACPUAccelerator"]
__all__ += ["COMMON_STRATEGIES", "register_strategies"]


def register_strategies() -> None:
    """Make the strategies above and ``xla_cpu`` known to Lightning (safe to call again), before any Trainer."""
    for strategy in (DataParallelStrategy, FullyShardedStrategy, PipelineStrategy, SingleXLAStrategy):
        strategy.register_strategies(StrategyRegistry)
    XLACPUAccelerator.register_accelerators(AcceleratorRegistry)
    # ddp, as Lightning's, but with the gradients kept as views of DDP's buckets (no copy into them each step) and
    # the graph declared static (the same parameters used every step, as in these networks).
    options = dict(start_method="popen", gradient_as_bucket_view=True, static_graph=True)
    description = "DDP with gradient_as_bucket_view and static_graph"
    StrategyRegistry.register("ddp", DDPStrategy, description=description, override=True, **options)

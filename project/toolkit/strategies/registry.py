"""The strategies the template adds to Lightning's, registered by name before any Trainer exists
(:func:`register_strategies`), and the names it offers (:data:`COMMON_STRATEGIES`)."""

from __future__ import annotations

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from project.toolkit.strategies.dp import DataParallelStrategy
from project.toolkit.strategies.fsdp import FullyShardedStrategy
from project.toolkit.strategies.pipeline import PipelineStrategy
from project.toolkit.strategies.xla import SingleXLAStrategy, XLACPUAccelerator

# The names the template offers (docs/strategies.md), for the one line that refuses any other.
COMMON_STRATEGIES = ("auto", "single_device", "dp", "dp_balanced", "ddp", "ddp_static", "fsdp", "pipeline")
COMMON_STRATEGIES += ("deepspeed_stage_2", "deepspeed_stage_3", "xla", "single_xla")


def register_strategies() -> None:
    """Make the strategies above and ``xla_cpu`` known to Lightning (safe to call again), before any Trainer."""
    for strategy in (DataParallelStrategy, FullyShardedStrategy, PipelineStrategy, SingleXLAStrategy):
        strategy.register_strategies(StrategyRegistry)
    XLACPUAccelerator.register_accelerators(AcceleratorRegistry)
    # Lightning's own ddp stays as it is, for any network. ddp_static is for networks that use every parameter at
    # every step, as these do: the graph declared static, the gradients views of DDP's buckets (no copy each step).
    options = dict(start_method="popen", gradient_as_bucket_view=True, static_graph=True)
    description = "DDP with static_graph and gradient_as_bucket_view"
    StrategyRegistry.register("ddp_static", DDPStrategy, description=description, override=True, **options)

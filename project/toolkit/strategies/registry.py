"""The strategy and accelerator names the template adds to Lightning's, and the names it offers
(:data:`COMMON_STRATEGIES`). Lightning's registries take a class, so each module of ours is imported only once a run
names one of its strategies (:func:`register_chosen`): a run on one device loads none of them."""

from __future__ import annotations

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from project.toolkit.dotted import import_object

# The names the template offers (docs/strategies.md), for the one line that refuses any other.
COMMON_STRATEGIES = ("auto", "single_device", "dp", "dp_balanced", "ddp", "ddp_static", "fsdp", "pipeline")
COMMON_STRATEGIES += ("deepspeed_stage_2", "deepspeed_stage_3", "xla", "single_xla")
# Each name of ours and the class that registers it (its register_strategies / register_accelerators).
STRATEGY_CLASSES = {
    "dp": "project.toolkit.strategies.dp.DataParallelStrategy",
    "dp_balanced": "project.toolkit.strategies.dp.DataParallelStrategy",
    "fsdp": "project.toolkit.strategies.fsdp.FullyShardedStrategy",
    "pipeline": "project.toolkit.strategies.pipeline.PipelineStrategy",
    "single_xla": "project.toolkit.strategies.xla.SingleXLAStrategy",
}
ACCELERATOR_CLASSES = {"xla_cpu": "project.toolkit.strategies.xla.XLACPUAccelerator"}


def register_ddp_static() -> None:
    """``ddp_static``: Lightning's ddp for networks that use every parameter at every step, as these do: the graph
    declared static, the gradients views of DDP's buckets (no copy each step). Lightning's own ddp stays as it is."""
    options = dict(start_method="popen", gradient_as_bucket_view=True, static_graph=True)
    description = "DDP with static_graph and gradient_as_bucket_view"
    StrategyRegistry.register("ddp_static", DDPStrategy, description=description, override=True, **options)


def register_chosen(strategy: object, accelerator: object = None) -> None:
    """Make the template's strategy and accelerator a run names known to Lightning (safe to call again), before its
    Trainer: in every process, as each parses the same command line."""
    if isinstance(strategy, str) and strategy in STRATEGY_CLASSES:
        import_object(STRATEGY_CLASSES[strategy]).register_strategies(StrategyRegistry)
    if isinstance(accelerator, str) and accelerator in ACCELERATOR_CLASSES:
        import_object(ACCELERATOR_CLASSES[accelerator]).register_accelerators(AcceleratorRegistry)


def register_strategies() -> None:
    """Make every name above known to Lightning, for a Python user building a Trainer by name."""
    register_ddp_static()
    for name in STRATEGY_CLASSES:
        register_chosen(name)
    for name in ACCELERATOR_CLASSES:
        register_chosen(None, name)

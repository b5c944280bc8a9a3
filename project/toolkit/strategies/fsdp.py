"""``fsdp``: FSDP2 (``fully_shard``) on CPUs (gloo) and GPUs, via Lightning's ``ModelParallelStrategy``, all processes
in one data-parallel group (Lightning's ``fsdp``: FSDP1, GPUs only); ``net`` sharded a unit per block, then the root."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed
from lightning.fabric.utilities.data import has_len
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from project.toolkit.blocks import Block, module_blocks, short_count
from project.toolkit.compat import shard_over_every_process
from project.toolkit.errors import ProjectError
from project.toolkit.interfaces import StrategyLayout
from project.toolkit.log import get_logger
from project.toolkit.strategies.contract import check_module

log = get_logger(__name__)


def shard_network(
    net: nn.Module, blocks: list[Block], mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy | None = None
) -> list[dict[str, Any]]:
    """Shard ``net`` in place, one FSDP2 unit per block holding parameters, then the root; returns the units."""
    options = {"mesh": mesh, **({"mp_policy": mp_policy} if mp_policy is not None else {})}
    # FSDP2 shards contiguous parameters only; the images stay channels_last, and a convolution follows its input.
    net.to(memory_format=torch.contiguous_format)
    total = sum(p.numel() for p in net.parameters())
    units = []
    for block in blocks:
        modules = [net.get_submodule(path) for path in block.paths if path]
        if not modules or not block.parameter_count:
            continue
        units.append({"name": block.name, "modules": list(block.paths), "parameters": block.parameter_count})
        fully_shard(modules[0] if len(modules) == 1 else modules, **options)
    in_units = {id(p) for block in blocks if block.paths != ("",) for p in block.module.parameters()}
    rest = [name for name, p in net.named_parameters() if id(p) not in in_units]
    root_modules = list(dict.fromkeys(name.rpartition(".")[0] or name for name in rest))
    units.append({"name": "root", "modules": root_modules, "parameters": total - sum(u["parameters"] for u in units)})
    fully_shard(net, **options)
    return units


def describe_units(units: list[dict[str, Any]], processes: int) -> str:
    """The fsdp plan in a few console lines: every unit's name and parameter count."""
    lines, line = [f"fsdp plan: {len(units) - 1} unit(s) + root, sharded over {processes} process(es):"], ""
    for item in (f"{u['name']} {short_count(u['parameters'])}" for u in units):  # wrapped between units only
        if line and len(line) + len(item) > 106:
            lines.append(f"  {line},")
            line = ""
        line = f"{line}, {item}" if line else item
    return "\n".join([*lines, f"  {line}"])


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for a Lightning ``precision``: a mixed one gathers and computes in half precision and reduces
    the gradients in float32 (without it, fp32 parameters are gathered and autocast casts them every step)."""
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(str(precision))
    return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32) if half is not None else None


def cast_buffers(net: nn.Module, dtype: torch.dtype) -> None:
    """Floating-point buffers (BatchNorm's statistics) in ``dtype``, as the parameters the policy gathers: torch's
    BatchNorm refuses those beside float32 statistics. Lightning's FSDPStrategy does the same (``buffer_dtype``)."""
    for module in net.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_floating_point():
                setattr(module, name, buffer.to(dtype))


def check_compile_mode(module: Any) -> None:
    """Refuse CUDA graphs under fsdp in one line: a graph cannot hold FSDP2's collectives."""
    hparams = getattr(module, "hparams", {})
    if hparams.get("compile") and hparams.get("compile_mode") == "reduce-overhead":
        raise ProjectError(
            "--model.compile_mode=reduce-overhead (CUDA graphs) does not run under fsdp, whose collectives a graph "
            "cannot hold; use --model.compile_mode=default or max-autotune-no-cudagraphs"
        )


def evaluate_under_no_grad(trainer: pl.Trainer) -> None:
    """Evaluate under ``no_grad``, not ``inference_mode``, which would make the buffers FSDP2 gathers into and writes
    in place inference tensors; as Lightning's FSDPStrategy (https://github.com/pytorch/pytorch/issues/95957)."""
    for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
        loop.inference_mode = False


class FullyShardedStrategy(ModelParallelStrategy):
    """FSDP2 across all processes of the run, registered as ``fsdp``.

    Args:
        save_distributed_checkpoint: Save a folder of per-process shards per checkpoint, not one consolidated file.
    """

    strategy_name = "fsdp"

    def __init__(self, save_distributed_checkpoint: bool = False) -> None:
        super().__init__(tensor_parallel_size=1, save_distributed_checkpoint=save_distributed_checkpoint)
        self.parallel_plan: dict[str, Any] | None = None  # the FSDP units, for timing.json

    def layout(self) -> StrategyLayout:
        return StrategyLayout(parallel_plan=self.parallel_plan)

    def setup_environment(self) -> None:
        shard_over_every_process(self)  # ModelParallelStrategy's "auto" would shard across nodes only
        super().setup_environment()

    def setup(self, trainer: pl.Trainer) -> None:
        evaluate_under_no_grad(trainer)
        # After configure_model (which may compile the network) and before the optimizers hold the parameters.
        module = self.lightning_module
        check_module(module, "fsdp")
        check_compile_mode(module)
        if not isinstance(module.net, FSDPModule):  # setup runs again for validate/test/predict after fit
            blocks = module_blocks(module, "fsdp")
            policy = mixed_precision_policy(str(trainer.precision))
            if policy is not None:
                cast_buffers(module.net, policy.param_dtype)
            units = shard_network(module.net, blocks, self.device_mesh["data_parallel"], policy)
            self.parallel_plan = {"units": units}
            log.info(describe_units(units, self.world_size))
        super().setup(trainer)

    def process_dataloader(self, dataloader: object) -> object:
        """Refuse, rather than hang on, data giving processes unequal numbers of batches (forwards are collective)."""
        if has_len(dataloader):
            counts: list[int | None] = [None] * self.world_size
            torch.distributed.all_gather_object(counts, len(dataloader))
            if len(set(counts)) > 1:
                raise ProjectError(
                    f"fsdp needs the same number of batches on every process (each forward pass is collective), "
                    f"but this data gives the processes {counts}; change data.batch_size, or run it on one device "
                    "(fsdp checkpoints are single files)"
                )
        return dataloader

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        description = "FSDP2 (fully_shard) on CPUs or GPUs, one shard per process"
        strategy_registry.register("fsdp", cls, description=description, override=True)

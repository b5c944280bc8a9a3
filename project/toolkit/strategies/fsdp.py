"""``fsdp``: fully sharded data parallel that runs on CPUs (gloo) as well as on GPUs (NCCL).

Lightning's own ``FSDPStrategy`` wraps torch's first FSDP, which refuses CPUs, and Lightning refuses
the name ``fsdp`` without a GPU. This strategy uses FSDP2 (``torch.distributed.fsdp.fully_shard``)
through Lightning's ``ModelParallelStrategy`` instead, with every process in one data-parallel group
and no tensor parallelism: plain FSDP. The strategy shards the module's network (``net``, see
:mod:`project.toolkit.strategies.contract`) when it sets the module up, one unit per block the network
declares (:mod:`project.toolkit.strategies.blocks`) and then the root; parameters, gradients and optimizer
state are split across the processes, and each block's full parameters are gathered only while it computes.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed
from lightning.fabric.utilities.data import has_len
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger
from project.toolkit.strategies.blocks import Block, module_blocks, short_count
from project.toolkit.strategies.contract import check_module

log = get_logger(__name__)


def shard_network(net: nn.Module, blocks: list[Block], mesh: DeviceMesh) -> list[dict[str, Any]]:
    """Shard ``net`` in place with FSDP2: one unit per block that holds parameters (so only one block's full
    parameters exist at a time on a rank while it computes), then the rest of the network as the root unit.
    Returns the units, each with its name, the network's modules it holds and its parameter count (before
    sharding), the root last. A block of several of the network's modules (ResNet's stem) is one unit over
    all of them."""
    # FSDP2 shards contiguous parameters only. The images stay channels_last (the module's
    # prepare_images), and a convolution follows its input's memory layout.
    net.to(memory_format=torch.contiguous_format)
    total = sum(p.numel() for p in net.parameters())
    units = []
    for block in blocks:
        modules = [net.get_submodule(path) for path in block.paths if path]
        if not modules or not block.parameter_count:
            continue
        units.append({"name": block.name, "modules": list(block.paths), "parameters": block.parameter_count})
        fully_shard(modules[0] if len(modules) == 1 else modules, mesh=mesh)
    in_units = {id(p) for block in blocks if block.paths != ("",) for p in block.module.parameters()}
    rest = [name for name, p in net.named_parameters() if id(p) not in in_units]
    root_modules = list(dict.fromkeys(name.rpartition(".")[0] or name for name in rest))
    units.append({"name": "root", "modules": root_modules, "parameters": total - sum(u["parameters"] for u in units)})
    fully_shard(net, mesh=mesh)
    return units


def describe_units(units: list[dict[str, Any]], processes: int) -> str:
    """The fsdp plan in a few console lines: every unit's name and parameter count.

    >>> print(describe_units([{"name": "0", "parameters": 1200}, {"name": "root", "parameters": 0}], 2))
    fsdp plan: 1 unit(s) + root, sharded over 2 process(es):
      0 1.2k, root 0
    """
    lines = [f"fsdp plan: {len(units) - 1} unit(s) + root, sharded over {processes} process(es):"]
    items = [f"{u['name']} {short_count(u['parameters'])}" for u in units]
    line = ""
    for item in items:  # wrapped between units, never inside one
        if line and len(line) + len(item) > 106:
            lines.append(f"  {line},")
            line = ""
        line = f"{line}, {item}" if line else item
    return "\n".join([*lines, f"  {line}"])


def evaluate_under_no_grad(trainer: pl.Trainer) -> None:
    """Make ``trainer``'s validate, test and predict loops run under ``torch.no_grad`` instead of
    ``torch.inference_mode`` (Lightning's validation inside fit already does).

    FSDP2 keeps the buffers it gathers a unit's parameters into, and writes into them in place. Made under
    inference mode, they are inference tensors: on one GPU, ``test`` failed at its first forward ("Inference
    tensors do not track version counter", torch 2.11, an H100), and newer torch refuses the next in-place
    write outside inference mode. Lightning evaluates its own ``FSDPStrategy`` under
    ``no_grad`` for this reason (pytorch#95957), and every gloo run too, so a CPU run never meets it.
    """
    for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
        loop.inference_mode = False


class FullyShardedStrategy(ModelParallelStrategy):
    """FSDP2 across all processes of the run, registered as ``fsdp``.

    Args:
        save_distributed_checkpoint: Save each process's shard to a folder per checkpoint (fast for
            very large models). By default every checkpoint is one consolidated file, assembled on
            rank 0, which a single device (``python -m project test --ckpt_path=...``) can read, and
            from which ``fsdp`` resumes as well.
    """

    strategy_name = "fsdp"

    def __init__(self, save_distributed_checkpoint: bool = False) -> None:
        super().__init__(tensor_parallel_size=1, save_distributed_checkpoint=save_distributed_checkpoint)
        # The FSDP units (name, the network's modules, parameter count), for timing.json's parallel_plan.
        self.parallel_plan: dict[str, Any] | None = None

    def setup_environment(self) -> None:
        # ModelParallelStrategy's "auto" would shard across nodes only; FSDP shards across every process.
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def setup(self, trainer: pl.Trainer) -> None:
        evaluate_under_no_grad(trainer)
        # After the module's configure_model (which may compile the network in place) and before the
        # optimizers are built, so that they hold the sharded parameters.
        module = self.lightning_module
        check_module(module, "fsdp")
        if not isinstance(module.net, FSDPModule):  # setup runs again for validate/test/predict after fit
            blocks = module_blocks(module, "fsdp")
            units = shard_network(module.net, blocks, self.device_mesh["data_parallel"])
            self.parallel_plan = {"units": units}
            log.info(describe_units(units, self.world_size))
        super().setup(trainer)

    def process_dataloader(self, dataloader: object) -> object:
        """Refuse, rather than hang on, data that gives the processes different numbers of batches: every
        forward pass is collective under FSDP, so a process that ran out of batches would leave the others
        waiting forever. (The data module's val/test loaders always split evenly; see EvenBatchSampler.)"""
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
        strategy_registry.register(
            "fsdp", cls, description="FSDP2 (fully_shard) on CPUs or GPUs, one shard per process", override=True
        )

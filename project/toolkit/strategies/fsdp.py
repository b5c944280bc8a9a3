"""``fsdp``: fully sharded data parallel that runs on CPUs (gloo) as well as on GPUs (NCCL).

Lightning's own ``FSDPStrategy`` wraps torch's first FSDP, which refuses CPUs, and Lightning refuses
the name ``fsdp`` without a GPU. This strategy uses FSDP2 (``torch.distributed.fsdp.fully_shard``)
through Lightning's ``ModelParallelStrategy`` instead, with every process in one data-parallel group
and no tensor parallelism: plain FSDP. The strategy shards the module's network (``net``, see
:mod:`project.toolkit.strategies.contract`) when it sets the module up, block by block and then the root;
parameters, gradients and optimizer state are split across the processes, and each block's full
parameters are gathered only while it computes.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.distributed
from lightning.fabric.utilities.data import has_len
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torchvision.models import mobilenetv2, mobilenetv3, resnet, shufflenetv2

from project.toolkit.compat import StrategyRegistryType, release_fsdp_name
from project.toolkit.errors import ProjectError
from project.toolkit.strategies.contract import check_module

# The repeated blocks of torchvision's classifiers: FSDP makes each one a unit of its own, so only one
# block's full parameters exist at a time on a rank while it computes.
SHARDED_BLOCKS = (
    mobilenetv2.InvertedResidual,
    mobilenetv3.InvertedResidual,
    resnet.BasicBlock,
    resnet.Bottleneck,
    shufflenetv2.InvertedResidual,
)


def shard_network(net: nn.Module, mesh: DeviceMesh) -> None:
    """Shard ``net`` in place with FSDP2: every block of :data:`SHARDED_BLOCKS`, then the rest of the
    network as the root unit. A network sharded already is left as it is (setup runs again for
    validate/test/predict after fit)."""
    if isinstance(net, FSDPModule):
        return
    # FSDP2 shards contiguous parameters only. The images stay channels_last (the module's
    # prepare_images), and a convolution follows its input's memory layout.
    net.to(memory_format=torch.contiguous_format)
    for block in net.modules():
        if isinstance(block, SHARDED_BLOCKS):
            fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)


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

    def setup_environment(self) -> None:
        # ModelParallelStrategy's "auto" would shard across nodes only; FSDP shards across every process.
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def setup(self, trainer: pl.Trainer) -> None:
        # After the module's configure_model (which may compile the network in place) and before the
        # optimizers are built, so that they hold the sharded parameters.
        module = self.lightning_module
        check_module(module, "fsdp")
        shard_network(module.net, self.device_mesh["data_parallel"])
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
    def register_strategies(cls, strategy_registry: StrategyRegistryType) -> None:
        strategy_registry.register(
            "fsdp", cls, description="FSDP2 (fully_shard) on CPUs or GPUs, one shard per process", override=True
        )
        release_fsdp_name()  # Lightning would refuse `fsdp` off CUDA, taking it for its own FSDPStrategy

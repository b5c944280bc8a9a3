"""``fsdp``: fully sharded data parallel that runs on CPUs (gloo) as well as on GPUs (NCCL).

Lightning's own ``FSDPStrategy`` wraps torch's first FSDP, which refuses CPUs, and Lightning refuses
the name ``fsdp`` without a GPU. This strategy uses FSDP2 (``torch.distributed.fsdp.fully_shard``)
through Lightning's ``ModelParallelStrategy`` instead, with every process in one data-parallel group
and no tensor parallelism: plain FSDP. The model shards itself in ``configure_model``
(:meth:`project.model.ImageClassifier.configure_model`); parameters, gradients and optimizer state are
split across the processes, and each block's full parameters are gathered only while it computes.
"""

from __future__ import annotations

import torch.distributed
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.data import has_len
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from project.errors import ProjectError


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
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            "fsdp", cls, description="FSDP2 (fully_shard) on CPUs or GPUs, one shard per process", override=True
        )
        # Lightning refuses `fsdp` off CUDA by looking the name up in FSDPStrategy's own list of names;
        # the name is ours now, so it leaves that list (FSDPStrategy keeps its `fsdp_cpu_offload` name).
        if "fsdp" in FSDPStrategy._registered_strategies:
            FSDPStrategy._registered_strategies.remove("fsdp")

"""``pipeline``: one stage of the network per process, micro-batches pipelined with ``torch.distributed.pipelining``
(GPipe or 1F1B). Every process reads the same global batch; the last stage broadcasts the loss and predicted classes,
so metrics are right on every rank. A checkpoint is the whole network (one file) and every stage's optimizer state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.optim import Optimizer

from project.toolkit.blocks import Block, check_covers, module_blocks, short_count
from project.toolkit.errors import ProjectError
from project.toolkit.interfaces import StrategyLayout, data_settings, image_channels
from project.toolkit.log import get_logger
from project.toolkit.strategies.contract import StepsThroughView, check_module, module_view
from project.toolkit.strategies.stages import block_costs, build_stage, plan_split, release_other_stages
from project.toolkit.timing.bubble import BubbleMeter

log = get_logger(__name__)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]  # what activations may travel as


class TimedStage(PipelineStage):
    """torch's PipelineStage whose forward and backward of each micro-batch count as the stage's compute."""

    def __init__(self, meter: BubbleMeter, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.meter = meter

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self.meter.compute():
            return super().forward_one_chunk(*args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self.meter.compute():
            return super().backward_one_chunk(*args, **kwargs)


class PipelineStrategy(StepsThroughView, DDPStrategy):
    """One stage of the network per process, micro-batches pipelined through them; registered as ``pipeline``.

    Args:
        micro_batches: Micro-batches each global batch is split into (it must divide); 1: plain model parallelism.
        schedule: ``gpipe`` (all forwards, then all backwards) or ``1f1b`` (less activation memory).
        split: The block each stage after the first starts at, comma-separated (e.g. ``layer3``); null: by FLOPs.
        process_group_backend: As for ddp: nccl on GPUs, gloo on CPUs by default.
    """

    strategy_name = "pipeline"

    def __init__(
        self,
        micro_batches: int = 4,
        schedule: str = "gpipe",
        split: str | None = None,
        process_group_backend: str | None = None,
    ) -> None:
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ProjectError(
                f"trainer.strategy.micro_batches={micro_batches!r} is not allowed: it must be an integer >= 1"
            )
        if schedule not in SCHEDULES:
            raise ProjectError(
                f"trainer.strategy.schedule={schedule!r} is not a schedule; choose one of: {', '.join(SCHEDULES)}"
            )
        super().__init__(process_group_backend=process_group_backend)
        self.micro_batches, self.schedule_name, self.split = micro_batches, schedule, split
        self._stage_module: torch.nn.Module | None = None
        self._schedule: Any = None
        self._full_keys: list[str] = []
        self._own_blocks: list[Block] = []
        self.parallel_plan: dict[str, Any] | None = None  # the stages, for timing.json
        self._gradients: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = []
        self._loss: torch.Tensor | None = None  # the step's loss, as training_loss returned it
        self._meter: BubbleMeter | None = None

    def set_world_ranks(self) -> None:
        # Called as soon as the devices are known: one device is refused before any process starts.
        processes = self.num_nodes * self.num_processes
        if processes < 2:
            raise ProjectError(
                f"--trainer.strategy=pipeline splits the network across 2 or more devices; this run has "
                f"{processes}: set --trainer.devices=2 (or more), or use a single-device strategy"
            )
        super().set_world_ranks()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Every stage reads the whole global batch: one data-parallel replica."""
        return {"num_replicas": 1, "rank": 0}

    def layout(self) -> StrategyLayout:
        """Every process sees every sample; the stages, and once fit set it up, this rank's bubble meter."""
        return StrategyLayout(sample_copies=self.world_size, parallel_plan=self.parallel_plan, bubble=self._meter)

    @property
    def is_last(self) -> bool:
        return self.global_rank == self.world_size - 1

    def setup(self, trainer: pl.Trainer) -> None:
        self.accelerator.setup(trainer)
        module = self.lightning_module
        check_module(module, "pipeline")
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            _check_training_settings(trainer, module, self.precision_plugin)
            if (batch := data_settings(trainer).get("batch_size")) and batch % self.micro_batches:
                raise ProjectError(
                    f"data.batch_size={batch} does not split into trainer.strategy.micro_batches={self.micro_batches} "
                    f"equal micro-batches; use a multiple of {self.micro_batches}"
                )
        if self._stage_module is None:
            self._split(module, trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self._stage_module = build_stage(self._own_blocks, module.prepare_images, self.is_last)
        if fitting:
            self._meter = BubbleMeter(self.root_device)
            stage = TimedStage(self._meter, self._stage_module, self.global_rank, self.world_size, self.root_device)
            loss = self._meter.timed_loss(module.criterion)
            self._schedule = SCHEDULES[self.schedule_name](stage, n_microbatches=self.micro_batches, loss_fn=loss)
            self.setup_optimizers(trainer)  # the parameters of this rank's stage only
        self.setup_precision_plugin()
        # The steps run through a view in which the pipeline does the loss and the forward.
        self.module_view = module_view(module, training_loss=self._training_loss, forward=self._forward)

    def _split(self, module: pl.LightningModule, trainer: pl.Trainer) -> None:
        """Plan the stages, keep this rank's blocks in the network and release the others."""
        blocks = module_blocks(module, "pipeline")
        check_covers(module.net, blocks, "pipeline")
        image_size = data_settings(trainer).get("image_size")
        costs = block_costs(blocks, image_size, image_channels(trainer))
        plan = plan_split(blocks, costs, self.world_size, self.split)
        parameters = [[p for b in stage for p in b.module.parameters()] for stage in plan]
        if trainer.state.fn == TrainerFn.FITTING and (
            frozen := [i for i, ps in enumerate(parameters) if ps and not any(p.requires_grad for p in ps)]
        ):  # every rank sees it: each refuses, none waits on another
            raise ProjectError(
                f"pipeline stage(s) {frozen} would have no parameter to train (a frozen backbone: "
                "--model.freeze_backbone=true?); train it on one device, ddp or fsdp"
            )
        cost_of = {b.name: cost for b, cost in zip(blocks, costs, strict=True)}
        stage_costs = [sum(cost_of[b.name] for b in stage) for stage in plan]  # FLOPs, or parameters
        self._own_blocks = plan[self.global_rank]
        self._full_keys = list(module.state_dict())
        stages = [
            {
                "blocks": [b.name for b in stage],
                "modules": [path for b in stage for path in b.paths],
                "parameters": sum(b.parameter_count for b in stage),
                "cost_share": round(cost / sum(stage_costs), 4),
            }
            for stage, cost in zip(plan, stage_costs, strict=True)
        ]
        balance = "named" if self.split else ("flops" if image_size else "parameters")
        self.parallel_plan = {"stages": stages, "split_by": balance}
        release_other_stages(module.net, blocks, self._own_blocks)
        log.info(self.describe_plan())

    def describe_plan(self) -> str:
        """The stages in a few console lines: each one's blocks, parameter count and share of the cost."""
        plan = self.parallel_plan or {"stages": [], "split_by": ""}
        split_by = {"named": "named by trainer.strategy.split", "flops": "balanced by FLOPs"}
        lines = [
            f"pipeline plan: {len(plan['stages'])} stages, {self.micro_batches} micro-batch(es), "
            f"{self.schedule_name}, {split_by.get(plan['split_by'], 'balanced by parameters')}:"
        ]
        for i, stage in enumerate(plan["stages"]):
            names = stage["blocks"]
            span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
            lines.append(
                f"  stage {i}: {span} ({len(names)} block(s), {short_count(stage['parameters'])} parameters, "
                f"{100 * stage['cost_share']:.0f}% of the cost)"
            )
        return "\n".join(lines)

    def _training_loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One schedule step (forward and backward of every micro-batch); the last stage's mean loss and classes."""
        if len(labels) % self.micro_batches:
            raise ProjectError(
                f"a batch of {len(labels)} images does not split into trainer.strategy.micro_batches="
                f"{self.micro_batches} equal micro-batches; use a data.batch_size that is a multiple of it "
                "(with drop_last, every training batch then is)"
            )
        parameters = [p for p in self._stage_module.parameters() if p.requires_grad]
        for p in parameters:  # the stage accumulates into .grad: start from none
            p.grad = None
        losses: list[torch.Tensor] = []
        args = (images,) if self.global_rank == 0 else ()  # the first stage takes the images, the last the labels
        kwargs = {"target": labels, "losses": losses} if self.is_last else {}
        logits = self._meter.step(lambda: self._schedule.step(*args, **kwargs))
        # Lightning zeroes the gradients between the training step and its backward: kept aside until then.
        self._gradients = [(p, p.grad) for p in parameters]
        payload = torch.empty(1 + len(labels), device=self.root_device)
        if self.is_last:
            payload[0] = torch.stack([loss.detach() for loss in losses]).mean()
            payload[1:] = logits.detach().argmax(dim=1)
        with self._meter.communication():
            dist.broadcast(payload, src=self.world_size - 1)
        self._loss = payload[0]
        return self._loss, payload[1:].long()

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's step, refused in one line where the loss it returns is not the one the schedule trained."""
        output, module = super().training_step(*args, **kwargs), type(self.lightning_module).__name__
        loss = output.get("loss") if isinstance(output, Mapping) else output
        if loss is not None and loss is not self._loss:  # on every rank alike: each refuses, none waits
            raise ProjectError(
                f"--trainer.strategy=pipeline trains the loss `training_loss(images, labels)` returns, as is; {module}"
                ".training_step returned another (a regulariser? a loss of self(images)?): put it in criterion, or ddp"
            )
        return output

    def backward(
        self, closure_loss: torch.Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """The schedule's step ran the backward of every micro-batch already; its gradients go back in place."""
        for p, grad in self._gradients:
            p.grad = grad
        self._gradients = []
        return closure_loss

    def _forward(self, images: torch.Tensor) -> torch.Tensor:
        """Evaluation: the whole batch through the stages in turn, the logits broadcast from the last stage."""
        rank = self.global_rank
        x = images if rank == 0 else _recv(rank - 1, self.root_device)
        y = self._stage_module(x)
        if not self.is_last:
            _send(y, rank + 1, self.root_device)
        return _broadcast(y if self.is_last else None, self.world_size - 1, self.root_device)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The whole network's state on rank 0, gathered from the stages in the network's key order (collective)."""
        local = move_data_to_device(self.lightning_module.state_dict(), "cpu")
        if not self._full_keys:
            return local
        stages: list[Any] | None = [None] * self.world_size if self.is_global_zero else None
        dist.gather_object(local, stages, dst=0)
        if not self.is_global_zero:
            return local
        merged = {k: v for stage in stages for k, v in stage.items()}
        return {k: merged[k] for k in self._full_keys if k in merged} | merged

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Load this rank's slice of a whole network's state (the full network, before the split)."""
        own = self.lightning_module.state_dict().keys()
        self.lightning_module.load_state_dict({k: v for k, v in checkpoint["state_dict"].items() if k in own}, strict)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """Every stage's optimizer state, as ``{"pipeline_stages": [stage 0's, stage 1's, ...]}`` on rank 0."""
        local = move_data_to_device(super().optimizer_state(optimizer), "cpu")
        stages: list[Any] | None = [None] * self.world_size if self.is_global_zero else None
        dist.gather_object(local, stages, dst=0)
        return {"pipeline_stages": stages} if self.is_global_zero else local

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"], strict=False):
            stages = state.get("pipeline_stages") if isinstance(state, Mapping) else None
            if stages is None or len(stages) != self.world_size:
                found = f"{len(stages)} stages" if stages is not None else "no pipeline stages"
                raise ProjectError(
                    f"this checkpoint's optimizer state has {found}; a pipeline run resumes only from a checkpoint "
                    f"of a pipeline run with as many devices ({self.world_size}); a single device can test it"
                )
            optimizer.load_state_dict(stages[self.global_rank])  # moves the state to the parameters' device

    def teardown(self) -> None:
        self._schedule = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        description = "the network split into stages, micro-batches pipelined"
        strategy_registry.register("pipeline", cls, description=description, override=True)


def _check_training_settings(trainer: pl.Trainer, module: pl.LightningModule, precision: Any) -> None:
    """Refuse what the pipeline's own backward would silently get wrong."""
    if not module.automatic_optimization:
        raise ProjectError("--trainer.strategy=pipeline runs the backward itself: it needs automatic optimization")
    if trainer.accumulate_grad_batches != 1:
        raise ProjectError(
            f"trainer.accumulate_grad_batches={trainer.accumulate_grad_batches} is not supported by "
            "--trainer.strategy=pipeline; raise trainer.strategy.micro_batches and data.batch_size instead"
        )
    if getattr(precision, "scaler", None) is not None:
        raise ProjectError("--trainer.precision=16-mixed (loss scaling) is not supported by pipeline; use bf16-mixed")
    if trainer.gradient_clip_val and trainer.gradient_clip_algorithm != "value":
        raise ProjectError(
            "trainer.gradient_clip_val clips by norm, which each stage would compute over its own parameters only; "
            "with --trainer.strategy=pipeline use --trainer.gradient_clip_algorithm=value"
        )


def _header(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor's rank, shape (up to 6 dimensions) and dtype, as 8 integers."""
    return torch.tensor([t.dim(), *t.shape, *[0] * (6 - t.dim()), _DTYPES.index(t.dtype)], device=device)


def _from_header(header: torch.Tensor, device: torch.device) -> torch.Tensor:
    values = header.tolist()
    return torch.empty(values[1 : 1 + values[0]], dtype=_DTYPES[values[7]], device=device)


def _send(t: torch.Tensor, dst: int, device: torch.device) -> None:
    dist.send(_header(t, device), dst)
    dist.send(t.contiguous(), dst)


def _recv(src: int, device: torch.device) -> torch.Tensor:
    header = torch.empty(8, dtype=torch.int64, device=device)
    dist.recv(header, src)
    dist.recv(t := _from_header(header, device), src)
    return t


def _broadcast(t: torch.Tensor | None, src: int, device: torch.device) -> torch.Tensor:
    header = _header(t, device) if t is not None else torch.empty(8, dtype=torch.int64, device=device)
    dist.broadcast(header, src)
    out = t.contiguous() if t is not None else _from_header(header, device)
    dist.broadcast(out, src)
    return out

"""What the step anatomy observes inside a step, through public hooks while its window is open: the optimizer
step's end, ddp's last all-reduces, fsdp's pre-forward all-gathers, and a pipeline's schedule (docs/timing.md)."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.optim.optimizer import register_optimizer_step_post_hook

from project.toolkit.interfaces import layout_of
from project.toolkit.log import get_logger
from project.toolkit.timing.anatomy import AnatomyWindow

log = get_logger(__name__)


def _while_open(window: AnatomyWindow, install: Any) -> None:
    handles: list[Any] = []
    window.on_open.append(lambda: handles.extend(install()))

    def remove() -> None:
        while handles:
            handles.pop().remove()

    window.on_close.append(remove)


class DDPProbe:
    """ddp's end-of-backward wait: from the last bucket handed to the all-reduce to the backward's end."""

    def __init__(self, window: AnatomyWindow, ddp: nn.parallel.DistributedDataParallel) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.window = window
        self.last_launch: Any = None

        # no annotations: DDP checks a hook's ``bucket`` annotation, and this module's are strings
        def hook(process_group, bucket):  # type: ignore[no-untyped-def]
            if window.open:
                self.last_launch = window.mark()
            return allreduce_hook(process_group, bucket)

        ddp.register_comm_hook(ddp.process_group, hook)

    def backward_ended(self, end: Any) -> None:
        if self.last_launch is not None:
            self.window.mark_interval("communication", self.last_launch, end)
            self.last_launch = None


def _fsdp_gathers(window: AnatomyWindow, net: nn.Module) -> None:
    """Each FSDP2 unit's pre-forward all-gather as communication: hooks before and after FSDP's own."""
    units = [module for module in net.modules() if isinstance(module, FSDPModule)]
    if not units:
        return
    starts: dict[nn.Module, Any] = {}

    def start(module: nn.Module, args: Any) -> None:
        starts[module] = window.mark()

    def end(module: nn.Module, args: Any) -> None:
        if module in starts:
            window.mark_interval("communication", starts.pop(module), window.mark())

    def install() -> list[Any]:
        handles = [unit.register_forward_pre_hook(start, prepend=True) for unit in units]
        return handles + [unit.register_forward_pre_hook(end) for unit in units]

    _while_open(window, install)


def attach(window: AnatomyWindow, trainer: Any, pl_module: nn.Module) -> DDPProbe | None:
    """Attach the probes that fit this run to ``window`` (model wrapped, no backward yet); returns ddp's, if any."""
    strategy = trainer.strategy
    _while_open(window, lambda: [register_optimizer_step_post_hook(lambda *args: window.point("optimizer_end"))])
    ddp_probe = None
    model = getattr(strategy, "model", None)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        try:
            ddp_probe = DDPProbe(window, model)
        except RuntimeError as err:  # a communication hook of the user's is registered already
            log.warning("step anatomy: ddp's all-reduce wait is not measured (%s)", err)
    net = getattr(pl_module, "net", None)
    if isinstance(net, nn.Module):
        _fsdp_gathers(window, net)
    meter = layout_of(strategy).bubble
    if meter is not None:
        window.on_open.append(lambda: setattr(meter, "observer", window))
        window.on_close.append(lambda: setattr(meter, "observer", None))
    return ddp_probe

"""What the step anatomy (:mod:`project.toolkit.measure.anatomy`) observes inside a step, per strategy: the
end of the optimizer's step, the communication waits, and a pipeline's schedule.

Every probe is installed when the window opens and removed when it closes, so outside the window the run
is the same as without it; the one exception is ddp's communication hook, which DDP accepts only once, before
the first backward, and which outside the window just calls torch's own all-reduce hook (the all-reduce DDP
runs without a hook, called from Python: a few microseconds per bucket).

What counts as a communication wait (exposed communication), by strategy:

- ddp: the end of the backward from the moment the last gradient bucket was handed to its all-reduce
  (DDP's communication hook) to the backward's end, which is where DDP waits for the all-reduces still
  running (those that finished while the backward computed are hidden, and not counted); plus the buffers
  DDP broadcasts at each forward (BatchNorm statistics; ``torch.distributed._broadcast_coalesced``);
- fsdp (FSDP2): each parameter group's all-gather (``unshard``, ``wait_for_unshard``), its gradients'
  reduce-scatter (``post_backward``) and the end-of-backward wait for it (the root's final callback),
  including their buffer copies. On a CPU (gloo) these collectives block the process, so all of their time
  is exposed; on a GPU they run on their own streams, and the marks on the compute stream time only the
  compute stream's wait for them;
- dp (2 or more GPUs): DataParallel's scatter, replicate and gather (the gradients' reduction onto the
  root GPU stays in the backward);
- pipeline: the broadcast of each batch's loss and predictions; the stage's sends and receives are inside
  the schedule's step, whose time outside the stage's compute is the bubble (the strategy's
  :class:`~project.toolkit.measure.bubble.BubbleMeter` reports its schedule and compute to the window);
- any strategy: the synchronous collectives of ``torch.distributed`` called by name during the window
  (``broadcast``, ``all_reduce``, ``barrier``, ...).

These hooks touch torch's private names (FSDP2's ``FSDPParamGroup`` and ``FSDPState``); where one is
missing (another torch), its probe is left out, logged once, and that strategy's communication stays
inside its compute.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from project.toolkit.log import get_logger
from project.toolkit.measure.anatomy import AnatomyWindow

log = get_logger(__name__)

# Synchronous collectives of torch.distributed looked up by name at call time (by Lightning, DDP's buffer
# broadcast, the pipeline, FSDP2); an async call (async_op=True) returns at once and is not timed.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "_broadcast_coalesced",
    "barrier",
    "gather",
    "scatter",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
)
FSDP_GROUP_METHODS = ("unshard", "wait_for_unshard", "post_backward")
FSDP_STATE_METHODS = ("_root_post_backward_final_callback",)
DATA_PARALLEL_METHODS = ("scatter", "replicate", "gather")


def _timed(window: AnatomyWindow, function: Callable[..., Any], skip_async: bool = False) -> Callable[..., Any]:
    """``function`` with its calls timed as communication waits of the window."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if skip_async and kwargs.get("async_op"):
            return function(*args, **kwargs)
        with window.waiting():
            return function(*args, **kwargs)

    return wrapper


def _patch(window: AnatomyWindow, owner: Any, names: tuple[str, ...], skip_async: bool = False) -> None:
    """While the window is open: each of ``owner``'s ``names`` it has, timed (an attribute set on the
    object, removed again at the close: the class's own method shows through)."""
    present = [n for n in names if callable(getattr(owner, n, None))]
    module_level = isinstance(owner, type(dist))
    originals = {n: getattr(owner, n) for n in present} if module_level else {}

    def install() -> None:
        for name in present:
            setattr(owner, name, _timed(window, getattr(owner, name), skip_async))

    def remove() -> None:
        for name in present:
            if module_level:
                setattr(owner, name, originals[name])
            else:
                owner.__dict__.pop(name, None)

    window.on_open.append(install)
    window.on_close.append(remove)


def _optimizer_end(window: AnatomyWindow) -> None:
    """The end of every optimizer step, through torch's global post-step hook, while the window is open."""
    handles: list[Any] = []

    def install() -> None:
        hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: window.point("optimizer_end"))
        handles.append(hook)

    def remove() -> None:
        while handles:
            handles.pop().remove()

    window.on_open.append(install)
    window.on_close.append(remove)


class DDPProbe:
    """ddp's end-of-backward wait: from the last bucket handed to the all-reduce to the backward's end."""

    def __init__(self, window: AnatomyWindow, ddp: nn.parallel.DistributedDataParallel) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.window = window
        self.last_launch: Any = None

        # No annotations: DDP checks that a hook's ``bucket`` is annotated, if at all, as dist.GradBucket,
        # and this module's annotations are strings.
        def hook(process_group, bucket):  # type: ignore[no-untyped-def]
            if window.open:
                self.last_launch = window.mark()
            return allreduce_hook(process_group, bucket)

        ddp.register_comm_hook(ddp.process_group, hook)

    def backward_ended(self, end: Any) -> None:
        if self.last_launch is not None:
            self.window.mark_interval("communication", self.last_launch, end)
            self.last_launch = None


def _fsdp_parts(net: nn.Module) -> tuple[list[Any], list[Any]] | None:
    """FSDP2's parameter groups and states of ``net``, or None where torch lays them out otherwise."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    groups, states = [], []
    for module in net.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        found = getattr(state, "_fsdp_param_groups", None)
        if found is None:
            single = getattr(state, "_fsdp_param_group", None)
            found = [single] if single is not None else []
        groups += [g for g in found if g not in groups]
        states.append(state)
    if not groups or not all(callable(getattr(g, n, None)) for g in groups for n in FSDP_GROUP_METHODS):
        return None
    return groups, states


def attach(window: AnatomyWindow, trainer: Any, pl_module: nn.Module) -> DDPProbe | None:
    """Attach every probe that fits this run to ``window`` (on its open and close lists); returns ddp's
    probe, which the timing callback tells where each backward ended. Call once the strategy has wrapped
    the model and before the first training backward (``on_train_start``)."""
    strategy = trainer.strategy
    _optimizer_end(window)
    ddp_probe = None
    if trainer.world_size > 1:
        _patch(window, dist, COLLECTIVES, skip_async=True)
    model = getattr(strategy, "model", None)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        try:
            ddp_probe = DDPProbe(window, model)
        except RuntimeError as err:  # a communication hook of the user's is registered already
            log.warning("step anatomy: ddp's all-reduce wait is not measured (%s)", err)
    # The network the steps call: dp's DataParallel lives in the strategy's view of the module, not on it.
    view = getattr(strategy, "module_view", None)
    net = getattr(view if view is not None else pl_module, "net", None)
    if isinstance(net, nn.Module):
        fsdp = _fsdp_parts(net)
        if fsdp is not None:
            for group in fsdp[0]:
                _patch(window, group, FSDP_GROUP_METHODS)
            for state in fsdp[1]:
                _patch(window, state, FSDP_STATE_METHODS)
        if isinstance(net, nn.DataParallel) and len(net.device_ids) > 1:
            _patch(window, net, DATA_PARALLEL_METHODS)
    meter = getattr(strategy, "bubble_meter", None)
    if meter is not None:
        window.on_open.append(lambda: setattr(meter, "observer", window))
        window.on_close.append(lambda: setattr(meter, "observer", None))
    return ddp_probe

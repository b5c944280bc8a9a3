"""What the template's own strategies need of a LightningModule: the attributes of :class:`ParallelizableModule`
(:data:`REQUIRED` says which strategy needs which), checked in one ``error:`` line when a strategy sets the module
up; :class:`project.model.ImageClassifier` has them all. No strategy writes on the module: one that changes its steps
does it through a *view* (:func:`module_view`), an instance of a subclass holding the replacements that shares the
module's ``__dict__``, so ``self.log`` and the metrics act on the module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from lightning.pytorch import LightningModule
from torch import nn

from project.toolkit.errors import ProjectError

EVERY = ("net", "criterion", "prepare_images", "training_loss")  # what dp_balanced and pipeline need
REQUIRED: dict[str, tuple[str, ...]] = {"dp": ("net",), "dp_balanced": EVERY, "fsdp": ("net",), "pipeline": EVERY}


@runtime_checkable
class ParallelizableModule(Protocol):
    """A LightningModule that ``dp``, ``dp_balanced``, ``fsdp`` and ``pipeline`` can run. Optional too:
    ``network_blocks() -> [(name, module), ...]``, the blocks ``fsdp`` and ``pipeline`` split ``net`` at."""

    net: nn.Module  # the network: dp wraps it, fsdp shards it, pipeline splits it into stages of blocks
    criterion: nn.Module  # mean loss(logits, labels): dp_balanced runs it in each replica, pipeline on its last stage

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor: ...  # what forward does before net

    # (mean loss, predicted classes); dp_balanced, pipeline replace it (pipeline also forward: net(prepare_images))
    def training_loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def check_module(module: object, strategy_name: str) -> None:
    """Refuse, in one line, a module that lacks what ``strategy_name`` needs of it."""
    needed = REQUIRED[strategy_name]
    missing = [name for name in needed if not hasattr(module, name)]
    if not missing and isinstance(module.net, nn.Module):
        return
    what = {"net": "its network in `net` (an nn.Module)", "criterion": "its loss in `criterion`"}
    what |= {"prepare_images": "`prepare_images(images)`", "training_loss": "`training_loss(images, labels)`"}
    lacking = " and ".join(f"`{name}`" for name in missing) or "`net` that is an nn.Module"
    raise ProjectError(
        f"--trainer.strategy={strategy_name} needs a LightningModule with {', '.join(what[n] for n in needed)}; "
        f"{type(module).__name__} has no {lacking} (see project/toolkit/strategies/contract.py); "
        "or use ddp, which works with any LightningModule"
    )


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def module_view(module: ModuleT, **replacements: Any) -> ModuleT:
    """A view of ``module`` whose ``replacements`` take the place of its attributes: callables are called
    without the view (``staticmethod``), anything else (a network) is returned as is."""
    cls = type(module)
    attributes = {
        name: staticmethod(value) if callable(value) and not isinstance(value, nn.Module) else value
        for name, value in replacements.items()
    }
    view = object.__new__(type(f"{cls.__name__}View", (cls,), {**attributes, "__module__": cls.__module__}))
    object.__setattr__(view, "__dict__", module.__dict__)  # the module's own state, not a copy
    return view


def _through_view(name: str, context: str) -> Callable[..., Any]:
    """A strategy's ``name`` step: the view's (or the module's) step, in the precision plugin's ``context``."""

    def step(self: StepsThroughView, *args: Any, **kwargs: Any) -> Any:
        with getattr(self.precision_plugin, context)():
            steps = self.module_view if self.module_view is not None else self.lightning_module
            return getattr(steps, name)(*args, **kwargs)

    return step


class StepsThroughView:
    """A strategy mixin: the steps run through ``self.module_view`` (the module itself while it is None)."""

    module_view: LightningModule | None = None
    precision_plugin: Any
    lightning_module: LightningModule | None
    training_step = _through_view("training_step", "train_step_context")
    validation_step = _through_view("validation_step", "val_step_context")
    test_step = _through_view("test_step", "test_step_context")
    predict_step = _through_view("predict_step", "predict_step_context")

    def teardown(self) -> None:
        self.module_view = None
        super().teardown()  # type: ignore[misc]

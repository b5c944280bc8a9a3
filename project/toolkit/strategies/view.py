"""How a strategy changes a LightningModule's steps without writing on the module: through a *view*, an instance of a
subclass holding the replacements that shares the module's ``__dict__``: ``self.log`` and metrics act on the module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning.pytorch import LightningModule
from torch import nn

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

"""How a strategy changes what a LightningModule's steps do without writing on the module: it runs the
steps through a *view* of the module.

``dp`` needs the steps to call the network through ``nn.DataParallel``, ``dp_balanced`` the loss computed in
the replicas, ``pipeline`` the forward and the training loss through its stages. Setting those on the user's
module object (``module.training_loss = ...``) would change it for everyone who holds it, for as long as the
run lasts, and leave it changed if the run dies before its teardown. A view is a second object instead: an
instance of a subclass of the module's class in which the strategy's replacements are class attributes,
sharing the module's ``__dict__`` -- its parameters, submodules, metrics, trainer -- so that everything the
step does (``self.log``, metric updates) acts on the module itself. The strategy calls ``view.training_step``
(and the evaluation steps); the module object is never written to, and its class is never changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning.pytorch import LightningModule
from torch import nn

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def module_view(module: ModuleT, **replacements: Any) -> ModuleT:
    """A view of ``module`` whose ``replacements`` (by attribute name) take the place of the module's own:
    callables are called without the view (``staticmethod``), anything else (a network) is returned as is.

    >>> import torch
    >>> net = nn.Linear(2, 2)
    >>> view = module_view(net, forward=lambda x: x * 0)
    >>> view(torch.ones(1, 2)).tolist(), view.weight is net.weight, "forward" in vars(net)
    ([[0.0, 0.0]], True, False)
    """
    cls = type(module)
    attributes = {
        name: staticmethod(value) if callable(value) and not isinstance(value, nn.Module) else value
        for name, value in replacements.items()
    }
    view_class = type(f"{cls.__name__}View", (cls,), {**attributes, "__module__": cls.__module__})
    view = object.__new__(view_class)
    object.__setattr__(view, "__dict__", module.__dict__)  # the module's own state, not a copy
    return view


class StepsThroughView:
    """A strategy mixin: the training, validation, test and predict steps run through ``self.module_view``
    (set by the strategy's ``setup``, dropped at its teardown; the module itself while it is None)."""

    module_view: LightningModule | None = None
    precision_plugin: Any
    lightning_module: LightningModule | None

    def _steps_of(self) -> LightningModule:
        return self.module_view if self.module_view is not None else self.lightning_module

    def _step(self, context: Callable[[], Any], name: str, *args: Any, **kwargs: Any) -> Any:
        with context():
            return getattr(self._steps_of(), name)(*args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step(self.precision_plugin.train_step_context, "training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step(self.precision_plugin.val_step_context, "validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step(self.precision_plugin.test_step_context, "test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step(self.precision_plugin.predict_step_context, "predict_step", *args, **kwargs)

    def teardown(self) -> None:
        self.module_view = None  # the run is over: nothing holds the view of the module any more
        super().teardown()  # type: ignore[misc]

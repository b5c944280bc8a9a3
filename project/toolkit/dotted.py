"""Objects named by dotted path (``package.module.name``): the model and data classes the command line
chooses, read before anything is built."""

from __future__ import annotations

import importlib
from typing import Any

from project.toolkit.errors import ProjectError


def import_object(dotted_path: str) -> Any:
    """The object a dotted path ``package.module.name`` names.

    >>> import_object("torch.nn.Linear").__name__
    'Linear'
    """
    module_name, _, name = dotted_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ProjectError(f"{dotted_path!r} cannot be imported ({err}); give package.module.name") from None


def chosen_class(section: Any) -> Any:
    """The class a config section given by class (``class_path``/``init_args``, LightningCLI's subclass
    mode) names; None for a plain section.

    >>> chosen_class({"class_path": "torch.nn.Linear", "init_args": {}}).__name__, chosen_class({"lr": 0.1})
    ('Linear', None)
    """
    class_path = section.get("class_path") if section is not None else None
    return import_object(class_path) if class_path else None


def section_args(section: Any) -> Any:
    """A config section's arguments: its ``init_args`` where the section names a class (``class_path``,
    LightningCLI's subclass mode), else the section itself; None for None.

    >>> section_args({"class_path": "x.Y", "init_args": {"lr": 0.1}}), section_args({"lr": 0.2})
    ({'lr': 0.1}, {'lr': 0.2})
    """
    return section.get("init_args") if section is not None and section.get("class_path") else section

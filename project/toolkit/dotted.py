"""Objects named by dotted path (``package.module.name``): the model and data classes the command line chooses."""

from __future__ import annotations

import importlib
from typing import Any

from project.toolkit.errors import ProjectError


def import_object(dotted_path: str) -> Any:
    """The object a dotted path ``package.module.name`` names."""
    module_name, _, name = dotted_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ProjectError(f"{dotted_path!r} cannot be imported ({err}); give package.module.name") from None


def chosen_class(section: Any) -> Any:
    """The class a config section names by ``class_path`` (LightningCLI's subclass mode); None for a plain one."""
    class_path = section.get("class_path") if section is not None else None
    return import_object(class_path) if class_path else None


def section_args(section: Any) -> Any:
    """A config section's arguments: its ``init_args`` where it names a class, else itself; None for None."""
    return section.get("init_args") if section is not None and section.get("class_path") else section

"""The settings a checkpoint was trained with, against the options of the command that uses it
(``--ckpt_path=...`` of ``fit``, ``validate``, ``test``, ``predict``).

LightningCLI rebuilds the model from the checkpoint's hyperparameters and lets them override the
command's, silently: ``test --ckpt_path=<a resnet50 checkpoint> --model.arch=mobilenet_v2`` tested
ResNet50. And it leaves the data settings alone: ``test --ckpt_path=<a 32 px fit>`` tested at the default
112 px. Here, before anything is built (:func:`adopt_checkpoint_settings`):

- a model setting given explicitly (on the command line, or different from its default in a config
  file) that disagrees with the checkpoint is refused in one line naming both; the run-time options
  :data:`RUN_OPTIONS` (``compile``, ``channels_last``: how the network runs, not what it computes)
  keep the value given;
- a model or data setting left at its default that the checkpoint trained with another value is taken
  from the checkpoint (the data settings of :data:`DATA_SETTINGS`, when the checkpoint's data set is the
  one chosen), and one line says which;
- a data setting given explicitly that differs from the checkpoint's is kept, and one line says so.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from project.toolkit.dotted import chosen_class, section_args
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger

log = get_logger(__name__)

# Model options that change how the network runs, not what it computes: the value given wins.
RUN_OPTIONS = ("compile", "channels_last")
# Data settings that make an evaluation (or a resumed fit) see data as the checkpoint's training did;
# where the files are and how they are loaded (data_dir, download, num_workers, on_device) stay the command's.
DATA_SETTINGS = ("image_size", "batch_size", "val_size", "split_seed", "synthetic", "synthetic_size")


def _defaults(cls: Any) -> dict[str, Any]:
    """The defaults of ``cls``'s constructor arguments."""
    try:
        parameters = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _section(config: Any, fallback_class: Any) -> tuple[Any, Any]:
    """A config section's arguments and class: ``class_path``/``init_args`` (subclass mode) or plain."""
    cls = chosen_class(config)
    return section_args(config), cls if cls is not None else fallback_class


def _differing(
    saved: dict[str, Any], args: Any, defaults: dict[str, Any], keys: Any, on_command_line: set[str]
) -> tuple[list, list]:
    """``(given, adopted)``: the keys whose value differs from the checkpoint's, split by whether the value
    was given (on the command line, or different from its default) or is the default."""
    given, adopted = [], []
    for key in keys:
        if key not in saved or args is None or key not in args or args[key] == saved[key]:
            continue
        explicit = key in on_command_line or key not in defaults or args[key] != defaults[key]
        (given if explicit else adopted).append(key)
    return given, adopted


def command_line_keys(argv: list[str], section: str) -> set[str]:
    """The keys of ``section`` (``model``, ``data``) that ``argv`` sets as options.

    >>> sorted(command_line_keys(["fit", "--model.arch=resnet50", "--model.init_args.lr", "0.1", "--data.x"], "model"))
    ['arch', 'lr']
    """
    keys = set()
    for word in argv:
        option = word.partition("=")[0]
        if option.startswith(f"--{section}."):
            keys.add(option.removeprefix(f"--{section}.").removeprefix("init_args."))
    return keys


def _pairs(prefix: str, values: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{prefix}.{key}={values[key]}" for key in keys)


def adopt_checkpoint_settings(
    config: Any, ckpt_path: str | Path, checkpoint: dict[str, Any], model_class: Any, argv: list[str]
) -> Callable[[Any], None]:
    """Check and adopt the settings the checkpoint at ``ckpt_path`` was trained with (see the module's
    docstring), editing the subcommand's parsed ``config``; ``argv`` is the command line. Returns a
    function to call on the config once LightningCLI has applied the checkpoint's model hyperparameters:
    it puts back the :data:`RUN_OPTIONS` that were given."""
    model_args, model_cls = _section(config.get("model"), model_class)
    saved_model = {k: v for k, v in (checkpoint.get("hyper_parameters") or {}).items() if not k.startswith("_")}
    given, adopted = _differing(
        saved_model, model_args, _defaults(model_cls), list(saved_model), command_line_keys(argv, "model")
    )
    kept = {key: model_args[key] for key in given if key in RUN_OPTIONS}
    conflicts = [key for key in given if key not in RUN_OPTIONS]
    if conflicts:
        raise ProjectError(
            f"--ckpt_path={ckpt_path} holds a model trained with {_pairs('model', saved_model, conflicts)}, but "
            f"{_pairs('--model', model_args, conflicts)} was given; leave the option out to use the checkpoint's, "
            "or pass a checkpoint trained with it"
        )
    notes = _pairs("model", saved_model, adopted)

    data_config = config.get("data")
    data_args, data_cls = _section(data_config, None)
    saved_data = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    same_data_set = data_config is not None and saved_data.get("_class_path") in (None, data_config.get("class_path"))
    if same_data_set and data_args is not None:
        given, adopted = _differing(
            saved_data, data_args, _defaults(data_cls), DATA_SETTINGS, command_line_keys(argv, "data")
        )
        for key in adopted:
            data_args[key] = saved_data[key]
        notes = ", ".join(filter(None, [notes, _pairs("data", saved_data, adopted)]))
        if given:
            log.warning(
                "--ckpt_path=%s was trained with %s; running with %s as given",
                ckpt_path,
                _pairs("data", saved_data, given),
                _pairs("data", data_args, given),
            )
    if notes:
        log.info("--ckpt_path=%s: taking the settings it was trained with: %s", ckpt_path, notes)

    def restore_run_options(applied: Any) -> None:
        args, _ = _section(applied.get("model"), model_class)
        for key, value in kept.items():
            args[key] = value

    return restore_run_options

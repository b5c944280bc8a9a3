"""The settings a checkpoint was trained with, against the options of the command using it (``--ckpt_path``).
LightningCLI silently overrides the model options given with the checkpoint's and leaves the data settings alone.
Here a model setting given that disagrees is refused (:data:`RUN_OPTIONS` aside), a data setting given is kept with
a warning, a setting left at its default is taken from the checkpoint, and :data:`BUILD_OPTIONS` are dropped."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from project.toolkit.dotted import chosen_class, section_args
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger

log = get_logger(__name__)

RUN_OPTIONS = ("compile", "compile_mode", "channels_last")  # how the network runs: the value given wins
BUILD_OPTIONS = ("weights",)  # what the network starts from: null with a checkpoint (no longer read, may be gone)
# What makes an evaluation see data as the checkpoint's training did (where and how it is loaded stay the command's).
DATA_SETTINGS = ("image_size", "resize_size", "interpolation", "channels", "batch_size", "val_size", "split_seed")
DATA_SETTINGS += ("synthetic", "synthetic_size")
LEARNED = ("classes", "mean", "std")  # what the model learned with, where the data set has it as options


def _section(config: Any, fallback_class: Any) -> tuple[Any, Any]:
    cls = chosen_class(config)
    return section_args(config), cls if cls is not None else fallback_class


def _differing(saved: dict, args: Any, cls: Any, keys: Any, argv: list[str], section: str) -> tuple[list, list]:
    """``(given, adopted)``: the keys whose value differs from the checkpoint's, given explicitly or by default."""
    defaults = init_defaults(cls)
    on_command_line, given, adopted = command_line_keys(argv, section), [], []
    for key in keys:
        if key not in saved or args is None or key not in args or args[key] == saved[key]:
            continue
        explicit = key in on_command_line or key not in defaults or args[key] != defaults[key]
        (given if explicit else adopted).append(key)
    return given, adopted


def init_defaults(cls: Any) -> dict[str, Any]:
    """The defaults of the ``__init__`` parameters of ``cls`` and of its bases (whose options a ``**kwargs`` passes
    on), the nearest class's first."""
    defaults: dict[str, Any] = {}
    for klass in [k for k in getattr(cls, "__mro__", ())[::-1] if "__init__" in vars(k)]:
        try:
            parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
        except (TypeError, ValueError):
            parameters = []
        defaults |= {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return defaults


def command_line_keys(argv: list[str], section: str) -> set[str]:
    """The keys of ``section`` (``model``, ``data``) that ``argv`` sets as options."""
    options, prefix = [word.partition("=")[0] for word in argv], f"--{section}."
    return {option.removeprefix(prefix).removeprefix("init_args.") for option in options if option.startswith(prefix)}


def _pairs(prefix: str, values: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{prefix}.{key}={values[key]}" for key in keys)


def adopt_data_set(config: Any, ckpt_path: str | Path, checkpoint: dict, argv: list[str], taken: bool = False) -> None:
    """The checkpoint's data set class and options in ``config`` (``taken``: its class is there already), unless
    ``--data=`` chooses one on the command line: ``test`` and ``predict`` see the data the model was trained on."""
    saved = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    class_path, data = saved.pop("_class_path", None), config.get("data")
    chosen = any(word.partition("=")[0] in ("--data", "--data.class_path") for word in argv)
    if class_path is None or chosen or data is None or (data.get("class_path") == class_path and not taken):
        return
    init_args = Namespace(**{key: value for key, value in saved.items() if not key.startswith("_")})
    parsed, given = section_args(data), sorted(command_line_keys(argv, "data"))
    kept = [key for key in given if parsed is not None and key in parsed and key in init_args]
    for key in kept:  # what the command line says of the data (--data.data_dir=NEW) holds for the checkpoint's too
        init_args[key] = parsed[key]
    config.data = Namespace(class_path=class_path, init_args=init_args)
    with_given = f" with {_pairs('--data', init_args, kept)}" if kept else ""
    log.info("--ckpt_path=%s: its data set, %s%s (--data=... evaluates on another)", ckpt_path, class_path, with_given)


def check_classes(ckpt_path: str | Path, checkpoint: dict[str, Any], num_classes: int | None) -> None:
    """Refuse a checkpoint of a model trained for another number of classes than the data set has."""
    trained_for = checkpoint.get("hyper_parameters", {}).get("num_classes")
    if num_classes is not None and trained_for is not None and trained_for != num_classes:
        raise ProjectError(
            f"--ckpt_path={ckpt_path}: a model of {trained_for} classes, but this data has {num_classes}; "
            "use a checkpoint trained on this data"
        )


def adopt_checkpoint_settings(
    config: Any, ckpt_path: str | Path, checkpoint: dict[str, Any], model_class: Any, argv: list[str]
) -> Callable[[Any], None]:
    """Check and adopt, in the parsed ``config``, the settings the checkpoint was trained with. Returns what to call
    once LightningCLI applied its hyperparameters: it puts back the :data:`RUN_OPTIONS` that were given."""
    model_args, model_cls = _section(config.get("model"), model_class)
    saved_model = {k: v for k, v in (checkpoint.get("hyper_parameters") or {}).items() if not k.startswith("_")}
    given, adopted = _differing(saved_model, model_args, model_cls, list(saved_model), argv, "model")
    kept = {key: model_args[key] for key in given if key in RUN_OPTIONS}
    conflicts = [key for key in given if key not in RUN_OPTIONS]
    if conflicts:
        raise ProjectError(
            f"--ckpt_path={ckpt_path} holds a model trained with {_pairs('model', saved_model, conflicts)}, but "
            f"{_pairs('--model', model_args, conflicts)} was given; leave the option out to use the checkpoint's, "
            "or pass a checkpoint trained with it"
        )
    notes = _pairs("model", saved_model, [key for key in adopted if key not in BUILD_OPTIONS])

    data_config = config.get("data")
    data_args, data_cls = _section(data_config, None)
    saved_data = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    same_data_set = data_config is not None and saved_data.get("_class_path") in (None, data_config.get("class_path"))
    if same_data_set and data_args is not None:
        given, adopted = _differing(saved_data, data_args, data_cls, (*DATA_SETTINGS, *LEARNED), argv, "data")
        if "classes" in given:
            raise ProjectError(
                f"--ckpt_path={ckpt_path} holds a model of the classes {saved_data['classes']}, but "
                f"--data.classes={data_args['classes']} was given; leave the option out to use the checkpoint's"
            )
        for key in adopted:
            data_args[key] = saved_data[key]
        notes = ", ".join(filter(None, [notes, _pairs("data", saved_data, adopted)]))
        if given:
            saved, running = _pairs("data", saved_data, given), _pairs("data", data_args, given)
            log.warning("--ckpt_path=%s was trained with %s; running with %s as given", ckpt_path, saved, running)
    if notes:
        log.info("--ckpt_path=%s: taking the settings it was trained with: %s", ckpt_path, notes)

    def restore_run_options(applied: Any) -> None:
        args, _ = _section(applied.get("model"), model_class)
        for key, value in kept.items():
            args[key] = value
        for key in BUILD_OPTIONS:
            if args is not None and key in args:
                args[key] = None

    return restore_run_options

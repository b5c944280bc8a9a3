"""Trainer and callback settings derived from the ones given, before the Trainer is built: a default callback a
Trainer flag switches off is left out (and ``--callbacks.checkpoint=false`` turns its flag off); ``fast_dev_run``
saves no checkpoint; ``--data.val_size=0`` means no validation and ``last.ckpt`` only; cuDNN autotuning unless
deterministic; ``predict`` returns no predictions (``predictions.csv`` holds them) unless ``--return_predictions``;
a torchvision ``--model.weights`` name sets the data options its weights expect where they are not given.
"""

from __future__ import annotations

from typing import Any

from project.toolkit.cli.checkpoint_settings import command_line_keys, init_defaults
from project.toolkit.cli.run_dirs import setting
from project.toolkit.dotted import chosen_class, section_args
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger
from project.toolkit.weights import weights_preprocessing

log = get_logger(__name__)

# Trainer flags that switch a kind of callback off, and the default callback of that kind.
TRAINER_SWITCHES = {"enable_checkpointing": "checkpoint", "enable_progress_bar": "progress_bar"}


def callbacks_switched_off(config: Any, names: list[str]) -> set[str]:
    """The default callbacks (of ``names``) this run leaves out; sets the matching Trainer flags off."""
    trainer = config.trainer
    off = {name for name in names if not config.callbacks[name]}
    if trainer.get("fast_dev_run"):
        off.add("checkpoint")  # Lightning's rule is no checkpoints, yet its ModelCheckpoint wrote last.ckpt
    for flag, name in TRAINER_SWITCHES.items():
        if trainer.get(flag) is False:
            off.add(name)
    if "checkpoint" in off:
        trainer.enable_checkpointing = False  # else the Trainer adds a ModelCheckpoint of its own
    return off


def derive_settings(subcommand: str, config: Any) -> None:
    """Settings that follow from others, written into ``config``."""
    trainer = config.trainer
    if trainer.get("benchmark") is None:  # cuDNN's autotuner may pick other kernels from run to run
        trainer.benchmark = not trainer.get("deterministic")
    if setting(config.as_dict(), "data.val_size") == 0:  # also inside data.init_args (--data=Class)
        if subcommand == "validate":
            raise ProjectError("data.val_size=0 holds out no images, so there is nothing to validate; use test")
        trainer.limit_val_batches = 0
        trainer.num_sanity_val_steps = 0
        checkpoint = config.get("checkpoint")
        if checkpoint is not None and str(checkpoint.get("monitor") or "").startswith("val/"):
            checkpoint.monitor = None  # nothing to rank by: last.ckpt only
            checkpoint.save_top_k = 0
        if subcommand == "fit":
            log.info("data.val_size=0: training on every image, no validation; checkpoints keep last.ckpt only")
    if subcommand == "predict" and config.get("return_predictions") is None:
        config.return_predictions = False


def adopt_weights_preprocessing(config: Any, argv: list[str]) -> None:
    """With a torchvision weight name (``--model.weights=IMAGENET1K_V2``), the data options of the weights' own
    preprocessing (``weights.transforms()``) that the data set has and the user did not give, said in one line; the
    crop and resize sizes go together. A state-dict file leaves the data's options as they are."""
    model, data = section_args(config.get("model")), config.get("data")
    data_args = section_args(data)
    wanted = weights_preprocessing(model.get("weights"), model.get("arch")) if model is not None else None
    if wanted is None or data_args is None:
        return
    defaults, typed = init_defaults(chosen_class(data)), command_line_keys(argv, "data")
    given = {key for key in wanted if key in typed or key not in defaults or data_args.get(key) != defaults[key]}
    if given & {"image_size", "resize_size"}:
        given |= {"image_size", "resize_size"}
    taken = {key: value for key, value in wanted.items() if key not in given and key in data_args}
    for key, value in taken.items():
        data_args[key] = value
    said = ", ".join(f"data.{key}={value}" for key, value in taken.items()) or "nothing"
    kept = sorted(f"data.{key}" for key in given if key in data_args)
    kept_said = f"; left as set: {', '.join(kept)}" if kept else ""
    log.info("model.weights=%s of %s: the data as its weights expect: %s%s", model.weights, model.arch, said, kept_said)

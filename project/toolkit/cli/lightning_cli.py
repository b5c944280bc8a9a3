"""The trainer commands, ``python -m project {fit,validate,test,predict}``: a LightningCLI with the template's default
callbacks (``--callbacks.<name>=false``, ``--<name>.*``), ``--ckpt_path=last|best``, a run folder for every command,
and bad input as one ``error:`` line (exit status 2) leaving no half-made run folder."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import shutil
import signal
import sys
from argparse import ArgumentError
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelSummary
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.toolkit.callbacks import CHECKPOINT_DEFAULTS, DEFAULT_CALLBACKS, GROUPED, OFF_BY_DEFAULT, left_out_of
from project.toolkit.callbacks.checkpoints import Checkpoints, check_checkpoint_file, find_checkpoint
from project.toolkit.callbacks.flops_summary import with_flops
from project.toolkit.callbacks.group import find_callback, grouped
from project.toolkit.callbacks.guards import Guards, out_of_memory_message
from project.toolkit.cli import checks, messages
from project.toolkit.cli.checkpoint_settings import adopt_checkpoint_settings, adopt_data_set, check_classes
from project.toolkit.cli.process_exit import leave_gloo_process_group
from project.toolkit.cli.run_dirs import CLAIMED, arrange_run_folder, runs_root, starts_run
from project.toolkit.cli.run_settings import adopt_weights_preprocessing, callbacks_switched_off, derive_settings
from project.toolkit.dotted import import_object, section_args
from project.toolkit.errors import ProjectError
from project.toolkit.helpers import is_remote
from project.toolkit.log import get_logger, silence_known_noise
from project.toolkit.strategies import deepspeed
from project.toolkit.strategies.registry import COMMON_STRATEGIES, register_chosen, register_ddp_static

log = get_logger(__name__)


@dataclass
class RunContext:
    """What :func:`main` needs once a command has failed: its trainer and the run folder it created."""

    trainer: Trainer | None = None
    created: Path | None = None  # the outermost folder it made
    folder: Path | None = None  # its run folder, in ``created`` (or it)


class ProjectCLI(LightningCLI):
    """LightningCLI with the template's callbacks, checks and run folders; ``default_data``: the default ``--data``."""

    def __init__(self, *args: Any, default_data: str | None = None, context: RunContext, **kwargs: Any) -> None:
        self.default_data, self.context = default_data, context
        self.parsers: list[LightningArgumentParser] = []
        self._restore_run_options: Callable[[Any], None] = lambda config: None  # see adopt_checkpoint_settings
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        if self.default_data:
            parser.set_defaults({"data": {"class_path": self.default_data}})
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.in_channels", "model.in_channels", apply_on="instantiate")
        for name, callback in DEFAULT_CALLBACKS.items():
            parser.add_lightning_class_args(callback, name)
            on = name not in OFF_BY_DEFAULT
            parser.add_argument(f"--callbacks.{name}", type=bool, default=on, help=f"Run {callback.__name__}.")
        parser.set_defaults(CHECKPOINT_DEFAULTS)
        self.parsers.append(parser)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        self.argv = [str(word) for word in (sys.argv[1:] if args is None else args if isinstance(args, list) else [])]
        self.data_from_checkpoint = False  # whether --data= was taken from --ckpt_path's checkpoint
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:  # a mistyped option (name the nearest one), or one of the checkpoint's data set
            if not self._parse_with_checkpoint_data_class(parser):
                raise ArgumentError(None, messages.with_option_hints(str(err), self.option_names())) from None
        if self.config.get("subcommand"):
            self._resolve_ckpt_path(self.config["subcommand"])

    def _parse_with_checkpoint_data_class(self, parser: LightningArgumentParser) -> bool:
        """Parse the command line with ``--data=`` the class of ``--ckpt_path``'s data set, where ``--data.<option>``s
        are given without a class; False where they are not, or the class is the default already."""
        given = [i for i, word in enumerate(self.argv) if word.startswith("--data.")]
        if not given or any(word.partition("=")[0] in ("--data", "--data.class_path") for word in self.argv):
            return False
        without = {*given, *(i + 1 for i in given if "=" not in self.argv[i])}  # --data.option [VALUE]
        try:  # the command without them: where the checkpoint is
            super().parse_arguments(parser, [word for i, word in enumerate(self.argv) if i not in without])
        except ArgumentError:
            return False
        config = self.config.get(subcommand := self.config.get("subcommand"), self.config)
        trusted = config.get("weights_only") is False
        if (path := config.get("ckpt_path")) in ("last", "best"):
            path = find_checkpoint(path, runs_root(config.trainer), allow_none=subcommand == "fit", trusted=trusted)
        checkpoint = check_checkpoint_file(path, trusted) if path and Path(path).is_file() else {}
        class_path = (checkpoint.get("datamodule_hyper_parameters") or {}).get("_class_path")
        if class_path in (None, (config.get("data") or {}).get("class_path")):
            return False
        self.data_from_checkpoint = True  # the class before its options; the checkpoint as found (once)
        argv = [*self.argv[: given[0]], f"--data={class_path}", *self.argv[given[0] :], f"--ckpt_path={path}"]
        super().parse_arguments(parser, argv)
        return True

    def option_names(self) -> list[str]:
        """Every option of the trainer commands, as typed (``--data.image_size``, not ``--data.init_args...``)."""
        keys = {key.replace(".init_args.", ".") for parser in self.parsers for key in parser.get_defaults().keys()}
        return sorted(f"--{key}" for key in keys)

    def _resolve_ckpt_path(self, subcommand: str) -> None:
        """``--ckpt_path=last|best`` as a checked file, before LightningCLI reads the hyperparameters from it."""
        config = self.config[subcommand]
        value = config.get("ckpt_path")
        if value is None and subcommand != "fit":
            log.warning(
                "%s runs on the model's freshly initialised weights; pass --ckpt_path=best, last or a file "
                "to evaluate a trained model",
                subcommand,
            )
        trusted = config.get("weights_only") is False  # Lightning's option: the user trusts the file's code
        if value in ("last", "best"):
            root = runs_root(config.trainer)
            config.ckpt_path = find_checkpoint(value, root, allow_none=subcommand == "fit", trusted=trusted)
        if config.ckpt_path in (None, "hpc"):
            return
        deepspeed.check_deepspeed_checkpoint(config.ckpt_path, config.trainer.get("strategy"))  # DeepSpeed reads it
        if not deepspeed.is_deepspeed_checkpoint(config.ckpt_path):
            checkpoint = check_checkpoint_file(config.ckpt_path, trusted)
            if checkpoint is not None:  # a file: the data set and settings it was trained with, against the options
                adopt_data_set(config, config.ckpt_path, checkpoint, self.argv, self.data_from_checkpoint)
                check_classes(config.ckpt_path, checkpoint, checks.data_num_classes(config.get("data")))
                self._restore_run_options = adopt_checkpoint_settings(
                    config, config.ckpt_path, checkpoint, self.model_class, self.argv
                )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        trainer = config.trainer
        register_chosen(trainer.get("strategy"), trainer.get("accelerator"))  # imports its module
        checks.check_trainer_choices(trainer.get("strategy"), trainer.get("accelerator"), trainer.get("devices"))
        checks.check_slurm_tasks(trainer.get("devices"), trainer.get("num_nodes"))
        deepspeed.check_deepspeed_choice(trainer.get("strategy"), trainer.get("accelerator"))
        derive_settings(self.subcommand, config)
        self._restore_run_options(config)  # after LightningCLI read the checkpoint
        adopt_weights_preprocessing(config, self.argv)  # a torchvision weight name: the data its weights expect
        data = config.get("data")
        data_args = section_args(data)
        if data_args is not None and isinstance(data_args.get("image_size"), int):
            channels = checks.data_in_channels(data)
            checks.check_batch_fits_memory(data_args.image_size, data_args.get("batch_size") or 1, channels)
        checks.warn_cpu_oversubscription(trainer.get("devices"), trainer.get("accelerator"), torch.cuda.is_available())
        switched_off = callbacks_switched_off(config, list(DEFAULT_CALLBACKS)) | left_out_of(self.subcommand)
        for parser in self.parsers:  # the instantiated callbacks the Trainer is given
            parser.callback_keys[:] = [key for key in parser.callback_keys if key not in switched_off]
        root_dir, root = trainer.get("default_root_dir") or os.getcwd(), runs_root(trainer)
        if is_remote(root):  # checked before a run folder is claimed
            from project.toolkit.remote import check_remote_root  # only for a remote root

            check_remote_root(root_dir, switched_off, trainer.get("logger"))
        else:
            checks.check_writable(root, "trainer.default_root_dir", root_dir)
        made = [folder for folder in (Path(root).absolute(), *Path(root).absolute().parents) if not folder.exists()]
        config_filename = arrange_run_folder(self.subcommand, config)
        if (claimed := os.environ.get(CLAIMED)) and config_filename is None and starts_run():  # a folder of its own
            self.context.created, self.context.folder = Path(made[-1] if made else claimed), Path(claimed)
        if config_filename:
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": config_filename}

    def instantiate_classes(self) -> None:
        # The Trainer refuses a bad setting (devices=-1 on CPU, ...) with a readable message: show it, not a traceback.
        try:
            super().instantiate_classes()
        except (MisconfigurationException, ValueError, TypeError) as err:
            raise messages.project_error_within(err) or ProjectError(messages.one_line(str(err))) from None

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        # An instance, not the name: Lightning refuses the name `fsdp` off CUDA, taking it for its own FSDP1.
        if self.config_init[self.subcommand].trainer.get("strategy") == "fsdp":
            kwargs.setdefault("strategy", StrategyRegistry.get("fsdp"))
        given = self.config_init[self.subcommand].trainer.get("callbacks")
        summary_given = any(isinstance(c, ModelSummary) for c in (given if isinstance(given, list) else [given]))
        trainer = super().instantiate_trainer(**kwargs)
        if not summary_given:  # the summary Lightning added: one with the network's FLOPs instead
            trainer.callbacks = [with_flops(callback) for callback in trainer.callbacks]
        if trainer.loggers and find_callback(trainer, LearningRateMonitor) is None:  # it refuses a run with no logger
            trainer.callbacks.append(LearningRateMonitor())  # every param group's lr, under its scheduler's name
        # With the template's own: Lightning's callbacks that would cost every hook of each step otherwise.
        kinds = (*GROUPED, ModelSummary, SaveConfigCallback, LearningRateMonitor)
        trainer.callbacks = grouped(trainer.callbacks, kinds)
        self.context.trainer = trainer
        return trainer

    def _before_run(self) -> None:
        """Note the run folder this command is about to create, and check the port its processes will use."""
        trainer = self.trainer
        log_dir = trainer.log_dir
        folders = (Path(log_dir), *Path(log_dir).parents) if log_dir else ()
        if missing := [folder for folder in folders if not folder.exists()]:  # else: the one its run claimed
            self.context.created, self.context.folder = missing[-1], Path(log_dir)  # the outermost; the run's
        starts_the_others = hasattr(trainer.strategy.launcher, "procs") and "LOCAL_RANK" not in os.environ
        if trainer.world_size > 1 and trainer.num_nodes == 1 and starts_the_others:
            checks.check_master_port()

    before_fit = before_validate = before_test = before_predict = _before_run


def _remove_unused_folder(context: RunContext) -> None:
    """Remove the run folder a command created if it stopped before any training step and saved no checkpoint."""
    created, folder, trainer = context.created, context.folder or context.created, context.trainer
    busy = trainer is not None and (trainer.global_step or not trainer.is_global_zero)
    if created is None or folder is None or not folder.exists() or busy or any(folder.rglob("*.ckpt")):
        return
    shutil.rmtree(folder, ignore_errors=True)
    for parent in [parent for parent in folder.parents if parent.is_relative_to(created)]:  # made by it, now empty
        with contextlib.suppress(OSError):  # another run's folder in it
            parent.rmdir()


def run_failed(error: BaseException, context: RunContext) -> BaseException:
    """What a command that raised ``error`` while running ends with: one line for what the user can fix."""
    trainer = context.trainer
    if isinstance(error, SIGTERMException):  # stopped by a signal, after saving: exit 128 + that signal
        checkpoints = find_callback(trainer, Checkpoints)
        return SystemExit(128 + ((checkpoints and checkpoints.signum) or signal.SIGTERM))
    if isinstance(error, RuntimeError):
        data = trainer.datamodule.hparams if trainer is not None and trainer.datamodule is not None else None
        oom = out_of_memory_message(error, data)
        if oom is not None:  # host or device: one line with the figure and what to lower
            _remove_unused_folder(context)
            return ProjectError(oom)
        # In a multi-process run most often a collective failing because another rank died: name that rank.
        guards = find_callback(trainer, Guards)
        if guards is not None:
            guards.stop_if_lost(wait_seconds=3.0)
    _remove_unused_folder(context)
    return error


def prints_errors(environ: Any = None) -> bool:
    """Whether this process prints a bad input's ``error:`` line. Every process of a multi-process run meets the same
    bad input, and one line is enough: where Lightning's launcher or torchrun started the processes, local rank 0 on
    each machine; under srun (every task has SLURM_PROCID, none LOCAL_RANK), task 0 alone, since all the tasks of a
    job write into one output file."""
    environ = os.environ if environ is None else environ
    if "LOCAL_RANK" in environ:
        return environ["LOCAL_RANK"] == "0"
    return environ.get("SLURM_PROCID", "0") == "0"


@functools.cache
def _register_once() -> None:
    """ddp_static known before any Trainer exists, in every process a launcher starts (the template's other names:
    :func:`register_chosen`, once a command names one)."""
    register_ddp_static()
    atexit.register(leave_gloo_process_group)


def main(args: ArgsType = None, model: str = "", data: str = "") -> ProjectCLI:
    """The trainer commands; ``args`` replaces ``sys.argv[1:]``. ``model`` and ``data``: the dotted paths of the
    LightningModule and of the data module ``--data`` defaults to."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    package_logger = logging.getLogger("project")
    package_logger.handlers[:] = [handler]
    package_logger.setLevel(logging.INFO)
    package_logger.propagate = False
    _register_once()
    silence_known_noise()
    # Parse errors raise instead of printing the usage, so they too come out as one line; no abbreviations.
    strict = {"exit_on_error": False, "allow_abbrev": False}
    names = f"--trainer.strategy: {', '.join(COMMON_STRATEGIES)}; --trainer.accelerator: auto, cpu, gpu, tpu, xla_cpu"
    epilog = f"The template's names for {names} (docs/strategies.md)."
    context = RunContext()
    try:
        try:
            return ProjectCLI(
                import_object(model) if model else LightningModule,
                LightningDataModule,
                subclass_mode_model=not model,
                subclass_mode_data=True,
                default_data=data or None,
                context=context,
                # One way to choose the optimizer: --model.optimizer (LightningCLI's would replace the warm-up).
                auto_configure_optimizers=False,
                seed_everything_default=42,
                trainer_defaults={"max_epochs": 10},
                save_config_kwargs={"overwrite": True},
                parser_kwargs={
                    "prog": "python -m project",
                    "description": "Train, evaluate and time one image classifier; compare strategies with "
                    "`python -m project bench --help`.",
                    **strict,
                    **{subcommand: {**strict, "epilog": epilog} for subcommand in LightningCLI.subcommands()},
                },
                args=args,
            )
        except (SIGTERMException, ProjectError, MisconfigurationException, RuntimeError) as err:
            if context.trainer is None:
                _remove_unused_folder(context)
                raise
            raise run_failed(err, context) from None
        except BaseException:
            _remove_unused_folder(context)
            raise
    except ProjectError as err:
        if prints_errors():
            print(f"error: {messages.worker_error_line(str(err))}", file=sys.stderr)
        raise SystemExit(2) from None
    except ArgumentError as err:
        argv = sys.argv[1:] if args is None else list(args)
        command = [word for word in argv if word in LightningCLI.subcommands()][:1]
        help_command = " ".join(["python -m project", *command, "--help"])
        line = messages.config_shape_error(str(err), argv) or messages.parse_error_line(str(err))
        print(f"error: {line} (see {help_command})", file=sys.stderr)
        raise SystemExit(2) from None

"""The trainer commands: ``python -m project {fit,validate,test,predict}``, a LightningCLI
(:mod:`project.toolkit.entry` sends ``bench``, ``compare`` and the top-level help elsewhere, without importing
Lightning).

Beyond LightningCLI it does these things:
- the template's strategies are registered when it starts (:mod:`project.toolkit.strategies`);
- ``num_classes`` is linked from the data module to the model, so it is never typed twice;
- the default callbacks (:data:`DEFAULT_CALLBACKS`, listed in ``configs/default.yaml``) are on, each
  with its options (``--checkpoint.*``, ``--timing.*``, ...) and a switch (``--callbacks.timing=false``);
  the ModelCheckpoint keeps ``last.ckpt`` and the best ``val/acc`` of each run;
- ``--ckpt_path=last`` / ``best`` also work in a NEW process (the usual case: ``fit``, then
  ``test --ckpt_path=best`` as a second command), by looking in the newest run folder under
  ``<trainer.default_root_dir>/lightning_logs``;
- :class:`project.toolkit.callbacks.timing.TimingCallback` reports every run's epoch, iteration and inference
  times, work (FLOPs, MFU) and peak memory (``timing.json`` in the run folder);
- every command writes into a run folder, also without a logger, evaluations into their fit's
  (:mod:`project.toolkit.run_dirs`); settings that follow from others in :mod:`project.toolkit.run_settings`;
- ``--trainer.benchmark`` (cuDNN autotuning) is on unless ``--trainer.deterministic`` is set;
- checkpoints are written atomically, checked before use, and saved when SIGTERM or Ctrl-C stops
  the run (exit status 128 + signal); training stops at the first non-finite loss
  (:mod:`project.toolkit.callbacks`); ``predict`` writes ``predictions.csv``.
Errors the user can fix print as one line and exit 2, with no traceback and no half-made run folder:
ours (:class:`project.toolkit.errors.ProjectError`), the parser's (a wrong type, an unknown key, a missing
config file) and Lightning's refusals of a Trainer setting (an unknown strategy, GPUs asked for on a
machine without any).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import shutil
import signal
import sys
from argparse import ArgumentError
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.toolkit.callbacks.checkpoints import (
    AtomicCheckpoints,
    CheckpointOnSignal,
    FinalCheckpoint,
    check_checkpoint_file,
    find_checkpoint,
)
from project.toolkit.callbacks.estimate import CpuTimeEstimate
from project.toolkit.callbacks.guards import FiniteLossGuard, LostRankWatchdog, out_of_memory_message
from project.toolkit.callbacks.host_memory import HostMemoryReuse
from project.toolkit.callbacks.idle_hooks import SkipIdleHooks
from project.toolkit.callbacks.predictions import PredictionWriter
from project.toolkit.callbacks.progress import ProgressBar
from project.toolkit.callbacks.quiet import LogEveryEpoch, ModelSummaryWithFlops, silence_known_noise
from project.toolkit.callbacks.reproducibility import ReseedEveryEpoch
from project.toolkit.callbacks.summary import RunSummary
from project.toolkit.callbacks.timing import TimingCallback
from project.toolkit.callbacks.views import TensorBoardViews
from project.toolkit.checkpoint_settings import adopt_checkpoint_settings
from project.toolkit.class_path_errors import class_path_error_line, project_error_within, unwrap_class_option_error
from project.toolkit.commands import TRAINER_COMMANDS, config_shape_error, with_option_hints
from project.toolkit.compat import is_subprocess_script_launcher
from project.toolkit.dotted import chosen_class, import_object, section_args
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger
from project.toolkit.preflight import (
    check_batch_fits_memory,
    check_master_port,
    check_writable,
    warn_cpu_oversubscription,
)
from project.toolkit.process_exit import leave_gloo_process_group
from project.toolkit.run_dirs import arrange_run_folder, runs_root
from project.toolkit.run_settings import callbacks_switched_off, derive_settings
from project.toolkit.strategies import name_help, register_strategies
from project.toolkit.strategies.deepspeed import (
    check_deepspeed_choice,
    is_deepspeed_checkpoint,
    resolve_deepspeed_checkpoint,
)

log = get_logger(__name__)

CHECKPOINT_DEFAULTS = {
    "checkpoint.monitor": "val/acc",
    "checkpoint.mode": "max",
    "checkpoint.save_last": True,
    "checkpoint.filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}",
    "checkpoint.auto_insert_metric_name": False,
}


# The callbacks every run has, by the name of their options (``--timing.*``) and of their switch
# (``--callbacks.timing=false``); configs/default.yaml lists them.
DEFAULT_CALLBACKS: dict[str, type[Callback]] = {
    "checkpoint": ModelCheckpoint,
    "reseed_every_epoch": ReseedEveryEpoch,
    "timing": TimingCallback,
    "tensorboard_views": TensorBoardViews,  # after timing: it reports timing's figures as hparams
    "finite_loss_guard": FiniteLossGuard,
    "atomic_checkpoints": AtomicCheckpoints,
    "checkpoint_on_signal": CheckpointOnSignal,
    "final_checkpoint": FinalCheckpoint,
    "lost_rank_watchdog": LostRankWatchdog,
    "predictions": PredictionWriter,
    "progress_bar": ProgressBar,
    "model_summary": ModelSummaryWithFlops,
    "log_every_epoch": LogEveryEpoch,
    "cpu_time_estimate": CpuTimeEstimate,
    "host_memory_reuse": HostMemoryReuse,
    "skip_idle_hooks": SkipIdleHooks,
    "run_summary": RunSummary,  # after timing: it names the timing.json written at the same hook
}

# The commands a default callback has work in (one not named here: every command); each is left out of the
# others. Lightning calls every hook of every callback it holds (a getattr, its state_key, a profiler context:
# about 20 us per test batch for these eight on a 2-core CPU, timed by hand, before skip_idle_hooks); that
# callback now spares the empty per-batch ones, but a callback left out costs nothing at all, not even its
# setup and epoch hooks. The checkpoint and reseed_every_epoch callbacks stay in all: their
# state is in the checkpoint, and Lightning warns of a checkpoint's callback missing from a run that loads it.
WORKS_IN: dict[str, set[str]] = {
    **dict.fromkeys(
        [
            "finite_loss_guard",
            "atomic_checkpoints",
            "checkpoint_on_signal",
            "final_checkpoint",
            "model_summary",
            "log_every_epoch",
            "cpu_time_estimate",
        ],
        {"fit"},
    ),
    "predictions": {"predict"},
}


def left_out_of(command: str) -> set[str]:
    """The default callbacks with no work in ``command`` (:data:`WORKS_IN`)."""
    return {name for name, commands in WORKS_IN.items() if command not in commands}


class ProjectCLI(LightningCLI):
    """LightningCLI with the template's callbacks, checks and run folders. The data set is chosen by
    ``--data=package.module.Class`` (LightningCLI's subclass mode), its default given by the caller
    (``default_data``): the toolkit names no data set of its own."""

    def __init__(self, *args: Any, default_data: str | None = None, **kwargs: Any) -> None:
        self.default_data = default_data
        # What a checkpoint's settings put back once LightningCLI has read it (adopt_checkpoint_settings);
        # nothing without a checkpoint.
        self._restore_run_options: Callable[[Any], None] = lambda config: None
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        if self.default_data:
            parser.set_defaults({"data": {"class_path": self.default_data}})
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.in_channels", "model.in_channels", apply_on="instantiate")
        for name, callback in DEFAULT_CALLBACKS.items():
            parser.add_lightning_class_args(callback, name)
            parser.add_argument(
                f"--callbacks.{name}", type=bool, default=True, help=f"Run the {callback.__name__} callback."
            )
        parser.set_defaults(CHECKPOINT_DEFAULTS)
        for option, names in name_help().items():
            action = parser._option_string_actions[option]  # argparse's table of options
            action.help = f"{action.help} {names}."
        self.callback_parsers = [*getattr(self, "callback_parsers", []), parser]

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        self.argv = [str(word) for word in (sys.argv[1:] if args is None else args if isinstance(args, list) else [])]
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:  # a mistyped option: name the nearest one there is
            options = {option for p in self.callback_parsers for a in p._actions for option in a.option_strings}
            raise ArgumentError(None, with_option_hints(str(err), options)) from None
        subcommand = self.config.get("subcommand")
        if subcommand:
            self._resolve_ckpt_path(subcommand)

    def _resolve_ckpt_path(self, subcommand: str) -> None:
        """Resolve ``--ckpt_path=last|best`` to a file and check the file, before LightningCLI reads the
        model's hyperparameters (``arch``, ...) from it, so a checkpoint named either way restores
        the network it was trained with."""
        config = self.config[subcommand]
        value = config.get("ckpt_path")
        if value is None and subcommand != "fit":
            log.warning(
                "%s runs on the model's freshly initialised weights; pass --ckpt_path=best, last or a file "
                "to evaluate a trained model",
                subcommand,
            )
        if value in ("last", "best"):
            config.ckpt_path = find_checkpoint(value, runs_root(config.trainer), allow_none=subcommand == "fit")
        if config.ckpt_path not in (None, "hpc"):
            # A DeepSpeed folder: kept for a DeepSpeed run, consolidated into one file for one device.
            config.ckpt_path = resolve_deepspeed_checkpoint(
                config.ckpt_path, config.trainer.get("strategy"), subcommand
            )
            if not is_deepspeed_checkpoint(config.ckpt_path):
                # one line naming a bad file, or one made for another data set
                checkpoint = check_checkpoint_file(config.ckpt_path, num_classes=data_num_classes(config.get("data")))
                if checkpoint is not None:  # a file: the settings it was trained with, against the options
                    self._restore_run_options = adopt_checkpoint_settings(
                        config, config.ckpt_path, checkpoint, self.model_class, self.argv
                    )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        trainer = config.trainer
        check_trainer_choices(trainer.get("strategy"), trainer.get("accelerator"), trainer.get("devices"))
        check_deepspeed_choice(trainer.get("strategy"), trainer.get("accelerator"))
        derive_settings(self.subcommand, config)
        self._restore_run_options(config)  # after LightningCLI read the checkpoint
        data = config.get("data")
        data_args = section_args(data)
        if data_args is not None and isinstance(data_args.get("image_size"), int):
            check_batch_fits_memory(data_args.image_size, data_args.get("batch_size") or 1, data_in_channels(data))
        warn_cpu_oversubscription(trainer.get("devices"), trainer.get("accelerator"), torch.cuda.is_available())
        switched_off = callbacks_switched_off(config, list(DEFAULT_CALLBACKS)) | left_out_of(self.subcommand)
        for parser in self.callback_parsers:  # the instantiated callbacks the Trainer is given
            parser.callback_keys[:] = [key for key in parser.callback_keys if key not in switched_off]
        config_filename = arrange_run_folder(self.subcommand, config)
        check_writable(runs_root(trainer), "trainer.default_root_dir", trainer.get("default_root_dir") or os.getcwd())
        if config_filename:
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": config_filename}

    def instantiate_classes(self) -> None:
        # Lightning's Trainer refuses a bad setting (devices=-1 on CPU, an unusable precision, ...) with
        # an exception carrying a readable message; the user gets that message, not a traceback.
        try:
            super().instantiate_classes()
        except (MisconfigurationException, ValueError, TypeError) as err:
            raise project_error_within(err) or ProjectError(one_line(str(err))) from None

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        # The template's model summary replaces Lightning's default one (the Trainer otherwise logs that it skips
        # its own on every command), and where it is left out (WORKS_IN), Lightning's is not put in its place.
        held_or_left_out = {*self._parser(self.subcommand).callback_keys, *left_out_of(self.subcommand)}
        if "model_summary" in held_or_left_out:
            kwargs.setdefault("enable_model_summary", False)
        return super().instantiate_trainer(**kwargs)

    def _run_subcommand(self, subcommand: str) -> None:
        """Run the subcommand; if it fails on bad input before any training step, remove the run folder
        it had just created (config.yaml and an empty event file), so failed starts leave no clutter
        among the real runs. A folder that existed before, or that holds a checkpoint, is kept."""
        log_dir = Path(self.trainer.log_dir) if self.trainer.log_dir else None
        created = _first_missing(log_dir) if log_dir is not None else None
        trainer = self.trainer
        if (
            trainer.world_size > 1
            and trainer.num_nodes == 1
            and is_subprocess_script_launcher(trainer.strategy.launcher)
            and "LOCAL_RANK" not in os.environ  # the process that starts the others, before it does
        ):
            check_master_port()
        try:
            super()._run_subcommand(subcommand)
        except SIGTERMException:  # stopped by a signal, after saving (CheckpointOnSignal): say which
            stopper = next((c for c in self.trainer.callbacks if isinstance(c, CheckpointOnSignal)), None)
            raise SystemExit(128 + (stopper.signum if stopper and stopper.signum else signal.SIGTERM)) from None
        except RuntimeError as err:
            oom = out_of_memory_message(err, self.config[subcommand].get("data"))
            if oom is not None:  # host or device: one line with the figure and what to lower
                self._remove_unused_folder(created)
                raise ProjectError(oom) from None
            # In a multi-process run, most often a collective failing because another rank died (gloo
            # raises a plain RuntimeError): name that rank if this machine started it.
            watchdog = next((c for c in self.trainer.callbacks if isinstance(c, LostRankWatchdog)), None)
            if watchdog is not None:
                watchdog.stop_if_lost(wait_seconds=3.0)
            raise
        except (ProjectError, MisconfigurationException):
            self._remove_unused_folder(created)
            raise

    def _remove_unused_folder(self, created: Path | None) -> None:
        """Remove the run folder this command created if it stopped before any training step and saved
        no checkpoint."""
        if created is not None and created.exists() and self.trainer.global_step == 0 and self.trainer.is_global_zero:
            if not any(created.rglob("*.ckpt")):
                shutil.rmtree(created, ignore_errors=True)


def _first_missing(path: Path) -> Path | None:
    """The outermost folder on the way to ``path`` that does not exist yet (None if ``path`` exists)."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def data_num_classes(data_config: Any) -> int | None:
    """The class count of the data set a config chooses (its class's ``num_classes``), read without
    building the data set; None if the class does not say."""
    value = getattr(chosen_class(data_config), "num_classes", None)
    return value if isinstance(value, int) else None


def data_in_channels(data_config: Any) -> int:
    """The channels of the data set a config chooses (its class's ``image_shape``), 3 if it does not say."""
    shape = getattr(chosen_class(data_config), "image_shape", None)
    return shape[2] if isinstance(shape, tuple) and len(shape) == 3 and isinstance(shape[2], int) else 3


def check_trainer_choices(strategy: Any, accelerator: Any, devices: Any) -> None:
    """Refuse an unknown strategy or accelerator name, a GPU on a machine without one, and a device
    count that is no count, naming what is allowed (Lightning's own messages name neither this
    template's strategies nor the cause)."""
    count = devices if isinstance(devices, int) else None
    if isinstance(devices, str) and devices != "auto":
        if not re.fullmatch(r"-?\d+|\d+(,\d+)*,?", devices.strip()):
            count = 0
        elif "," not in devices:
            count = int(devices)
    if count is not None and count < 1 and (count != -1 or accelerator == "cpu"):
        raise ProjectError(
            f"trainer.devices={devices!r} is not allowed: use a number >= 1, a list of device indices, "
            "-1 (all GPUs) or auto"
        )
    if isinstance(strategy, str) and strategy != "auto" and strategy not in StrategyRegistry.available_strategies():
        raise ProjectError(
            f"trainer.strategy={strategy!r} is not a strategy; choose one of: auto, "
            + ", ".join(sorted(StrategyRegistry.available_strategies()))
        )
    if not isinstance(accelerator, str):
        return
    allowed = {"auto", "gpu", *AcceleratorRegistry.available_accelerators()}
    if accelerator not in allowed:
        raise ProjectError(
            f"trainer.accelerator={accelerator!r} is not an accelerator; choose one of: {', '.join(sorted(allowed))}"
        )
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ProjectError(
            f"trainer.accelerator={accelerator!r}, but this machine has no CUDA GPU that torch can use "
            f"(torch {torch.__version__}); use --trainer.accelerator=cpu or auto"
        )


def one_line(message: str) -> str:
    r"""``message`` with its line breaks and indentation folded into single spaces.

    >>> one_line("first\n  second")
    'first second'
    """
    return re.sub(r"\s*\n\s*", " ", message.strip())


def parse_error_line(message: str) -> str:
    r"""jsonargparse's message for a value of the wrong type, as one line: the option, the value, and
    the types or values allowed; other messages only folded onto one line.

    >>> parse_error_line('Parser key "data.image_size":\n  Expected a <class \'int\'>. Got value: abc')
    'data.image_size=abc is not allowed; expected int'
    >>> parse_error_line(
    ...     'Parser key "trainer.max_epochs":\n  Does not validate against any of the Union subtypes\n'
    ...     "  Subtypes: [<class 'int'>, <class 'NoneType'>]\n  Errors:\n    - Expected a <class 'int'>\n"
    ...     "    - Expected a <class 'NoneType'>\n  Given value type: <class 'str'>\n  Given value: abc"
    ... )
    'trainer.max_epochs=abc is not allowed; expected int or null'
    """
    message = unwrap_class_option_error(message)  # --data.image_size=big: jsonargparse blames all of --data
    if class_path_line := class_path_error_line(message):  # --data=no.such.Class, --data.no_such_option
        return class_path_line
    key = re.match(r'Parser key "([^"]+)":', message)
    value = re.search(r"(?:Given|Got) value: (.*?)\s*$", message)
    expected = re.findall(r"Expected a (.+?)(?:\. Got value|\n|$)", message)
    if not (key and value and expected):
        return one_line(message)
    names = {"<class 'NoneType'>": "null"}
    allowed = [names.get(t, re.sub(r"^<class '(.+)'>$|^typing\.Literal\[(.+)\]$", r"\1\2", t)) for t in expected]
    return f"{key.group(1)}={value.group(1)} is not allowed; expected {' or '.join(allowed)}"


@functools.cache
def _register_once() -> None:
    """Make the template's strategies known to Lightning before any Trainer exists; every process a
    launcher starts runs ``python -m project`` again, and so this too."""
    register_strategies()
    atexit.register(leave_gloo_process_group)


def main(args: ArgsType = None, model: str = "", data: str = "") -> ProjectCLI:
    """The trainer commands of ``python -m project``; ``args`` replaces ``sys.argv[1:]`` (for tests).

    ``model`` is the dotted path of the LightningModule and ``data`` that of the data module ``--data``
    defaults to: the template layer names its own (``project/__main__.py``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    package_logger = logging.getLogger("project")
    package_logger.handlers[:] = [handler]
    package_logger.setLevel(logging.INFO)
    package_logger.propagate = False
    _register_once()
    silence_known_noise()
    # Parse errors raise instead of printing the whole usage, so they too come out as one line.
    raising = {"exit_on_error": False}
    try:
        return ProjectCLI(
            import_object(model) if model else LightningModule,
            LightningDataModule,
            subclass_mode_model=not model,
            subclass_mode_data=True,
            default_data=data or None,
            # One way to choose the optimizer and schedule: the model's options (--model.optimizer, ...),
            # which keep the per-step warm-up; LightningCLI's --optimizer would replace configure_optimizers.
            auto_configure_optimizers=False,
            seed_everything_default=42,
            trainer_defaults={"max_epochs": 10},
            save_config_kwargs={"overwrite": True},
            parser_kwargs={
                "prog": "python -m project",
                "description": "Train, evaluate and time one image classifier; compare strategies with "
                "`python -m project bench --help`.",
                **raising,
                **{subcommand: dict(raising) for subcommand in LightningCLI.subcommands()},
            },
            args=args,
        )
    except ProjectError as err:
        # Every process of a multi-process run meets the same bad input: one line per machine is enough.
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except ArgumentError as err:
        argv = sys.argv[1:] if args is None else list(args)
        command = [word for word in argv if word in TRAINER_COMMANDS][:1]
        help_command = " ".join(["python -m project", *command, "--help"])
        line = config_shape_error(str(err), argv) or parse_error_line(str(err))
        print(f"error: {line} (see {help_command})", file=sys.stderr)
        raise SystemExit(2) from None

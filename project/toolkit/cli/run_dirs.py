"""Where a run writes: a ``version_N`` run folder per command under ``<default_root_dir>/lightning_logs``, also
with ``--trainer.logger=false`` (nothing lands in the working directory, ``--ckpt_path=last`` finds it). An evaluation
of a fit's checkpoint with the fit's setup (:data:`SAME_SETUP`) writes into that fit's folder, its config as
``config-<subcommand>.yaml``: it sits with the training it evaluates, and its ModelCheckpoint finds its folder.
Loggers beside TensorBoard (``configs/logger/``): a CSVLogger's ``metrics.csv`` goes there too (an evaluation's into
``version_N/<subcommand>``), an MLFlowLogger without a ``tracking_uri`` into ``<default_root_dir>/mlflow.db``.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import Namespace

from project.toolkit.errors import ProjectError
from project.toolkit.helpers import found, is_remote, joined

DEFAULT_LOGGER_NAME = "lightning_logs"  # Lightning's default logger's folder
TENSORBOARD_LOGGER = "project.toolkit.callbacks.views.TensorBoardLogger"  # Lightning's, without placeholders
RECORDED = re.compile(r"version_\d+")  # a version (or MLflow run name) placed here, as config.yaml records it
# A tracker's logger -> the module it needs, its name, the extra that installs it.
TRACKER_PACKAGES = {"MLFlowLogger": ("mlflow", "MLflow", "mlflow"), "WandbLogger": ("wandb", "wandb", "wandb")}
CLAIMED = "PROJECT_RUN_FOLDER"  # the run folder a run's first process claimed, for the processes it starts


def folder_loggers(logger: Any) -> list[Any]:
    """The TensorBoard and CSV loggers of a config's ``trainer.logger`` (one or a list): those with a ``version_N``."""
    entries = logger if isinstance(logger, list) else [logger]
    return [e for e in entries if str(getattr(e, "class_path", "")).endswith(("TensorBoardLogger", "CSVLogger"))]


def runs_root(trainer_config: Any) -> Path | str:
    """The folder of the ``version_N`` run folders (a URL under a remote root): the first folder logger's folder."""
    root = trainer_config.get("default_root_dir") or os.getcwd()
    init_args = next((e.init_args for e in folder_loggers(trainer_config.get("logger"))), None)
    if init_args is None:
        return joined(root, DEFAULT_LOGGER_NAME)
    return joined(root, init_args.get("save_dir"), init_args.get("name", DEFAULT_LOGGER_NAME))


def run_folder_of(checkpoint: Any) -> Path | None:
    """``.../version_N`` for a checkpoint at ``.../version_N/checkpoints/<file>``; None for any other path."""
    if not isinstance(checkpoint, (str, Path)) or Path(checkpoint).absolute().parent.name != "checkpoints":
        return None
    folder = Path(checkpoint).absolute().parent.parent
    return folder if folder.name.startswith("version_") and folder.name[8:].isdigit() else None


# The options that make an evaluation's timing comparable with its fit's (timing.json describes both as one run).
SAME_SETUP = tuple(
    "trainer.accelerator trainer.strategy trainer.devices trainer.num_nodes trainer.precision data.image_size "
    "data.batch_size".split()
)


def same_setup(fit_run: Path, config: Any, resolved: dict[str, Any] | None = None) -> bool:
    """Whether ``config`` sets the :data:`SAME_SETUP` options as the ``config.yaml`` of ``fit_run`` did; a data
    setting the fit left unset (null), or that the data module resolved (``resolved``: the checkpoint's data
    settings), matches what the fit ran with."""
    if (fit_config := saved_config(fit_run)) is None:
        return False
    own_config = config.as_dict() if isinstance(config, Namespace) else config
    resolved = resolved or {}

    def same(key: str) -> bool:
        own, fit = setting(own_config, key), setting(fit_config, key)
        data_key = key.removeprefix("data.") if key.startswith("data.") else None
        return own == fit or (data_key is not None and (fit is None or resolved.get(data_key, fit) == own))

    return all(same(key) for key in SAME_SETUP)


def checkpoint_data_settings(checkpoint: Any) -> dict[str, Any]:
    """The data settings a checkpoint file records (its data module's, as resolved in the fit); empty if none."""
    try:  # checked, or allowed by name where trusted (--weights_only=false), before this
        saved = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError):  # a folder (sharded), unreadable
        return {}
    return dict(saved.get("datamodule_hyper_parameters") or {}) if isinstance(saved, dict) else {}


def saved_config(run_folder: Path) -> dict[str, Any] | None:
    """The options a run folder's ``config.yaml`` records; None where it has none."""
    saved = run_folder / "config.yaml"
    return (yaml.safe_load(saved.read_text()) or {}) if saved.is_file() else None


def setting(config: Any, key: str) -> Any:
    """The value of a dotted ``key`` in a config dict, looking inside ``init_args`` where a section is given by
    class; None if absent."""
    value = config
    for part in key.split("."):
        if isinstance(value, dict) and part not in value and isinstance(value.get("init_args"), dict):
            value = value["init_args"]
        value = value.get(part) if isinstance(value, dict) else None
    return value


def starts_run() -> bool:  # whether this process starts its run: global rank 0, or ddp's launcher before the others
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def claim_version(root: Path | str, claim: bool) -> str:
    """The run's ``version_N`` under ``root``. Where ``claim``, the run's first process makes it with one ``mkdir``, the
    next number where another run made it first; the ranks ddp's launcher starts take it from their environment, others
    (torchrun, srun) a provisional one: Lightning hands them rank 0's folder. Not on a remote root (no atomic mkdir)."""
    number = max([int(n) for p in found(root, "version_*") if (n := Path(p).name[8:]).isdigit()], default=-1) + 1
    if not starts_run():
        return given.name if (given := Path(os.environ.get(CLAIMED, "/"))).parent == Path(root) else f"version_{number}"
    os.environ.pop(CLAIMED, None)
    while claim and not is_remote(root):
        try:
            os.makedirs(Path(root, f"version_{number}"))  # FileExistsError where that very folder exists
            os.environ[CLAIMED] = str(Path(root, f"version_{number}"))
            break
        except FileExistsError:
            number += 1
    return f"version_{number}"


def arrange_run_folder(subcommand: str, config: Any) -> str | None:
    """Point the run's outputs at its run folder by editing the parsed ``config`` before the Trainer is built; returns
    the config's file name where it is not ``config.yaml``. Every rank computes it; rank 0 alone writes."""
    trainer = config.trainer
    if str(trainer.get("default_root_dir")).startswith("file://"):  # Lightning would take it for a relative folder
        trainer.default_root_dir = str(joined(trainer.default_root_dir))
    logger = trainer.get("logger")
    fit_run = run_folder_of(config.get("ckpt_path")) if subcommand != "fit" else None
    if fit_run is not None and not same_setup(fit_run, config, checkpoint_data_settings(config.ckpt_path)):
        fit_run = None
    root_dir, root = trainer.get("default_root_dir") or os.getcwd(), runs_root(trainer)
    if logger in (None, True):  # Lightning's default logger, without its placeholder cards (see views.py)
        logger = trainer.logger = Namespace(class_path=TENSORBOARD_LOGGER, init_args=Namespace())
    entries = logger if isinstance(logger, list) else [logger]
    kinds = [str(getattr(e, "class_path", "")).rsplit(".", 1)[-1] for e in entries]
    for kind, (module, name, extra) in TRACKER_PACKAGES.items():  # said before a run folder is claimed
        if kind in kinds and importlib.util.find_spec(module) is None:
            raise ProjectError(f"trainer.logger: {kind} needs {name}, not installed: pip install '.[{extra}]'")
    mlflow, wandb = ([e.init_args for e, k in zip(entries, kinds, strict=True) if k == t] for t in TRACKER_PACKAGES)
    loggers = folder_loggers(logger)  # a config.yaml's version_N is not kept: a rerun is a new run
    kept = [(v := e.init_args.get("version")) is not None and not RECORDED.fullmatch(str(v)) for e in loggers]
    version = fit_run.name if fit_run else claim_version(root, logger is False or not all(kept))  # one for all
    if logger is False:
        trainer.default_root_dir = str(fit_run or joined(root, version))
    for entry, keep in zip(loggers, kept, strict=True):
        args = entry.init_args
        if fit_run is None:  # save_dir: relative to default_root_dir
            args.save_dir = str(joined(root_dir, args.get("save_dir")))
            args.version = args.version if keep else version
        elif entry.class_path.endswith("CSVLogger"):  # an evaluation's metrics.csv of its own: the fit's is kept
            args.save_dir, args.name, args.version = str(fit_run), "", subcommand
        else:
            args.save_dir, args.name, args.version = str(fit_run.parent.parent), fit_run.parent.name, version
    if fit_run is not None:  # TensorBoard first: the first logger's folder is the run folder (the fit's)
        entries.sort(key=lambda entry: not str(getattr(entry, "class_path", "")).endswith("TensorBoardLogger"))
    for args in mlflow:
        if not args.get("run_name") or RECORDED.match(args.run_name):  # named by its run folder
            args.run_name = f"{version}-{subcommand}"
        if not args.get("tracking_uri"):  # MLflow's local store, beside the runs
            where = Path(root_dir).absolute()
            args.tracking_uri, args.artifact_location = f"sqlite:///{where / 'mlflow.db'}", str(where / "mlruns")
    if wandb:
        from project.toolkit.wandb_run import arrange_wandb_runs  # only with a W&B logger

        resumed = run_folder_of(config.get("ckpt_path")) if subcommand == "fit" else None
        recorded = setting(saved_config(resumed) or {}, "trainer.logger") if resumed else None
        arrange_wandb_runs(wandb, fit_run or root / version, subcommand, recorded or [], RECORDED)
    return None if fit_run is None else f"config-{subcommand}.yaml"

"""DeepSpeed (ZeRO) through Lightning's own ``deepspeed``, ``deepspeed_stage_1|2|3`` and ``*_offload``
strategies: a one-line refusal where they cannot run, and their checkpoints on a single device.

Lightning's ``DeepSpeedStrategy`` runs on CUDA GPUs only (it raises in ``setup_environment`` for any
other accelerator, after the model and data are built, with a traceback) and needs the ``deepspeed``
package, which the template installs only on request (``pip install -e '.[deepspeed]'``).
:func:`check_deepspeed_choice` says so before anything is built.

A DeepSpeed checkpoint is a folder, not a file: every rank writes its shard of the optimizer state (and,
under ZeRO-3, of the weights) into ``<name>.ckpt/checkpoint/``, and ``<name>.ckpt/latest`` names that
subfolder. Resuming under DeepSpeed needs the folder as it is. To test, predict or fine-tune on a single
device without DeepSpeed, :func:`single_device_checkpoint` consolidates it once into one ordinary Lightning
checkpoint file beside it (``<name>.consolidated.ckpt``: full fp32 weights and Lightning's state, no
optimizer state), when the checkpoint is used rather than after every fit: most checkpoints are never
loaded on a single device, and each consolidation reads every shard. :func:`resolve_deepspeed_checkpoint`
is the whole decision for the command line.

Not run here: the development machines have no CUDA GPU, so DeepSpeed itself, the folder layout it writes
and the consolidation were not exercised by the tests; they follow Lightning 2.6's
``DeepSpeedStrategy.save_checkpoint`` (``tag="checkpoint"``) and
``lightning.pytorch.utilities.deepspeed.convert_zero_checkpoint_to_fp32_state_dict``.
``python -m benchmarks.gpu_check`` runs ``deepspeed_stage_2`` and ``test --ckpt_path=last`` after it on a GPU.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.strategies import DeepSpeedStrategy

from project.toolkit.checkpoint_io import AtomicCheckpointIO
from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger

log = get_logger(__name__)

INSTALL = "pip install -e '.[deepspeed]'"

# What DeepSpeed's engine adds to the client state of its model-states file (deepspeed's
# runtime/checkpoint_engine, ``_save_checkpoint``). Lightning's converter drops some of them; the rest are
# dropped here, so the consolidated file is an ordinary Lightning checkpoint -- one that
# ``torch.load(weights_only=True)``, as LightningCLI reads hyperparameters, can open.
DEEPSPEED_ENGINE_KEYS = (
    "module",
    "buffer_names",
    "optimizer",
    "param_shapes",
    "frozen_param_shapes",
    "shared_params",
    "frozen_param_fragments",
    "lr_scheduler",
    "data_sampler",
    "random_ltd",
    "sparse_tensor_module_names",
    "csr_tensor_module_names",
    "skipped_steps",
    "global_steps",
    "global_samples",
    "dp_world_size",
    "mp_world_size",
    "ds_config",
    "ds_version",
)


# --------------------------------------------------------------------------- choosing DeepSpeed


def _class_path(value: object) -> str | None:
    """The ``class_path`` of a strategy or accelerator given as YAML / ``--x.class_path=...``."""
    if isinstance(value, Mapping):
        path = value.get("class_path")
    else:
        path = getattr(value, "class_path", None)  # jsonargparse's Namespace
    return path if isinstance(path, str) else None


def is_deepspeed_strategy(strategy: object) -> bool:
    """Whether ``strategy`` (a registered name, a class path, a class, an instance, or a ``class_path``
    mapping) is Lightning's DeepSpeed strategy.

    >>> [is_deepspeed_strategy(s) for s in ("deepspeed_stage_2", DeepSpeedStrategy, "ddp")]
    [True, True, False]
    """
    if isinstance(strategy, str):
        name = strategy.strip()
        return name.lower().startswith("deepspeed") or name.rsplit(".", 1)[-1] == DeepSpeedStrategy.__name__
    if isinstance(strategy, type):
        return issubclass(strategy, DeepSpeedStrategy)
    if isinstance(strategy, DeepSpeedStrategy):
        return True
    path = _class_path(strategy)
    return path is not None and is_deepspeed_strategy(path)


def _on_cuda(accelerator: object) -> tuple[bool, str]:
    """Whether ``accelerator`` means CUDA GPUs here, and if not, why not (for the message)."""
    if accelerator is None or accelerator == "auto":
        if torch.cuda.is_available():
            return True, ""
        return False, f"trainer.accelerator={accelerator or 'auto'!r} and this machine has no CUDA GPU"
    if isinstance(accelerator, str):
        name = accelerator.strip().rsplit(".", 1)[-1].lower()  # a name, or a class path
    elif isinstance(accelerator, CUDAAccelerator) or (
        isinstance(accelerator, type) and issubclass(accelerator, CUDAAccelerator)
    ):
        return True, ""
    else:
        name = (_class_path(accelerator) or type(accelerator).__name__).rsplit(".", 1)[-1].lower()
    if name in ("gpu", "cuda", CUDAAccelerator.__name__.lower()):
        return True, ""
    return False, f"trainer.accelerator={name!r}"


def _shown(strategy: object) -> str:
    if isinstance(strategy, str):
        return repr(strategy)
    if isinstance(strategy, type):
        return strategy.__name__
    return _class_path(strategy) or type(strategy).__name__


def _deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def check_deepspeed_choice(strategy: object, accelerator: object) -> None:
    """Refuse, in one line, a DeepSpeed strategy off CUDA GPUs (``cpu``, another accelerator, or ``auto``
    on a machine without a CUDA GPU) or without the ``deepspeed`` package. Anything else passes.

    >>> check_deepspeed_choice("deepspeed_stage_2", "cpu")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    project.toolkit.errors.ProjectError: trainer.strategy='deepspeed_stage_2': DeepSpeed runs on CUDA GPUs only ...
    >>> check_deepspeed_choice("ddp", "cpu")
    """
    if not is_deepspeed_strategy(strategy):
        return
    on_cuda, why_not = _on_cuda(accelerator)
    if not on_cuda:
        raise ProjectError(
            f"trainer.strategy={_shown(strategy)}: DeepSpeed runs on CUDA GPUs only (Lightning's DeepSpeedStrategy), "
            f"but {why_not}; on CPUs use --trainer.strategy=ddp or --trainer.strategy=fsdp"
        )
    if not _deepspeed_installed():
        raise ProjectError(
            f"trainer.strategy={_shown(strategy)} needs the deepspeed package, which is not installed: {INSTALL}"
        )


# --------------------------------------------------------------------------- its checkpoints


def is_deepspeed_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint folder as DeepSpeed writes one: a ``latest`` file naming a subfolder
    (Lightning's tag: ``checkpoint``) that holds the model-states file(s) (``mp_rank_00_model_states.pt``;
    ``zero_pp_rank_0_mp_rank_00_model_states.pt`` under ZeRO-3) beside the ``*_optim_states.pt`` shards."""
    folder = Path(path)
    latest = folder / "latest"
    if not folder.is_dir() or not latest.is_file():
        return False
    try:
        tag = latest.read_text().strip()
    except OSError:
        return False
    return bool(tag) and (folder / tag).is_dir() and any((folder / tag).glob("*model_states.pt"))


def consolidated_path(folder: str | Path) -> Path:
    """Where the single-file form of a DeepSpeed checkpoint folder goes: beside it, ``.consolidated`` added.

    >>> consolidated_path("runs/version_0/checkpoints/last.ckpt").name
    'last.consolidated.ckpt'
    """
    folder = Path(folder)
    return folder.with_name(f"{folder.name.removesuffix('.ckpt')}.consolidated.ckpt")


def consolidate_deepspeed_checkpoint(folder: str | Path, output_file: str | Path) -> Path:
    """Write the DeepSpeed checkpoint ``folder`` as one Lightning checkpoint file, ``output_file``: the full
    fp32 weights gathered from every rank's shard (``state_dict``) and Lightning's own state (epoch, loops,
    callbacks, hyperparameters), without optimizer state. It loads on a single device, without DeepSpeed.

    Uses Lightning's ``convert_zero_checkpoint_to_fp32_state_dict`` (which needs the deepspeed package to
    read the shards), then drops DeepSpeed's engine keys (:data:`DEEPSPEED_ENGINE_KEYS`). Written as every
    checkpoint is (:class:`project.toolkit.checkpoint_io.AtomicCheckpointIO`): several processes may
    consolidate the same folder at once, and a reader never sees half a file.
    """
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    output = Path(output_file)
    converted = output.with_name(f".{output.name}.converted-{os.getpid()}")  # the converter writes a file
    try:
        checkpoint = convert_zero_checkpoint_to_fp32_state_dict(folder, converted)
        for key in DEEPSPEED_ENGINE_KEYS:
            checkpoint.pop(key, None)
        AtomicCheckpointIO().save_checkpoint(checkpoint, output)
    finally:
        converted.unlink(missing_ok=True)
    return output


def _newest_change(folder: Path) -> float:
    return max((p.stat().st_mtime for p in folder.rglob("*") if p.is_file()), default=folder.stat().st_mtime)


def single_device_checkpoint(path: str | Path) -> str:
    """``path`` itself, unless it is a DeepSpeed checkpoint folder: then its consolidated file
    (:func:`consolidated_path`), made by :func:`consolidate_deepspeed_checkpoint` if it is missing or older
    than the folder's contents (``last.ckpt`` is rewritten in place every epoch), else reused.

    >>> single_device_checkpoint("runs/version_0/checkpoints/last.ckpt")  # a file, or nothing: as given
    'runs/version_0/checkpoints/last.ckpt'
    """
    folder = Path(path)
    if not is_deepspeed_checkpoint(folder):
        return str(path)
    output = consolidated_path(folder)
    if output.is_file() and output.stat().st_mtime >= _newest_change(folder):
        log.info("--ckpt_path=%s: a DeepSpeed checkpoint folder; using its single-file form %s", path, output)
        return str(output)
    if not _deepspeed_installed():
        raise ProjectError(
            f"--ckpt_path={path} is a DeepSpeed checkpoint folder; making one file of it for a single device needs "
            f"the deepspeed package, which is not installed: {INSTALL}"
        )
    log.info("--ckpt_path=%s: a DeepSpeed checkpoint folder; consolidating it into %s (once)", path, output)
    return str(consolidate_deepspeed_checkpoint(folder, output))


def resolve_deepspeed_checkpoint(path: str | Path, strategy: object, subcommand: str) -> str:
    """The checkpoint a run should load, given ``--ckpt_path`` (already resolved from ``last``/``best``), the
    run's strategy and subcommand: under a DeepSpeed strategy the folder as it is (DeepSpeed loads its own
    shards, optimizer state included); otherwise a DeepSpeed folder's single file, except for ``fit``, which
    would need the optimizer state that only DeepSpeed can restore. Anything but a DeepSpeed folder: as given.

    >>> resolve_deepspeed_checkpoint("last.ckpt", "ddp", "fit")
    'last.ckpt'
    """
    if not is_deepspeed_checkpoint(path) or is_deepspeed_strategy(strategy):
        return str(path)
    if subcommand == "fit":
        raise ProjectError(
            f"--ckpt_path={path} is a DeepSpeed checkpoint folder: resume it with the DeepSpeed strategy it was "
            f"trained with (--trainer.strategy=deepspeed_stage_N), whose optimizer state it holds; or test it on "
            f"any device with `python -m project test --ckpt_path={path}`"
        )
    return single_device_checkpoint(path)

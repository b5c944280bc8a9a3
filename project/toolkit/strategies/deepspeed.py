"""Lightning's DeepSpeed strategies: refused in one line off CUDA GPUs or without ``deepspeed``; their checkpoint
folders consolidated into one file beside them for a single device. ``python -m benchmarks.gpu_check`` runs them."""

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

# What DeepSpeed's engine adds to a checkpoint's client state; dropped, so the consolidated file is an ordinary
# Lightning checkpoint that ``torch.load(weights_only=True)`` opens.
DEEPSPEED_ENGINE_KEYS = tuple(
    "module buffer_names optimizer param_shapes frozen_param_shapes shared_params frozen_param_fragments "
    "lr_scheduler data_sampler random_ltd sparse_tensor_module_names csr_tensor_module_names skipped_steps "
    "global_steps global_samples dp_world_size mp_world_size ds_config ds_version".split()
)


def _class_path(value: object) -> str | None:
    """The ``class_path`` of a strategy or accelerator given as YAML / ``--x.class_path=...``."""
    path = value.get("class_path") if isinstance(value, Mapping) else getattr(value, "class_path", None)
    return path if isinstance(path, str) else None


def is_deepspeed_strategy(strategy: object) -> bool:
    """Whether ``strategy`` (a name, a class path, a class, an instance or a ``class_path`` mapping) is DeepSpeed."""
    if isinstance(strategy, str):
        name = strategy.strip()
        return name.lower().startswith("deepspeed") or name.rsplit(".", 1)[-1] == DeepSpeedStrategy.__name__
    if isinstance(strategy, type):
        return issubclass(strategy, DeepSpeedStrategy)
    path = _class_path(strategy)
    return isinstance(strategy, DeepSpeedStrategy) or (path is not None and is_deepspeed_strategy(path))


def _on_cuda(accelerator: object) -> tuple[bool, str]:
    """Whether ``accelerator`` means CUDA GPUs here, and if not, why not."""
    if accelerator is None or accelerator == "auto":
        if torch.cuda.is_available():
            return True, ""
        return False, f"trainer.accelerator={accelerator or 'auto'!r} and this machine has no CUDA GPU"
    if issubclass(accelerator if isinstance(accelerator, type) else type(accelerator), CUDAAccelerator):
        return True, ""
    path = accelerator if isinstance(accelerator, str) else _class_path(accelerator) or type(accelerator).__name__
    name = path.strip().rsplit(".", 1)[-1].lower()  # of a name, or a class path
    if name in ("gpu", "cuda", CUDAAccelerator.__name__.lower()):
        return True, ""
    return False, f"trainer.accelerator={name!r}"


def _shown(strategy: object) -> str:
    if isinstance(strategy, str):
        return repr(strategy)
    return strategy.__name__ if isinstance(strategy, type) else _class_path(strategy) or type(strategy).__name__


def _deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def check_deepspeed_choice(strategy: object, accelerator: object) -> None:
    """Refuse, in one line, a DeepSpeed strategy off CUDA GPUs or without the ``deepspeed`` package."""
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


def is_deepspeed_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a DeepSpeed checkpoint folder: a ``latest`` file naming a subfolder of model states."""
    folder = Path(path)
    latest = folder / "latest"
    try:
        tag = latest.read_text().strip() if folder.is_dir() and latest.is_file() else ""
    except OSError:
        return False
    return bool(tag) and (folder / tag).is_dir() and any((folder / tag).glob("*model_states.pt"))


def consolidated_path(folder: str | Path) -> Path:
    """Where the single-file form of a DeepSpeed checkpoint folder goes: beside it, ``.consolidated`` added."""
    return Path(folder).with_name(f"{Path(folder).name.removesuffix('.ckpt')}.consolidated.ckpt")


def consolidate_deepspeed_checkpoint(folder: str | Path, output_file: str | Path) -> Path:
    """Write DeepSpeed checkpoint ``folder`` as one Lightning file (fp32 weights, no optimizer state), atomically."""
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


def single_device_checkpoint(path: str | Path) -> str:
    """``path``, or for a DeepSpeed checkpoint folder its consolidated file, made if missing or older than it."""
    folder = Path(path)
    if not is_deepspeed_checkpoint(folder):
        return str(path)
    output = consolidated_path(folder)
    newest = max((p.stat().st_mtime for p in folder.rglob("*") if p.is_file()), default=folder.stat().st_mtime)
    if output.is_file() and output.stat().st_mtime >= newest:
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
    """The checkpoint a run loads: a DeepSpeed folder as it is under DeepSpeed, else its single file (not to fit)."""
    if not is_deepspeed_checkpoint(path) or is_deepspeed_strategy(strategy):
        return str(path)
    if subcommand == "fit":
        raise ProjectError(
            f"--ckpt_path={path} is a DeepSpeed checkpoint folder: resume it with the DeepSpeed strategy it was "
            f"trained with (--trainer.strategy=deepspeed_stage_N), whose optimizer state it holds; or test it on "
            f"any device with `python -m project test --ckpt_path={path}`"
        )
    return single_device_checkpoint(path)

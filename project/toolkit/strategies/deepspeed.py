"""Lightning's DeepSpeed strategies: refused in one line off CUDA GPUs or without ``deepspeed``, and their checkpoint
folders outside DeepSpeed, with Lightning's converter named. ``python -m benchmarks.gpu_check`` runs them."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.strategies import DeepSpeedStrategy

from project.toolkit.errors import ProjectError

INSTALL = "pip install -e '.[deepspeed]'"

CONVERT = (
    "python -c 'from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict as c; "
    'c("{path}", "{path}.fp32")\''
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


def check_deepspeed_checkpoint(path: str | Path, strategy: object) -> None:
    """Refuse a DeepSpeed checkpoint folder outside DeepSpeed in one line, naming Lightning's converter to one file."""
    if is_deepspeed_checkpoint(path) and not is_deepspeed_strategy(strategy):
        raise ProjectError(
            f"--ckpt_path={path} is a DeepSpeed checkpoint folder, which only the DeepSpeed strategy it was trained "
            f"with reads; for any other, make one file of it with Lightning's converter: {CONVERT.format(path=path)}"
        )

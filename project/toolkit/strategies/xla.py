"""XLA without a TPU: the ``xla_cpu`` accelerator (torch_xla's CPU device, ``PJRT_DEVICE=CPU``) and ``single_xla``,
which works by name. torch_xla pins its own torch, so it lives in a separate environment (``make test-xla``)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch
from lightning.pytorch.accelerators import XLAAccelerator
from lightning.pytorch.strategies import SingleDeviceXLAStrategy

from project.toolkit.errors import ProjectError


class XLACPUAccelerator(XLAAccelerator):
    """The one CPU device of torch_xla, registered as ``xla_cpu``; sets ``PJRT_DEVICE=CPU`` if unset."""

    def __init__(self) -> None:
        # Before torch_xla is first imported (the availability check imports it), which reads it once.
        runtime = os.environ.setdefault("PJRT_DEVICE", "CPU")
        if runtime != "CPU":
            raise ProjectError(
                f"--trainer.accelerator=xla_cpu runs on torch_xla's CPU device, but PJRT_DEVICE={runtime}; "
                "unset PJRT_DEVICE, or use --trainer.accelerator=tpu on a TPU"
            )
        if not self.is_available():
            raise ProjectError(
                "--trainer.accelerator=xla_cpu needs torch_xla, which pins its own torch: install the project into "
                "a separate environment with `pip install -e '.[xla]'` (`make test-xla` builds one in .venv-xla)"
            )
        super().__init__()

    @staticmethod
    def is_available() -> bool:
        return importlib.util.find_spec("torch_xla") is not None  # without importing it: PJRT_DEVICE is set first

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> int:
        if str(devices).strip() not in ("1", "[0]"):
            raise ProjectError(
                f"--trainer.devices={devices} is not allowed with xla_cpu: it has one device; several XLA devices "
                "need a TPU (--trainer.accelerator=tpu)"
            )
        return 1

    @staticmethod
    def get_parallel_devices(devices: int | list[int]) -> list[torch.device]:
        return [torch.device("xla", 0)]

    @staticmethod
    def name() -> str:
        return "xla_cpu"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        description = "torch_xla's CPU device (PJRT_DEVICE=CPU), one device"
        accelerator_registry.register(cls.name(), cls, description=description, override=True)


class SingleXLAStrategy(SingleDeviceXLAStrategy):
    """Lightning's one-XLA-device strategy as ``single_xla``, with the default device Lightning's registration lacks.

    Args:
        device: Index of the XLA device.
    """

    strategy_name = "single_xla"

    def __init__(self, device: int = 0) -> None:
        super().__init__(device=device)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("single_xla", cls, description="one XLA device (TPU core or xla_cpu)", override=True)

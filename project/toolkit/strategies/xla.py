"""XLA without a TPU: the ``xla_cpu`` accelerator, and a ``single_xla`` that works by name.

On a TPU, ``--trainer.accelerator=tpu --trainer.strategy=xla`` is Lightning's own XLA support, one
process per TPU core. Without a TPU Lightning finds no XLA device: its ``XLAAccelerator`` counts TPU
chips through the cloud metadata server. ``xla_cpu`` reports torch_xla's CPU device
(``PJRT_DEVICE=CPU``) instead, and Lightning's single-device XLA strategy and precision then run
unchanged: lazy tensors, graph compilation, ``xm.optimizer_step``. One device only: several CPU XLA
devices in one process did not synchronise here (multi-core XLA is a TPU matter), and Lightning's
``xla`` strategy refuses a single device, so one device means ``single_xla``. torch_xla pins its own
torch, so it lives in a separate environment (``make test-xla``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch
from lightning.pytorch.accelerators import XLAAccelerator
from lightning.pytorch.strategies import SingleDeviceXLAStrategy

from project.toolkit.errors import ProjectError


def xla_available() -> bool:
    """Whether torch_xla is installed (imported only once ``xla_cpu`` has set ``PJRT_DEVICE``)."""
    return importlib.util.find_spec("torch_xla") is not None


class XLACPUAccelerator(XLAAccelerator):
    """The one CPU device of torch_xla, registered as ``xla_cpu``; sets ``PJRT_DEVICE=CPU`` if unset."""

    def __init__(self) -> None:
        # Before torch_xla is first imported (the availability check imports it): it reads this once.
        runtime = os.environ.setdefault("PJRT_DEVICE", "CPU")
        if runtime != "CPU":
            raise ProjectError(
                f"--trainer.accelerator=xla_cpu runs on torch_xla's CPU device, but PJRT_DEVICE={runtime}; "
                "unset PJRT_DEVICE, or use --trainer.accelerator=tpu on a TPU"
            )
        if not xla_available():
            raise ProjectError(
                "--trainer.accelerator=xla_cpu needs torch_xla, which pins its own torch: install the project into "
                "a separate environment with `pip install -e '.[xla]'` (`make test-xla` builds one in .venv-xla)"
            )
        super().__init__()

    @staticmethod
    def is_available() -> bool:
        return xla_available()

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
        accelerator_registry.register(
            cls.name(), cls, description="torch_xla's CPU device (PJRT_DEVICE=CPU), one device", override=True
        )


class SingleXLAStrategy(SingleDeviceXLAStrategy):
    """Lightning's strategy for one XLA device (one TPU core, or ``xla_cpu``), registered as
    ``single_xla``. Lightning registers that name too, but without the device its constructor requires,
    so ``--trainer.strategy=single_xla`` fails there; here the device defaults to the first.

    Args:
        device: Index of the XLA device.
    """

    strategy_name = "single_xla"

    def __init__(self, device: int = 0) -> None:
        super().__init__(device=device)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="one XLA device (TPU core or xla_cpu)", override=True
        )

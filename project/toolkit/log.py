"""A rank-aware logger: under ddp every process runs the same code, and a message that every rank
prints N times is noise. ``get_logger(__name__).info(...)`` prints once, from global rank 0; pass
``rank_zero_only=False`` for messages that matter per rank, which are then prefixed with it."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from lightning.pytorch.utilities import rank_zero_only


class RankedLogger(logging.LoggerAdapter):
    """Logs from global rank 0 only (default), or from every rank with a ``[rank N]`` prefix."""

    def __init__(self, name: str, rank_zero_only: bool = True) -> None:
        super().__init__(logging.getLogger(name), {})
        self.rank_zero_only = rank_zero_only

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        rank = getattr(rank_zero_only, "rank", 0)  # set by Lightning from the launcher's environment
        if self.rank_zero_only and rank != 0:
            return
        if not self.rank_zero_only:
            msg = f"[rank {rank}] {msg}"
        self.logger.log(level, msg, *args, **kwargs)


def get_logger(name: str, rank_zero_only: bool = True) -> RankedLogger:
    return RankedLogger(name, rank_zero_only)


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


LITLOGGER_TIP = "💡 Tip: For seamless cloud logging"


def silence_known_noise() -> None:
    """Filter two messages with nothing for a user to do, by exact text and origin: Lightning's advertisement of
    its litlogger service on every run, and torch's deprecation of ``LeafSpec`` in Lightning's own code."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(LITLOGGER_TIP))
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )

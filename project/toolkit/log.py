"""A rank-aware logger: a message once, from global rank 0, not once per rank (or per rank, prefixed with it)."""

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
    """Filter, by exact text and origin, Lightning's litlogger ad and torch's LeafSpec deprecation in Lightning."""
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

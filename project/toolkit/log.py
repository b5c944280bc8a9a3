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
        rank = getattr(rank_zero_only, "rank", 0)  # set by Lightning from the launcher's environment
        if self.isEnabledFor(level) and (rank == 0 or not self.rank_zero_only):
            self.logger.log(level, msg if self.rank_zero_only else f"[rank {rank}] {msg}", *args, **kwargs)


def get_logger(name: str, rank_zero_only: bool = True) -> RankedLogger:
    return RankedLogger(name, rank_zero_only)


LITLOGGER_TIP = "💡 Tip: For seamless cloud logging"


def _not_the_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(LITLOGGER_TIP)


def silence_known_noise() -> None:
    """Filter, by exact text and origin, Lightning's litlogger ad and torch's LeafSpec deprecation in Lightning."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_not_the_tip)  # once: a filter already there is not added again
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )

"""Raw per-step time stamps of a Lightning run, taken as the plain loops of ``benchmarks/`` take theirs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from project.toolkit.timing.clocks import SyncingClock, synchronizer


class StepStamps(Callback):
    """Writes ``perf_counter()`` stamps to ``path`` (JSON) at the end of fit, test and predict, and under ``"cpu"``
    the process CPU seconds, which change far less than wall time with a shared CPU's load."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamps: dict[str, Any] = {"epoch_starts": [], "train_batch_ends": [], "eval_batches": []}
        self.stamps["cpu"] = {"epoch_starts": [], "train_batch_ends": [], "eval_batches": []}
        self._clock = SyncingClock()
        self._start = (0.0, 0.0)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._clock = SyncingClock(synchronizer(trainer.strategy.root_device))

    def _now(self) -> tuple[float, float]:
        return self._clock.mark(), time.process_time()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for stamps, now in zip((self.stamps, self.stamps["cpu"]), self._now(), strict=True):
            stamps["epoch_starts"].append(now)
            stamps["train_batch_ends"].append([])

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        for stamps, now in zip((self.stamps, self.stamps["cpu"]), self._now(), strict=True):
            stamps["train_batch_ends"][-1].append(now)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.stamps["train_end"], self.stamps["cpu"]["train_end"] = self._now()
        self._write()

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, *args: Any) -> None:
        self._start = self._now()

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        for stamps, start, now in zip((self.stamps, self.stamps["cpu"]), self._start, self._now(), strict=True):
            stamps["eval_batches"].append([start, now, len(batch[0])])

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write()

    # predict is stamped exactly as test is
    on_predict_batch_start = on_test_batch_start
    on_predict_batch_end = on_test_batch_end
    on_predict_end = on_test_end

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.stamps))

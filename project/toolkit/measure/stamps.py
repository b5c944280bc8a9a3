"""Raw per-step time stamps of a Lightning run, for comparing it step by step with a plain loop:
:class:`StepStamps`.

The timing callback summarises; this records: one ``perf_counter()`` per batch, waiting for the
device first where it runs asynchronously, exactly as the plain PyTorch loops of ``benchmarks/``
stamp their own steps -- so both sides of a comparison pay the same for being observed. Beside each
wall-clock stamp it records the process's CPU time (``process_time()``, all its threads), under
``"cpu"`` in the same layout: on a CPU shared with other work, the CPU seconds a step costs change far
less with the load than its wall time. Add it to any run by its class path::

    python -m project fit ... --trainer.callbacks+=project.toolkit.measure.stamps.StepStamps \\
        --trainer.callbacks.path=stamps.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from project.toolkit.measure.devices import SyncingClock, synchronizer


class StepStamps(Callback):
    """Writes ``perf_counter()`` stamps to ``path`` (JSON) at the end of fit, test and predict:
    ``epoch_starts`` and ``train_end`` (after the last checkpoint), ``train_batch_ends`` (a list per
    epoch), and ``eval_batches`` (``[start, end, images]`` of every test or predict batch); and under
    ``"cpu"`` the same stamps in process CPU seconds."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamps: dict[str, Any] = {"epoch_starts": [], "train_batch_ends": [], "eval_batches": []}
        self.stamps["cpu"] = {"epoch_starts": [], "train_batch_ends": [], "eval_batches": []}
        self._clock = SyncingClock()
        self._start = (0.0, 0.0)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Waits for the device at each stamp, as the plain loops do: both sides pay the same.
        self._clock = SyncingClock(synchronizer(trainer.strategy.root_device))

    def _now(self) -> tuple[float, float]:
        """Wall and CPU seconds, after waiting for the device."""
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

"""What the device did during a few training steps, under ``torch.profiler``: busy or idle, launches, host syncs,
top kernels and operators (``step_profile.json``), and the trace for Perfetto (``step_profile.trace.json``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from torch.profiler import ProfilerActivity, profile, record_function

from project.toolkit.errors import ProjectError
from project.toolkit.log import get_logger
from project.toolkit.timing.anatomy import covered
from project.toolkit.timing.clocks import HostClock, synchronizer

log = get_logger(__name__)

STEP = "project.step"  # the annotation around each profiled step
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # trace categories of work on the device
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
HOST_READ = "aten::_local_scalar_dense"  # what .item(), bool() and float() of a device tensor run
TOP = 8  # kernels and operators listed


class StepProfile(Callback):
    """Profile ``steps`` training steps from step ``first_step`` (0-based; best after the warm-up) on rank 0.

    Args:
        first_step: the first training step profiled.
        steps: how many consecutive steps are profiled."""

    def __init__(self, first_step: int = 20, steps: int = 5) -> None:
        if first_step < 0 or steps < 1:
            raise ProjectError(
                f"StepProfile(first_step={first_step}, steps={steps}) is not allowed: first_step >= 0, steps >= 1"
            )
        self.first_step, self.steps = first_step, steps
        self.summary: dict[str, Any] | None = None
        self._profiler: profile | None = None
        self._annotation: record_function | None = None
        self._start = 0.0
        self._seen = 0  # training steps this process has finished
        self._profiled = 0  # of them, in the window
        self._folder = Path()
        self._clock = HostClock()
        self._cuda = False  # whether the device has a timeline of its own to profile

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._clock = HostClock(synchronizer(trainer.strategy.root_device))
        self._cuda = trainer.strategy.root_device.type == "cuda"

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # on every rank: log_dir is broadcast from rank 0, a collective that rank 0 alone would hang in
        self._folder = Path(trainer.log_dir or trainer.default_root_dir)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not (trainer.is_global_zero and self.first_step <= self._seen < self.first_step + self.steps):
            return
        if self._profiler is None:
            activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self._cuda else [])]
            self._profiler = profile(activities=activities)
            self._profiler.__enter__()
            self._start = self._clock.wait()  # nothing queued when the window starts: its device time is its steps
        self._annotation = record_function(STEP)
        self._annotation.__enter__()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._seen += 1
        if self._annotation is None:
            return
        self._annotation.__exit__(None, None, None)
        self._annotation = None
        self._profiled += 1
        if self._profiled == self.steps:
            self._finish(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._profiler is not None:  # the run ended inside the window: what it profiled
            self._finish(trainer)
        elif self.summary is None and trainer.is_global_zero:
            log.warning(
                f"step profile: the run ended after {self._seen} training steps, before step {self.first_step}; "
                "nothing profiled (--trainer.callbacks.first_step sets where the window starts)"
            )

    def _finish(self, trainer: Trainer) -> None:
        assert self._profiler is not None
        wall = self._clock.wait() - self._start  # its wait is in the trace: one of the syncs, taken off below
        self._profiler.__exit__(None, None, None)
        self._folder.mkdir(parents=True, exist_ok=True)
        trace = self._folder / "step_profile.trace.json"
        self._profiler.export_chrome_trace(str(trace))
        self._profiler = None
        events = json.loads(trace.read_text()).get("traceEvents", [])
        self.summary = summarise(events, wall, self._profiled, own_syncs=int(self._cuda))
        self.summary.update(first_step=self.first_step, device=str(trainer.strategy.root_device))
        (self._folder / "step_profile.json").write_text(json.dumps(self.summary, indent=2) + "\n")


def _top(events: list[dict[str, Any]], steps: int) -> list[list[Any]]:
    """``[name, milliseconds per step]`` of the ``TOP`` names of largest total duration."""
    durations: Counter[str] = Counter()
    for e in events:
        durations[e["name"]] += e.get("dur", 0.0)
    return [[name, round(us / 1000 / steps, 4)] for name, us in durations.most_common(TOP)]


def summarise(events: list[dict[str, Any]], wall: float, steps: int, own_syncs: int = 0) -> dict[str, Any]:
    """Per-step figures from a chrome trace's events over ``steps`` steps and ``wall`` seconds, less ``own_syncs``."""
    device = [e for e in events if e.get("cat") in DEVICE_WORK]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    operators = [e for e in events if e.get("cat") == "cpu_op"]
    read_spans = [(e["ts"], e["ts"] + e.get("dur", 0.0)) for e in operators if e["name"] == HOST_READ]
    # a read of a CUDA value waits through its own copy's stream sync: that sync is the read's, counted once
    syncs = sum(e["name"] in SYNC_CALLS and not any(a <= e["ts"] <= b for a, b in read_spans) for e in runtime)
    reads = len(read_spans)
    spans = [(e["ts"], e["ts"] + e.get("dur", 0.0)) for e in device]  # their union: overlaps counted once
    busy = covered(spans, float("-inf"), float("inf")) / 1e6 if device else None
    return {
        "steps": steps,
        "step_seconds": wall / steps,
        "device_busy_seconds": None if busy is None else busy / steps,
        "device_idle_fraction": None if busy is None else max(0.0, 1.0 - busy / wall),
        "kernels": sum(e.get("cat") == "kernel" for e in device) / steps,
        "launches": sum("Launch" in e["name"] for e in runtime) / steps,
        "host_syncs": (max(0, syncs - own_syncs) + reads) / steps,
        "host_reads": reads / steps,
        "top_device_ms": _top(device, steps),
        "top_host_ops_ms": _top(operators, steps),
    }


def one_line(summary: dict[str, Any]) -> str:
    """One line: ``step 24.1 ms: device busy 62 % (idle 38 %), 450 launches, 2.0 host syncs``."""
    head = f"step {summary['step_seconds'] * 1000:.1f} ms: "
    idle = summary["device_idle_fraction"]
    device = "no device timeline" if idle is None else f"device busy {100 * (1 - idle):.0f} % (idle {100 * idle:.0f} %)"
    launches = f", {summary['launches']:.0f} launches" if idle is not None else ""
    return f"{head}{device}{launches}, {summary['host_syncs']:.1f} host syncs"

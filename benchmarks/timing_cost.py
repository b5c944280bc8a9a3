"""``python -m benchmarks.timing_cost``: what the timing callback costs a training run, measured side by side.

The template's own fit three ways: with the timing callback off (``--callbacks.timing=false``), on (the
default: on a GPU, CUDA events read once an epoch) and waiting for the device at every step
(``--timing.sync_every_step=true``). Each of ``--repeats`` sessions is one fresh process that runs the
three there and back (off, on, sync, sync, on, off), the order rotated from one session to the next as
:mod:`benchmarks.paired` rotates its sides (which says why runs share a process and why the order rotates).

Every run carries one extra callback, :class:`EpochWalls`, the same in all three: it waits for the device at
the start and the end of each training epoch and around the validation inside it, and nowhere else -- the
boundaries at which the timing callback waits too. A run's speed is its steady epochs' images (after the
first epoch) over their training seconds, validation left out, so it holds every cost the timing callback
adds, per step and per epoch. Checkpoints are off in all three (their writing would only dilute the
difference). A session's ratio is a variant's mean speed over the off variant's; the headline is
:func:`benchmarks._common.balanced` over the sessions, and the goal (issue 18) the default within 1 % of off.

Cases: on a GPU, MobileNetV2 and ResNet50 with the job's settings (:func:`benchmarks._common.gpu_job_setup`);
on a CPU, MobileNetV2 at 32 px, where the callback's per-step work weighs the most.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.data import extract_batch_size

from benchmarks._common import (
    ROUND,
    Setup,
    balanced,
    common_arguments,
    epoch_throughput,
    gpu_job_setup,
    machine,
    parse,
    publish,
    run,
    verdict,
)
from benchmarks.paired import order, settle_process
from project.toolkit.timing.clocks import HostClock, synchronizer
from project.toolkit.timing.tables import number

GOAL = 0.99
VARIANTS = {  # name -> the options that make it
    "off": ("--callbacks.timing=false",),
    "on": (),
    "sync every step": ("--timing.sync_every_step=true",),
}
assert len(VARIANTS) == ROUND, "balanced() averages rounds of as many sessions as a session has variants"
GPU_CASES = [gpu_job_setup(arch, train_batches=60, epochs=4) for arch in ("mobilenet_v2", "resnet50")]
CPU_CASES = [Setup("mobilenet_v2", image_size=32, batch_size=64, train_batches=8, epochs=3)]


class EpochWalls(Callback):
    """Each training epoch's training seconds (``perf_counter`` after waiting for the device at its start and
    end, less the validation runs inside it, timed the same way) and images, written as JSON to ``path``
    when training ends."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.epochs: list[dict[str, float]] = []
        self._clock = HostClock()
        self._start = self._validation_start = self._validation = 0.0
        self._images = 0
        self._in_epoch = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._clock = HostClock(synchronizer(trainer.strategy.root_device))

    def _now(self) -> float:
        return self._clock.wait()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start, self._validation, self._images, self._in_epoch = self._now(), 0.0, 0, True

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._images += extract_batch_size(batch)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._in_epoch:
            self._validation_start = self._now()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._in_epoch:
            self._validation += self._now() - self._validation_start

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._in_epoch = False
        self.epochs.append({"seconds": self._now() - self._start - self._validation, "images": self._images})

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.epochs))


def steady_speed(epochs: list[dict[str, float]]) -> float:
    """Images per second over the epochs after the first (all of them if there is one).

    >>> steady_speed([{"seconds": 9.0, "images": 10}, {"seconds": 1.0, "images": 10}, {"seconds": 3.0, "images": 30}])
    10.0
    """
    return epoch_throughput(epochs, count="images")


def run_variant(variant: str, setup: Setup, folder: Path) -> float:
    """One fit of ``setup`` with ``variant``'s options, in this process; its steady images per second."""
    from project.__main__ import main

    folder.mkdir(parents=True, exist_ok=True)
    walls = folder / "epochs.json"
    main(
        [
            "fit",
            *setup.cli_args(),
            *VARIANTS[variant],
            "--callbacks.checkpoint=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={folder}",
            f"--trainer.callbacks+={EpochWalls.__module__}.EpochWalls",
            f"--trainer.callbacks.path={walls}",
        ]
    )
    return steady_speed(json.loads(walls.read_text()))


def session_main(spec: str, folder: str) -> None:
    """One session (``{"setup", "rotation"}``): every variant twice, in this process, in the order of the
    rotation; writes ``folder/session.json``, each variant's speeds in the order they ran."""
    options = json.loads(spec)
    setup = Setup(**options["setup"])
    settle_process(setup)
    speeds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for place, name in enumerate(order(options["rotation"], tuple(VARIANTS))):
        speeds[name].append(run_variant(name, setup, Path(folder) / f"{place}-{name.replace(' ', '-')}"))
    Path(folder, "session.json").write_text(json.dumps(speeds))


def measure(setup: Setup, repeats: int, threads: int, work: Path) -> dict[str, Any]:
    """``repeats`` sessions on ``setup``: each variant's median speed and its ratio to off (balanced over
    the sessions), with every session's ratio."""
    runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    ratios: dict[str, list[float]] = {name: [] for name in VARIANTS if name != "off"}
    for repeat in range(repeats):
        folder = work / f"{setup.label.replace(' ', '-')}-{repeat}"
        folder.mkdir(parents=True, exist_ok=True)
        spec = json.dumps({"setup": asdict(setup), "rotation": repeat})
        run(
            [sys.executable, "-m", "benchmarks.timing_cost", "session", spec, str(folder)],
            threads,
            runs=2 * len(VARIANTS),
        )
        speeds = json.loads((folder / "session.json").read_text())
        for name in VARIANTS:
            runs[name] += speeds[name]
        off = statistics.fmean(speeds["off"])
        for name in ratios:
            ratios[name].append(statistics.fmean(speeds[name]) / off)
        said = ", ".join(f"{name} {values[-1]:.3f}" for name, values in ratios.items())
        print(f"  {setup.label} session {repeat} (over off): {said}", flush=True)
    return {
        "case": setup.label,
        "setup": asdict(setup),
        "runs": runs,
        "images_per_second": {name: statistics.median(speeds) for name, speeds in runs.items()},
        "session_ratios": ratios,
        "ratios": {name: balanced(values) for name, values in ratios.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.timing_cost", __doc__.splitlines()[0], default_repeats=3, clock=False)
    args = parse(parser, argv)
    cases = GPU_CASES if torch.cuda.is_available() else CPU_CASES
    started = time.perf_counter()
    print(f"timing_cost: {machine(args.threads)}", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="timing-cost-") as work:
        for case in cases:  # published after each case: a run stopped midway keeps what it measured
            results.append(measure(case, args.repeats, args.threads, Path(work)))
            publish_so_far(args, results, started)


def publish_so_far(args: argparse.Namespace, results: list[dict[str, Any]], started: float) -> None:
    """``timing_cost.{md,json}`` with the cases measured so far."""
    header = ["case", *(f"{name} img/s" for name in VARIANTS), "on / off", "sync / off", "sessions (on / off)"]
    rows = [
        [
            r["case"],
            *(number(r["images_per_second"][name], 1) for name in VARIANTS),
            number(r["ratios"]["on"], 3),
            number(r["ratios"]["sync every step"], 3),
            " ".join(number(v, 3) for v in r["session_ratios"]["on"]),
        ]
        for r in results
    ]
    worst = min(results, key=lambda r: r["ratios"]["on"])
    headline = (
        f"timing_cost: min on/off speed ratio {worst['ratios']['on']:.3f} ({worst['case']}; {args.repeats} sessions "
        f"in rotated orders, balanced over whole rounds); {verdict(worst['session_ratios']['on'], GOAL)}"
    )
    seconds = time.perf_counter() - started
    notes = (
        f"{machine(args.threads)}; {args.repeats} sessions per case, each one process running every variant twice, "
        f"there and back, the order rotated; speed: steady epochs' images over their training seconds; {seconds:.0f} s"
    )
    report = {"machine": machine(args.threads), "seconds": seconds, "repeats": args.repeats, "cases": results}
    publish(args, "timing_cost", report, header, rows, notes, headline)


if __name__ == "__main__":
    if sys.argv[1:2] == ["session"]:  # a session's process, started by measure()
        sys.argv, arguments = sys.argv[:1], sys.argv[2:]  # LightningCLI, called with its own arguments, warns otherwise
        session_main(*arguments)
    else:
        main()

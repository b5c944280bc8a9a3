"""Training overhead of the template: ``python -m project fit`` against a plain PyTorch loop.

All sides train the same network on the same synthetic CIFAR-shaped images, with the same global batch,
SGD and warm-up + cosine schedule, for the same number of steps:

- plain: the loop a careful user writes (``benchmarks.plain.plain_fit``): the images in memory, each
  batch augmented at once in the loop, channels_last, ``zero_grad(set_to_none=True)``, no host reads
  inside the epoch, a validation batch under ``inference_mode`` before training (where the template has
  its sanity check) and after every epoch, a checkpoint every epoch;
- template: ``python -m project fit`` with its defaults -- the input path it picks (on a CPU the same
  in-memory batches), its callbacks (timing, TensorBoard logger, checkpoint at epoch end, progress bar,
  fault guards, reseeding, host memory reuse) -- and one validation batch per epoch. The plain loop
  reuses host memory as the template does (``benchmarks.plain``); ``--options`` adds a case with neither
  doing so;
- lightning (:mod:`benchmarks.lightning_loop`): the plain loop's training step in Lightning's loop, with
  nothing of the template's. Its ratio to the plain loop is the part of the template's cost that is
  Lightning's own, which no option of the template removes; the template's speed over that side's, in the
  same sessions (``template/lightning``), is the part that is the template's.

Each of ``--repeats`` sessions is a fresh process that runs every side twice, there and back (plain,
lightning, template, template, lightning, plain), the order rotated from one session to the next
(:mod:`benchmarks.paired`, which says why the sides share a process and why the order rotates; a multiple
of 3 sessions gives each side each place equally often). Everything is over the epochs after the first
(warm-up):

- throughput (images/s): the batch size over the median step cycle -- end of one training batch to
  the end of the next, so it includes all the per-step work of each side (loading, forward, backward,
  optimizer, logging, metrics, callbacks, progress bar). A session's ratio is the template's mean speed
  over the plain loop's; the headline ratio is :func:`benchmarks._common.balanced` over the sessions (the
  median over rounds of three of each round's mean), each session's ratio shown next to it: how far they
  spread is how well the run resolves the ratio. The speeds shown are the median over each side's runs;
- epoch ratio: the same ratio from whole epochs as ``timing.json`` computes them
  (``train_samples_per_second``: an epoch from its start to its last step) -- what a user sees, but
  on a shared machine as noisy as the load;
- template extra s/epoch: the difference in wall time from one epoch's start to the next, everything
  included (validation, checkpoint, epoch-end logging): the template's fixed cost per epoch.

Cases: on a CPU, small images (``CASES``); on a GPU, the job's settings at each network's fastest precision
(``GPU_CASES``). Both sides wait for the device at every stamp, as :mod:`benchmarks._common` says, which on
a GPU costs each side the same refill of its queue every step.

``--options`` adds variations of the first case, each compared with the plain loop using the same option: they
are reported, not held to the goal, which is for the default options. The last line printed is the headline:
the smallest throughput ratio over the cases held to the goal.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import (
    CLOCKS,
    SIDES,
    Setup,
    balanced,
    common_arguments,
    epoch_throughput,
    gpu_job_setup,
    machine,
    on,
    parse,
    publish_comparison,
    ratios_by_clock,
    run_sessions,
    steady_epoch_wall,
    steady_step_cycle,
)
from project.toolkit.timing.tables import number

GOAL = 0.98
SPEEDS = (*(f"{c}_images_per_second" for c in CLOCKS), "epoch_images_per_second")  # the ratios of a session
# Small images on a CPU, where the template's per-step host work weighs the most: each case's epoch is a
# few seconds of compute, long enough for some step cycles, short enough that the benchmarks take minutes.
# MobileNetV2 takes 24 steps an epoch: with 8 (16 step cycles a run), runs of one side in one session were
# up to 10 % apart on this 2-core machine, and the medians moved by 1.6 points between readings.
CASES = [
    Setup("mobilenet_v2", image_size=32, batch_size=128, train_batches=24),
    Setup("resnet50", image_size=32, batch_size=64, train_batches=6),
]
# On a GPU: the job's settings (benchmarks._common.gpu_job_setup).
GPU_CASES = [gpu_job_setup("mobilenet_v2", train_batches=40), gpu_job_setup("resnet50", train_batches=20)]
# --options: the template's speed options, measured on the cheapest case (compile takes minutes).
OPTIONS = [{"channels_last": False}, {"precision": "bf16-mixed"}, {"compile": True}, {"host_memory_reuse": False}]


def chosen_cases(options: bool) -> list[tuple[Setup, bool]]:
    """The cases of this machine (a GPU's, or a CPU's), with ``--options``' variations of the first; each with
    whether it is held to the goal, which is for the default options: a variation is reported, not held."""
    cases = GPU_CASES if torch.cuda.is_available() else CASES
    variations = [replace(cases[0], **option) for option in OPTIONS] if options else []
    return [(case, True) for case in cases] + [(variation, False) for variation in variations]


def measure(setup: Setup, held: bool, repeats: int, threads: int, work: Path, clock: str) -> dict[str, Any]:
    """``repeats`` sessions (:mod:`benchmarks.paired`) on ``setup``; the headline ``ratio`` on ``clock``
    (template over plain), ``lightning_<clock>_ratio``: Lightning's loop alone over plain,
    ``over_lightning_<clock>_ratio``: the template over Lightning's loop alone, and ``goal``: ``held``."""
    ratios = {key: (key, "template") for key in SPEEDS}
    ratios |= {f"lightning_{c}": (f"{c}_images_per_second", "lightning") for c in CLOCKS}
    figures = partial(speeds, batch_size=setup.batch_size)
    folder = work / setup.label.replace(" ", "-")
    runs, sessions = run_sessions("fit", setup, folder, threads, repeats, figures, ratios)
    result: dict[str, Any] = {"case": setup.label, "setup": setup.__dict__, "goal": held}
    result.update(runs=runs, sessions=sessions)
    result.update(ratios_by_clock(sessions, "{clock}_images_per_second"))
    for key in (f"{c}_images_per_second" for c in CLOCKS):
        result.update({f"{side}_{key}": statistics.median(r[key] for r in runs[side]) for side in SIDES})
    walls = {side: statistics.median(r["epoch_wall_seconds"] for r in runs[side]) for side in ("plain", "template")}
    result.update(
        {
            "ratio": result[f"{clock}_ratio"],
            "epoch_ratio": balanced([ratio["epoch_images_per_second"] for ratio in sessions]),
            "plain_epoch_wall_seconds": walls["plain"],
            "template_epoch_wall_seconds": walls["template"],
            "extra_seconds_per_epoch": walls["template"] - walls["plain"],
        }
    )
    return result


def speeds(result: dict[str, Any], batch_size: int) -> dict[str, float]:
    """One run's training speed in images/s -- from the median step cycle on each clock, and from whole
    epochs as ``timing.json`` computes it -- and its steady epoch's wall seconds."""
    stamps = result["clock"]
    return {
        **{f"{c}_images_per_second": batch_size / steady_step_cycle(on(stamps, c)) for c in CLOCKS},
        "epoch_images_per_second": epoch_throughput(result["epochs"]),
        "epoch_wall_seconds": steady_epoch_wall(stamps),
    }


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.overhead", __doc__.splitlines()[0], default_repeats=3)
    parser.add_argument(
        "--options",
        action="store_true",
        help="also measure --model.channels_last=false, --trainer.precision=bf16-mixed, --model.compile=true and "
        "--callbacks.host_memory_reuse=false; not held to the goal",
    )
    parser.add_argument(
        "--compile", action="store_true", help="compile both sides (--model.compile=true); not held to the goal"
    )
    args = parse(parser, argv)
    cases = chosen_cases(args.options)
    if args.compile:
        cases = [(replace(case, compile=True), False) for case, _ in cases]
    started = time.perf_counter()
    print(f"overhead: {machine(args.threads)}", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="overhead-") as work:
        for case, held in cases:  # published after each case: a run stopped midway keeps what it measured
            results.append(measure(case, held, args.repeats, args.threads, Path(work), args.clock))
            publish_so_far(args, results, started)


def publish_so_far(args: argparse.Namespace, results: list[dict[str, Any]], started: float) -> None:
    """``overhead.{md,json}`` with the cases measured so far."""
    header = [
        "case",
        "batch",
        "clock",
        *(f"{side} img/s" for side in SIDES),
        "ratio",
        "session ratios",
        "lightning ratio",
        "template/lightning",
    ]
    rows = [
        [
            r["case"],
            str(r["setup"]["batch_size"]),
            c,
            *(number(r[f"{side}_{c}_images_per_second"]) for side in SIDES),
            number(r[f"{c}_ratio"], 3) + ("" if r["goal"] else " (an option, not held to the goal)"),
            " ".join(number(p, 3) for p in r[f"{c}_session_ratios"]),
            number(r[f"lightning_{c}_ratio"], 3),
            number(r[f"over_lightning_{c}_ratio"], 3),
        ]
        for r in results
        for c in CLOCKS
    ]
    epochs = ["case", "epoch ratio (wall)", "epoch wall plain / template (s)", "template extra s/epoch"]
    epoch_rows = [
        [
            r["case"],
            number(r["epoch_ratio"], 3),
            f"{number(r['plain_epoch_wall_seconds'], 2)} / {number(r['template_epoch_wall_seconds'], 2)}",
            number(r["extra_seconds_per_epoch"], 2),
        ]
        for r in results
    ]
    publish_comparison(
        args, "overhead", "training throughput", results, header, rows, started, GOAL, extra=(epochs, epoch_rows)
    )


if __name__ == "__main__":
    main()

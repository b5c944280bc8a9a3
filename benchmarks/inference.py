"""Test-time speed of the template: ``python -m project test`` / ``predict`` against a plain loop.

All sides evaluate the same network (fresh weights: speed does not depend on them) on the same
synthetic test images. The plain loop is the one a careful user writes (``benchmarks.plain.plain_infer``):
the images in memory, each batch resized and normalised in the loop, eval mode, ``inference_mode``,
channels_last, results summed or gathered on the device and read once at the end. Template runs use its
defaults (the input path it picks, timing, progress bar, the prediction writer for ``predict``). A third
side, ``lightning`` (:mod:`benchmarks.lightning_loop`), runs the plain loop's steps in Lightning's
evaluation loop with nothing of the template's: its ratio to the plain loop is the part of the
template's cost that is Lightning's own, which no option of the template removes; the template's speed over
that side's, in the same sessions (``template/lightning``), is the part that is the template's own.

Each of ``--repeats`` sessions per case is a fresh process that runs every side twice, there and back
(plain, lightning, template, template, lightning, plain), the order rotated from one session to the next
(:mod:`benchmarks.paired`, which says why the sides share a process and why the order rotates; a multiple of
3 sessions gives each side each place equally often); a session's ratio is the template's mean speed over
the plain loop's, the headline ratio :func:`benchmarks._common.balanced` over the sessions (the median over
rounds of three of each round's mean), each session's ratio shown beside it: how far they spread is how
well the run resolves the ratio. All sides leave the first 3 batches out (the TimingCallback's ``warmup_iterations``).

All sides are stamped at the same instants (the template and the lightning side by the observer callback
``benchmarks.stamps.StepStamps``, at its ``on_*_batch_start`` / ``on_*_batch_end`` hooks):

- throughput (images/s), for ``test`` and ``predict``: the batch size over the median step cycle,
  end of one batch to the end of the next, so everything between batches counts too: loading, the
  hooks, the progress bar, the prediction writer;
- batch-1 latency, for ``test`` and ``predict``: the median time of a batch of one image from its
  arrival on the device to its result (the template's step: the forward pass, and for ``test`` the
  loss and accuracy updates -- the span ``timing.json`` reports as ``<stage>_batch_latency_ms``);
  the ratio is plain latency over template latency. Batch-1 latency is reported, not held to the
  goal: a batch of one is not the default, and there the difference between the sides is a fixed
  cost per batch (shown as ``template extra``), most of it Lightning's evaluation loop around the step --
  hook dispatch and the step's context managers, which the lightning side pays too. The goal, >= 0.98,
  is held by the throughput cases, at the default batch size.

Where a throughput case's batch goes is shown beside it (``inference.md``'s second table): the median
time in the step (the span above) and between two steps (one batch's result to the next one's arrival:
loading, the loop's own work, the hooks), each the median over a side's runs, on the headline clock.

``--batch-sizes 32,256,...`` measures, instead of these cases (and not with ``--options``), MobileNetV2's ``test``
throughput at each batch size (reported, not held to the goal): what a batch spends in Lightning's loop and the
template's hooks is about the same at any size, so its share shrinks as the batch grows, while a cost that grows
with the batch does not; the sweep tells the two apart. Each run takes about as many images as the default
case's (at least 12 batches).

``--options`` adds ``test`` throughput with ``--model.channels_last=false``,
``--trainer.precision=bf16-mixed`` (the plain loop then autocasts to bfloat16 too) and
``--callbacks.host_memory_reuse=false`` (the plain loop then keeps glibc's defaults too). On a GPU the cases
are the job's settings (``GPU_CASES``, and ``GPU_OPTION_CASES`` for ``--options``). An option's case is
reported, not held to the goal, which is for the default options (each option is compared with the plain loop
using the same option). The last line printed is the headline: the smallest ratio (template speed over plain
speed) of the cases held to the goal; with ``--batch-sizes``, which holds none, each case's ratio.
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
    common_arguments,
    eval_between,
    eval_latency,
    eval_step_cycle,
    gpu_job_setup,
    machine,
    on,
    parse,
    publish_comparison,
    ratios_by_clock,
    run_sessions,
    whole_number_above_0,
)
from project.toolkit.timing.tables import number

GOAL = 0.98
WARMUP_BATCHES = 3  # the TimingCallback's default warmup_iterations
# Small images on a CPU: the shortest steps, where per-batch host work weighs the most. Enough
# batches after the warm-up for a steady median (about a second of work each).
MOBILENET = Setup("mobilenet_v2", image_size=32, batch_size=128, test_batches=24)
RESNET = Setup("resnet50", image_size=32, batch_size=64, test_batches=16)
# On a GPU: the job's settings (benchmarks._common.gpu_job_setup).
GPU_MOBILENET = gpu_job_setup("mobilenet_v2", test_batches=24)
GPU_RESNET = gpu_job_setup("resnet50", test_batches=24)
Case = tuple[str, str, Setup, int, str]  # (name, stage, setup, evaluation batch size, what is compared)


def cases_of(mobilenet: Setup, resnet: Setup) -> list[Case]:
    """Test and predict throughput of both networks at their batch size, then batch-1 latency on MobileNetV2."""
    latency = replace(mobilenet, test_batches=40)
    return [
        ("test mobilenet_v2", "test", mobilenet, mobilenet.batch_size, "throughput"),
        ("predict mobilenet_v2", "predict", mobilenet, mobilenet.batch_size, "throughput"),
        ("test resnet50", "test", resnet, resnet.batch_size, "throughput"),
        ("test batch 1", "test", latency, 1, "latency"),
        ("predict batch 1", "predict", latency, 1, "latency"),
    ]


def option_cases_of(mobilenet: Setup, host_memory: bool) -> list[Case]:
    """``--options``: MobileNetV2's test throughput with each speed option changed; ``host_memory``: also without
    reusing freed host memory (a CPU's setting: a GPU run leaves the host's allocator alone)."""
    options = [("contiguous", {"channels_last": False}), ("bf16-mixed", {"precision": "bf16-mixed"})]
    options += [("no host memory reuse", {"host_memory_reuse": False})] if host_memory else []
    batch = mobilenet.batch_size
    return [(f"test {name}", "test", replace(mobilenet, **change), batch, "throughput") for name, change in options]


def batch_size_cases(mobilenet: Setup, sizes: list[int]) -> list[Case]:
    """``--batch-sizes``: MobileNetV2's test throughput at each of ``sizes``, each run about as many images as at
    its default batch size (at least 12 batches)."""
    images = mobilenet.batch_size * (mobilenet.test_batches or 1)
    sized = [(n, replace(mobilenet, test_batches=max(12, images // n))) for n in sizes]
    return [(f"test mobilenet_v2, batch {n}", "test", setup, n, "throughput") for n, setup in sized]


CASES = cases_of(MOBILENET, RESNET)
OPTION_CASES = option_cases_of(MOBILENET, host_memory=True)
GPU_CASES = cases_of(GPU_MOBILENET, GPU_RESNET)
GPU_OPTION_CASES = option_cases_of(GPU_MOBILENET, host_memory=False)


def chosen_cases(options: bool, batch_sizes: list[int] | None = None) -> list[tuple[Case, bool]]:
    """The cases of this machine (a GPU's, or a CPU's), with its ``--options`` cases, or its ``--batch-sizes`` ones
    instead; each with whether it is held to the goal, which is for the default options at the default batch size:
    the throughput cases are, an option's case, another batch size and batch-1 latency are reported, not held."""
    gpu = torch.cuda.is_available()
    if batch_sizes:
        return [(case, False) for case in batch_size_cases(GPU_MOBILENET if gpu else MOBILENET, batch_sizes)]
    defaults = GPU_CASES if gpu else CASES
    variations = (GPU_OPTION_CASES if gpu else OPTION_CASES) if options else []
    held = [((name, stage, setup, batch, kind), kind == "throughput") for name, stage, setup, batch, kind in defaults]
    return held + [(case, False) for case in variations]


def batch_sizes(text: str) -> list[int]:
    """``--batch-sizes``' value: comma-separated whole numbers above 0, each once."""
    refused = argparse.ArgumentTypeError(f"{text!r}: comma-separated batch sizes, whole numbers above 0, each once")
    try:
        numbers = [whole_number_above_0(size) for size in text.split(",")]
    except argparse.ArgumentTypeError:
        raise refused from None
    if len(set(numbers)) < len(numbers):
        raise refused
    return numbers


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.inference", __doc__.splitlines()[0], default_repeats=3)
    cases = parser.add_mutually_exclusive_group()  # the sweep replaces the options' cases with its own
    cases.add_argument(
        "--options",
        action="store_true",
        help="also measure channels_last=false, bf16-mixed and (CPU) host_memory_reuse=false; not held to the goal",
    )
    cases.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        help="comma-separated batch sizes: MobileNetV2's test throughput at each, instead of the other cases; "
        "not held to the goal",
    )
    args = parse(parser, argv)
    cases = chosen_cases(args.options, args.batch_sizes)
    started = time.perf_counter()
    print(f"inference: {machine(args.threads)}", flush=True)
    rows, report = [], []
    with tempfile.TemporaryDirectory(prefix="inference-") as work:
        for (name, stage, setup, batch, kind), held in cases:
            entry = measure(name, stage, setup, batch, kind, held, args, Path(work))
            for c in CLOCKS:
                speeds = [statistics.median(r[f"{c}_speed"] for r in entry["runs"][side]) for side in SIDES]
                if kind == "throughput":
                    unit = "images/s" if held else "images/s; not held to the goal"
                    values = [*(number(v) for v in speeds), unit]
                else:  # shown as the latency itself, in ms, and the template's fixed cost per batch
                    values = [*(number(1000 / v, 2) for v in speeds), "ms (p50)"]
                    entry[f"{c}_extra_ms"] = 1000 / speeds[-1] - 1000 / speeds[0]
                    values[-1] += f"; template extra {entry[f'{c}_extra_ms']:.2f} ms, not held to the goal"
                ratios = " ".join(number(r[c], 3) for r in entry["sessions"])
                floor, own = (number(entry[f"{side}_{c}_ratio"], 3) for side in ("lightning", "over_lightning"))
                rows.append(
                    [name, setup.label, str(batch), c, *values, number(entry[f"{c}_ratio"], 3), ratios, floor, own]
                )
            report.append(entry)
            publish_so_far(args, report, rows, started)  # after each case: a run stopped midway keeps them


def publish_so_far(
    args: argparse.Namespace, report: list[dict[str, Any]], rows: list[list[str]], started: float
) -> None:
    """``inference.{md,json}`` with the cases measured so far (``report``, their table ``rows``)."""
    header = [
        "case",
        "model",
        "batch",
        "clock",
        *SIDES,
        "unit",
        "ratio",
        "session ratios",
        "lightning ratio",
        "template/lightning",
    ]
    split_rows = [
        [
            entry["case"],
            *(
                f"{1000 * statistics.median(r[span] for r in entry['runs'][side]):.2f}"
                for side in SIDES
                for span in ("in_step_seconds", "between_seconds")
            ),
        ]
        for entry in report
        if entry["kind"] == "throughput"
    ]
    split_header = ["case", *(f"{side} {span} ms" for side in SIDES for span in ("in step", "between"))]
    extra = (split_header, split_rows)
    publish_comparison(args, "inference", "speed", report, header, rows, started, GOAL, extra=extra)


def measure(
    name: str, stage: str, setup: Setup, batch: int, kind: str, held: bool, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """``args.repeats`` sessions (:mod:`benchmarks.paired`) of one case; its headline ``ratio`` on ``args.clock``
    (template over plain), ``lightning_<clock>_ratio``: Lightning's loop alone over plain,
    ``over_lightning_<clock>_ratio``: the template over Lightning's loop alone, and ``goal``: ``held``."""
    entry: dict[str, Any] = {"case": name, "stage": stage, "kind": kind, "setup": setup.__dict__, "batch_size": batch}
    entry["goal"] = held
    ratios = {c: (f"{c}_speed", "template") for c in CLOCKS}
    ratios |= {f"lightning_{c}": (f"{c}_speed", "lightning") for c in CLOCKS}
    figures = partial(run_figures, batch_size=batch, kind=kind, clock=args.clock)
    folder = work / name.replace(" ", "-")
    entry["runs"], entry["sessions"] = run_sessions(
        stage, setup, folder, args.threads, args.repeats, figures, ratios, batch
    )
    entry.update(ratios_by_clock(entry["sessions"], "{clock}"))
    entry["ratio"] = entry[f"{args.clock}_ratio"]
    return entry


def run_figures(result: dict[str, Any], batch_size: int, kind: str, clock: str) -> dict[str, float]:
    """One run's speed on each clock -- images per second (throughput) or batches per second at the median
    latency (latency) -- and, on ``clock``, its median time in a step and between two steps."""
    figures = {}
    for c in CLOCKS:
        stamps = on(result["clock"], c)
        if kind == "throughput":
            figures[f"{c}_speed"] = batch_size / eval_step_cycle(stamps, WARMUP_BATCHES)
        else:
            figures[f"{c}_speed"] = 1 / eval_latency(stamps, WARMUP_BATCHES)
    stamps = on(result["clock"], clock)
    figures["in_step_seconds"] = eval_latency(stamps, WARMUP_BATCHES)
    figures["between_seconds"] = eval_between(stamps, WARMUP_BATCHES)
    return figures


if __name__ == "__main__":
    main()

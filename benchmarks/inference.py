"""Test-time speed of the template: ``python -m project test`` / ``predict`` against a plain loop.

Both sides evaluate the same network (fresh weights: speed does not depend on them) on the same
synthetic test images through the data module's test DataLoader. The plain loop is the one a careful
user writes (``benchmarks.plain.plain_infer``): eval mode, ``inference_mode``, channels_last,
results summed or gathered on the device and read once at the end. Template runs use its defaults
(timing, progress bar, the prediction writer for ``predict``) and each runs as its own process; the
plain loop runs all of a repeat's measurements one after the other in one process. The two alternate ``--repeats``
times. Each side's best repeat is compared -- disturbances on a shared machine only ever slow a run
down. Both sides leave the first 3 batches out (the TimingCallback's ``warmup_iterations``).

Both sides are stamped at the same instants (the template by the observer callback
``project.toolkit.measure.stamps.StepStamps``, at its ``on_*_batch_start`` / ``on_*_batch_end`` hooks):

- throughput (images/s), for ``test`` and ``predict``: the batch size over the median step cycle,
  end of one batch to the end of the next, so everything between batches counts too: loading, the
  hooks, the progress bar, the prediction writer;
- batch-1 latency, for ``test`` and ``predict``: the median time of a batch of one image from its
  arrival on the device to its result (the template's step: the forward pass, and for ``test`` the
  loss and accuracy updates -- the span ``timing.json`` reports as ``<stage>_batch_latency_ms``);
  the ratio is plain latency over template latency.

``--options`` adds ``test`` throughput with ``--model.channels_last=false`` and
``--trainer.precision=bf16-mixed`` (the plain loop then autocasts to bfloat16 too). The last line
printed is the headline: the smallest ratio (template speed over plain speed). The repeat spread is
how much the repeats of one side differ (largest over smallest, the larger of the two sides): a ratio
whose distance from 1 is within it is not resolved by the run.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._common import (
    Setup,
    best,
    common_arguments,
    eval_latency,
    eval_step_cycle,
    machine,
    plain_infer_run,
    publish_comparison,
    spread,
    template,
)
from project.toolkit.measure.tables import number

GOAL = 0.98
WARMUP_BATCHES = 3  # the TimingCallback's default warmup_iterations
BASE = Setup("mobilenet_v2", image_size=112, batch_size=64, test_batches=7)
# (name, stage, setup, evaluation batch size, what is compared)
CASES = [
    ("test", "test", BASE, 64, "throughput"),
    ("predict", "predict", BASE, 64, "throughput"),
    ("test batch 1", "test", replace(BASE, test_batches=40), 1, "latency"),
    ("predict batch 1", "predict", replace(BASE, test_batches=40), 1, "latency"),
]
OPTION_CASES = [
    ("test contiguous", "test", replace(BASE, channels_last=False), 64, "throughput"),
    ("test bf16-mixed", "test", replace(BASE, precision="bf16-mixed"), 64, "throughput"),
]


def speed(result: dict[str, Any], batch_size: int, kind: str) -> float:
    """Images per second (throughput) or batches per second at the median latency (latency)."""
    if kind == "throughput":
        return batch_size / eval_step_cycle(result["clock"], WARMUP_BATCHES)
    return 1 / eval_latency(result["clock"], WARMUP_BATCHES)


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.inference", __doc__.splitlines()[0], default_repeats=2)
    parser.add_argument("--options", action="store_true", help="also measure channels_last=false and bf16-mixed")
    args = parser.parse_args(argv)
    cases = CASES + (OPTION_CASES if args.options else [])
    started = time.perf_counter()
    print(f"inference: {machine(args.threads)}", flush=True)
    speeds: dict[str, dict[str, list[float]]] = {name: {"plain": [], "template": []} for name, *_ in cases}
    with tempfile.TemporaryDirectory(prefix="inference-") as work:
        for repeat in range(args.repeats):
            order = ("plain", "template") if repeat % 2 == 0 else ("template", "plain")
            for side in order:
                if side == "plain":
                    jobs = [(setup, batch, stage == "predict") for _, stage, setup, batch, _ in cases]
                    results = plain_infer_run(jobs, Path(work) / f"plain-{repeat}.json", args.threads)
                else:
                    results = [
                        template(stage, setup, Path(work) / f"{name.replace(' ', '_')}-{repeat}", args.threads, batch)
                        for name, stage, setup, batch, _ in cases
                    ]
                for (name, _, _, batch, kind), result in zip(cases, results, strict=True):
                    speeds[name][side].append(speed(result, batch, kind))
                print(f"  #{repeat} {side}: " + ", ".join(f"{n} {speeds[n][side][-1]:.1f}" for n in speeds), flush=True)
    rows, report = [], []
    for name, stage, setup, batch, kind in cases:
        plain_best, template_best = best(speeds[name]["plain"]), best(speeds[name]["template"])
        entry = {
            "case": name,
            "stage": stage,
            "kind": kind,
            "setup": setup.__dict__,
            "batch_size": batch,
            "speeds": speeds[name],
            "ratio": template_best / plain_best,
            "spread": max(spread(speeds[name][side]) for side in ("plain", "template")),
        }
        report.append(entry)
        if kind == "throughput":
            values = [number(plain_best), number(template_best), "images/s"]
        else:  # shown as the latency itself, in ms
            values = [number(1000 / plain_best, 2), number(1000 / template_best, 2), "ms (p50)"]
        spread = f"{100 * entry['spread']:.0f} %"
        rows.append([name, setup.label, str(batch), *values, number(entry["ratio"], 3), spread])
    header = ["case", "model", "batch", "plain", "template", "unit", "ratio", "repeat spread"]
    publish_comparison(args, "inference", "speed", report, header, rows, started, GOAL)


if __name__ == "__main__":
    main()

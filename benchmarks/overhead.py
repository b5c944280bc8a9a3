"""Training overhead of the template: ``python -m project fit`` against a plain PyTorch loop.

Both sides train the same network on the same in-memory data (synthetic CIFAR-shaped images through
the data module's DataLoader, the default number of workers), with the same global batch, SGD and
warm-up + cosine schedule, for the same number of steps, each in a fresh process:

- plain: the loop a careful user writes (``benchmarks.plain.plain_fit``): channels_last,
  ``zero_grad(set_to_none=True)``, no host reads inside the epoch, a validation batch under
  ``inference_mode`` before training (where the template has its sanity check) and after every
  epoch, a checkpoint every epoch;
- template: ``python -m project fit`` with its default callbacks (timing, TensorBoard logger,
  checkpoint at epoch end, progress bar, fault guards, reseeding) and one validation batch per epoch.

The two alternate (plain, template, template, plain, ...) ``--repeats`` times per case, so a change in
the machine's load hits both. Everything is over the epochs after the first (warm-up, worker start-up);
each side's best repeat is compared (disturbances on a shared machine only ever slow a run down):

- throughput (images/s): the batch size over the median step cycle -- end of one training batch to
  the end of the next, so it includes all the per-step work of each side (loading, forward, backward,
  optimizer, logging, metrics, callbacks, progress bar). The headline ratio is template/plain; the
  ratio of each adjacent pair of runs is shown next to it, and the repeat spread: how much the
  repeats of one side differ (largest over smallest, the larger of the two sides). A ratio whose
  distance from 1 is within that spread is not resolved by this run;
- epoch ratio: the same ratio from whole epochs as ``timing.json`` computes them
  (``train_samples_per_second``: an epoch from its start to its last step) -- what a user sees, but
  on a shared machine as noisy as the load;
- template extra s/epoch: the difference in wall time from one epoch's start to the next, everything
  included (validation, checkpoint, epoch-end logging): the template's fixed cost per epoch.

The last line printed is the headline: the smallest throughput ratio over the cases.
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
    epoch_throughput,
    machine,
    plain_fit_run,
    publish_comparison,
    spread,
    steady_epoch_wall,
    steady_step_cycle,
    template,
)
from project.toolkit.measure.tables import number

GOAL = 0.98
# Each case's epoch is a few seconds of compute on one CPU core: long enough for a few step cycles,
# short enough that the three benchmarks finish in minutes.
CASES = [
    Setup("mobilenet_v2", image_size=32, batch_size=128, train_batches=6),
    Setup("mobilenet_v2", image_size=112, batch_size=32, train_batches=4),
    Setup("resnet50", image_size=112, batch_size=16, train_batches=3),
]
# --options: the template's speed options, measured on the cheapest case (compile takes minutes).
OPTION_CASES = [
    replace(CASES[0], channels_last=False),
    replace(CASES[0], precision="bf16-mixed"),
    replace(CASES[0], compile=True),
]


def measure(setup: Setup, repeats: int, threads: int, work: Path) -> dict[str, Any]:
    """``repeats`` alternations of the two sides on ``setup``."""
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "template": []}
    for repeat in range(repeats):
        for side in ("plain", "template") if repeat % 2 == 0 else ("template", "plain"):
            folder = work / f"{setup.label.replace(' ', '_')}-{repeat}-{side}"
            if side == "plain":
                result = plain_fit_run(setup, folder / "plain.json", threads)
            else:
                result = template("fit", setup, folder, threads)
            runs[side].append(
                {
                    "images_per_second": setup.batch_size / steady_step_cycle(result["clock"]),
                    "epoch_images_per_second": epoch_throughput(result["epochs"]),
                    "epoch_wall_seconds": steady_epoch_wall(result["clock"]),
                }
            )
            print(f"  {setup.label} #{repeat} {side}: {runs[side][-1]['images_per_second']:.1f} images/s", flush=True)

    def best_of(key: str) -> dict[str, float]:
        return {side: best([r[key] for r in runs[side]]) for side in runs}

    speed, epoch_speed = best_of("images_per_second"), best_of("epoch_images_per_second")
    walls = {side: min(r["epoch_wall_seconds"] for r in runs[side]) for side in runs}
    return {
        "case": setup.label,
        "setup": setup.__dict__,
        "runs": runs,
        "plain_images_per_second": speed["plain"],
        "template_images_per_second": speed["template"],
        "ratio": speed["template"] / speed["plain"],
        "pair_ratios": [
            t["images_per_second"] / p["images_per_second"]
            for p, t in zip(runs["plain"], runs["template"], strict=True)
        ],
        "epoch_ratio": epoch_speed["template"] / epoch_speed["plain"],
        "spread": max(spread([r["images_per_second"] for r in runs[side]]) for side in runs),
        "plain_epoch_wall_seconds": walls["plain"],
        "template_epoch_wall_seconds": walls["template"],
        "extra_seconds_per_epoch": walls["template"] - walls["plain"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.overhead", __doc__.splitlines()[0], default_repeats=2)
    parser.add_argument(
        "--options",
        action="store_true",
        help="also measure --model.channels_last=false, --trainer.precision=bf16-mixed and --model.compile=true",
    )
    args = parser.parse_args(argv)
    cases = CASES + (OPTION_CASES if args.options else [])
    started = time.perf_counter()
    print(f"overhead: {machine(args.threads)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="overhead-") as work:
        results = [measure(case, args.repeats, args.threads, Path(work)) for case in cases]
    header = [
        "case",
        "batch",
        "plain img/s",
        "template img/s",
        "ratio",
        "pair ratios",
        "repeat spread",
        "epoch ratio",
        "epoch wall plain / template (s)",
        "template extra s/epoch",
    ]
    rows = [
        [
            r["case"],
            str(r["setup"]["batch_size"]),
            number(r["plain_images_per_second"]),
            number(r["template_images_per_second"]),
            number(r["ratio"], 3),
            " ".join(number(p, 3) for p in r["pair_ratios"]),
            f"{100 * r['spread']:.0f} %",
            number(r["epoch_ratio"], 3),
            f"{number(r['plain_epoch_wall_seconds'], 2)} / {number(r['template_epoch_wall_seconds'], 2)}",
            number(r["extra_seconds_per_epoch"], 2),
        ]
        for r in results
    ]
    publish_comparison(args, "overhead", "training throughput", results, header, rows, started, GOAL)


if __name__ == "__main__":
    main()

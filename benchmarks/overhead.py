"""Training overhead of the template: ``python -m project fit`` against a plain PyTorch loop.

Both sides train the same network on the same in-memory data (synthetic CIFAR-shaped images through
the data module's DataLoader, the default number of workers), with the same global batch, SGD and
warm-up + cosine schedule, for the same number of steps, each in a fresh process:

- plain: the loop a careful user writes (``benchmarks.plain.plain_fit``): channels_last,
  ``zero_grad(set_to_none=True)``, no host reads inside the epoch, a validation batch under
  ``inference_mode`` before training (where the template has its sanity check) and after every
  epoch, a checkpoint every epoch;
- template: ``python -m project fit`` with its default callbacks (timing, TensorBoard logger,
  checkpoint at epoch end, progress bar, fault guards, reseeding, host memory reuse) and one validation
  batch per epoch. The plain loop reuses host memory as the template does (``benchmarks.plain``);
  ``--options`` adds a case with neither doing so.

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
    CLOCKS,
    Setup,
    best,
    common_arguments,
    epoch_throughput,
    machine,
    on,
    parse,
    plain_fit_run,
    publish_comparison,
    spread,
    steady_epoch_wall,
    steady_step_cycle,
    template,
)
from project.toolkit.measure.tables import number

GOAL = 0.98
# Small images on a CPU, where the template's per-step host work weighs the most: each case's epoch is a
# few seconds of compute, long enough for a few step cycles, short enough that the benchmarks take minutes.
CASES = [
    Setup("mobilenet_v2", image_size=32, batch_size=128, train_batches=6),
    Setup("resnet50", image_size=32, batch_size=64, train_batches=4),
]
# --options: the template's speed options, measured on the cheapest case (compile takes minutes).
OPTION_CASES = [
    replace(CASES[0], channels_last=False),
    replace(CASES[0], precision="bf16-mixed"),
    replace(CASES[0], compile=True),
    replace(CASES[0], host_memory_reuse=False),
]


def measure(setup: Setup, repeats: int, threads: int, work: Path, clock: str) -> dict[str, Any]:
    """``repeats`` alternations of the two sides on ``setup``; the headline ``ratio`` on ``clock``."""
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "template": []}
    for repeat in range(repeats):
        for side in ("plain", "template") if repeat % 2 == 0 else ("template", "plain"):
            folder = work / f"{setup.label.replace(' ', '-')}-{repeat}-{side}"
            if side == "plain":
                result = plain_fit_run(setup, folder / "plain.json", threads)
            else:
                result = template("fit", setup, folder, threads)
            stamps = result["clock"]
            runs[side].append(
                {
                    **{f"{c}_images_per_second": setup.batch_size / steady_step_cycle(on(stamps, c)) for c in CLOCKS},
                    "epoch_images_per_second": epoch_throughput(result["epochs"]),
                    "epoch_wall_seconds": steady_epoch_wall(stamps),
                }
            )
            speeds = ", ".join(f"{runs[side][-1][f'{c}_images_per_second']:.1f} ({c})" for c in CLOCKS)
            print(f"  {setup.label} #{repeat} {side}: {speeds} images/s", flush=True)

    def best_of(key: str) -> dict[str, float]:
        return {side: best([r[key] for r in runs[side]]) for side in runs}

    result = {"case": setup.label, "setup": setup.__dict__, "runs": runs}
    for c in CLOCKS:
        speed = best_of(f"{c}_images_per_second")
        result.update(
            {
                f"plain_{c}_images_per_second": speed["plain"],
                f"template_{c}_images_per_second": speed["template"],
                f"{c}_ratio": speed["template"] / speed["plain"],
                f"{c}_pair_ratios": [
                    t[f"{c}_images_per_second"] / p[f"{c}_images_per_second"]
                    for p, t in zip(runs["plain"], runs["template"], strict=True)
                ],
                f"{c}_spread": max(spread([r[f"{c}_images_per_second"] for r in runs[side]]) for side in runs),
            }
        )
    epoch_speed = best_of("epoch_images_per_second")
    walls = {side: min(r["epoch_wall_seconds"] for r in runs[side]) for side in runs}
    result.update(
        {
            "ratio": result[f"{clock}_ratio"],
            "spread": result[f"{clock}_spread"],
            "epoch_ratio": epoch_speed["template"] / epoch_speed["plain"],
            "plain_epoch_wall_seconds": walls["plain"],
            "template_epoch_wall_seconds": walls["template"],
            "extra_seconds_per_epoch": walls["template"] - walls["plain"],
        }
    )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.overhead", __doc__.splitlines()[0], default_repeats=3)
    parser.add_argument(
        "--options",
        action="store_true",
        help="also measure --model.channels_last=false, --trainer.precision=bf16-mixed and --model.compile=true",
    )
    args = parse(parser, argv)
    cases = CASES + (OPTION_CASES if args.options else [])
    started = time.perf_counter()
    print(f"overhead: {machine(args.threads)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="overhead-") as work:
        results = [measure(case, args.repeats, args.threads, Path(work), args.clock) for case in cases]
    header = ["case", "batch", "clock", "plain img/s", "template img/s", "ratio", "pair ratios", "repeat spread"]
    rows = [
        [
            r["case"],
            str(r["setup"]["batch_size"]),
            c,
            number(r[f"plain_{c}_images_per_second"]),
            number(r[f"template_{c}_images_per_second"]),
            number(r[f"{c}_ratio"], 3),
            " ".join(number(p, 3) for p in r[f"{c}_pair_ratios"]),
            f"{100 * r[f'{c}_spread']:.0f} %",
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

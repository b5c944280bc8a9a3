"""Learning parity: the template and the plain PyTorch loop, given the same recipe, reach the same test
accuracy on real images.

The images are scikit-learn's bundled handwritten digits (:mod:`benchmarks.digits`: offline, 8 x 8
upscaled to 32 px, 1,077 training, 200 validation and 360 test images). The recipe is the template's:
MobileNetV2, SGD with Nesterov momentum 0.9 and weight decay 5e-4, a one-epoch linear warm-up then
cosine to zero stepped every iteration, cross-entropy, the crop-and-flip augmentation, the data
module's seeded validation split; here with batch 64, peak learning rate 0.05 and 15 epochs. For each
seed, one after the other in fresh processes:

- plain: :func:`benchmarks.plain.plain_fit` -- the loop of the speed benchmarks with that recipe,
  drawing its own order of images and its own crops and flips;
- template: ``python -m project fit`` with its default options (on a CPU the input path ``auto``
  chooses is the data set in memory, augmented in batches), then ``python -m project test
  --ckpt_path=last``;
- template, DataLoader path: the same with ``--data.on_device=false``, which the docs promise gives the
  same images, so the same accuracy for the same seed.

Each side's test accuracy is the mean and the sample standard deviation over the seeds; the headline
says whether the template's mean lies within the plain loop's seed spread (its smallest to its largest
accuracy) and whether the two template paths agree seed by seed. Nothing is timed; the runs use
``--threads`` intra-op threads only to finish sooner on a shared machine.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._common import Setup, common_arguments, machine, parse, plain_fit_run, publish, run
from project.toolkit.timing.tables import number

RECIPE = Setup(
    arch="mobilenet_v2",
    image_size=32,
    batch_size=64,
    train_batches=None,
    epochs=15,
    test_batches=None,
    data="benchmarks.digits.DigitsDataModule",
    val_size=200,
    lr=0.05,
)
SEEDS = (1, 2, 3)
SIDES = ("plain", "template", "template dataloader")


def template_accuracy(setup: Setup, folder: Path, threads: int) -> float:
    """``python -m project fit`` then ``test --ckpt_path=last`` in ``folder``; the test accuracy."""
    common = [*setup.cli_args(), f"--trainer.default_root_dir={folder}", "--trainer.enable_progress_bar=false"]
    run([sys.executable, "-m", "project", "fit", *common], threads)
    run([sys.executable, "-m", "project", "test", *common, "--ckpt_path=last"], threads)
    return logged_scalar(folder, "test/acc")


def logged_scalar(folder: Path, tag: str) -> float:
    """The last value of ``tag`` that the TensorBoard logs under ``folder`` hold."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = []
    for events in sorted(folder.glob("lightning_logs/version_*/events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            values += [event.value for event in accumulator.Scalars(tag)]
    if not values:
        raise RuntimeError(f"no {tag} logged under {folder}")
    return values[-1]


def accuracy(side: str, seed: int, work: Path, threads: int, precision: str = "32-true") -> float:
    setup = replace(RECIPE, seed=seed)
    folder = work / f"{side.replace(' ', '-')}-{seed}"
    if side == "plain":
        return plain_fit_run(setup, folder / "plain.json", threads, test=True)["test_acc"]
    if side == "template dataloader":
        setup = replace(setup, on_device=False)
    return template_accuracy(replace(setup, precision=precision), folder, threads)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.parity", __doc__.splitlines()[0], default_repeats=len(SEEDS), clock=False)
    parser.set_defaults(threads=1)
    parser.add_argument(
        "--precision",
        default="32-true",
        help="the template's precision (the plain loop's stays 32-true); another than 32-true runs the template's "
        "default path only, e.g. bf16-true: does it learn as well as the plain loop in float32?",
    )
    args = parse(parser, argv)
    sides = SIDES if args.precision == "32-true" else SIDES[:2]
    seeds = SEEDS[: args.repeats] if args.repeats <= len(SEEDS) else tuple(range(1, args.repeats + 1))
    started = time.perf_counter()
    print(f"parity: {machine(args.threads)}; seeds {', '.join(map(str, seeds))}", flush=True)
    accuracies: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="parity-") as work:
        for n, seed in enumerate(seeds):
            for side in sides if n % 2 == 0 else tuple(reversed(sides)):
                accuracies[side].append(accuracy(side, seed, Path(work), args.threads, args.precision))
                print(f"  seed {seed} {side}: test accuracy {accuracies[side][-1]:.4f}", flush=True)
    # The lists were filled in seed order for every side, whichever side ran first.
    stats = {side: summary(values) for side, values in accuracies.items()}
    plain, template = stats["plain"], stats["template"]
    within = plain["min"] <= template["mean"] <= plain["max"]
    same_paths = accuracies["template"] == accuracies["template dataloader"] if len(sides) > 2 else None
    headline = (
        f"parity: template ({args.precision}) test accuracy {100 * template['mean']:.2f} % (std "
        f"{100 * template['std']:.2f}) vs plain loop {100 * plain['mean']:.2f} % (std {100 * plain['std']:.2f}, seeds "
        f"{100 * plain['min']:.2f}-{100 * plain['max']:.2f} %): {'within' if within else 'OUTSIDE'} the plain loop's "
        "seed spread" + ("" if same_paths is None else f"; on_device and DataLoader paths "
                         f"{'agree' if same_paths else 'DIFFER'} seed by seed")
    )  # fmt: skip
    header = ["side", *(f"seed {seed}" for seed in seeds), "mean", "std", "min-max"]
    rows = [
        [
            side,
            *(f"{100 * value:.2f} %" for value in accuracies[side]),
            f"{100 * stats[side]['mean']:.2f} %",
            number(100 * stats[side]["std"], 2),
            f"{100 * stats[side]['min']:.2f}-{100 * stats[side]['max']:.2f} %",
        ]
        for side in sides
    ]
    seconds = time.perf_counter() - started
    notes = (
        f"test accuracy on the 360 test digits; recipe: {RECIPE.arch} at {RECIPE.image_size} px, batch "
        f"{RECIPE.batch_size}, lr {RECIPE.lr}, {RECIPE.epochs} epochs, val_size {RECIPE.val_size}; the template in "
        f"{args.precision}; "
        f"{machine(args.threads)}; {seconds:.0f} s"
    )
    report: dict[str, Any] = {
        "machine": machine(args.threads),
        "seconds": seconds,
        "recipe": RECIPE.__dict__,
        "template_precision": args.precision,
        "seeds": list(seeds),
        "accuracies": accuracies,
        "summary": stats,
        "template_within_plain_spread": within,
        "paths_agree": same_paths,
    }
    publish(args, "parity", report, header, rows, notes, headline)


if __name__ == "__main__":
    main()

"""The default input pipeline: how fast it delivers images, and how long training waits for them.

1. Images per second per worker at 112 px: the data module's training DataLoader (synthetic
   in-memory images; crop, flip, resize to 112 px, normalise; batches of 256) iterated on its own with
   0, 1 and 2 worker processes, the first batch (worker start-up) left out, best of ``--repeats``.
   With 0 workers the main process does the work, and counts as one worker. Dividing a training
   run's images per second by this rate gives the share of a CPU core the pipeline needs.
2. ``data_wait_fraction`` of a short default training run (``python -m project fit`` on synthetic
   data: MobileNetV2, 112 px, batch 256, the default ``num_workers``), read from its ``timing.json``:
   the time from the end of one training step to the start of the next (loading the batch, the
   loop's bookkeeping) over the epoch time, epochs after the first. Goal on a CPU: <= 5 %.

The last line printed is the headline: the data wait fraction and the goal.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import Setup, common_arguments, machine, publish, template
from project.toolkit.measure.tables import number

GOAL = 0.05
LOADER_BATCH = 256
LOADER_BATCHES = 8  # measured, after the first
# The template's defaults but for the data set's size: two training steps an epoch, one validation batch.
DEFAULT_RUN = Setup("mobilenet_v2", image_size=112, batch_size=256, train_batches=2, epochs=2)


def loader_rate(workers: int) -> float:
    """Images per second the training DataLoader delivers with ``workers`` worker processes."""
    data = Setup(
        image_size=112, batch_size=LOADER_BATCH, train_batches=LOADER_BATCHES + 1, num_workers=workers
    ).data_module()
    data.setup("fit")
    loader = data.train_dataloader()
    loader.sampler.set_epoch(0)
    batches = iter(loader)
    next(batches)  # worker start-up and the first batch
    start, images = time.perf_counter(), 0
    for _ in range(LOADER_BATCHES):
        images += len(next(batches)[0])
    rate = images / (time.perf_counter() - start)
    del batches  # stops the workers
    return rate


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.input", __doc__.splitlines()[0], default_repeats=2)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # the 0-worker case transforms in this process
    started = time.perf_counter()
    print(f"input: {machine(args.threads)}", flush=True)
    rates: dict[int, float] = {}
    for workers in (0, 1, 2):
        rates[workers] = max(loader_rate(workers) for _ in range(args.repeats))
        print(f"  {workers} worker(s): {rates[workers]:.0f} images/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="input-") as work:
        timing = template("fit", DEFAULT_RUN, Path(work), args.threads)
    wait, train_rate = timing["data_wait_fraction"], timing["train_samples_per_second"]
    per_worker = max(rates[w] / max(w, 1) for w in rates)
    rows = [[str(w), number(rates[w], 0), number(rates[w] / max(w, 1), 0)] for w in rates]
    header = ["workers", "images/s", "images/s per worker"]
    summary: dict[str, Any] = {
        "default_num_workers": DEFAULT_RUN.data_module().num_workers,
        "train_images_per_second": train_rate,
        "data_wait_fraction": wait,
        "core_share_of_input": train_rate / per_worker,
    }
    seconds = time.perf_counter() - started
    headline = (
        f"input: data_wait_fraction {100 * wait:.1f} % of training time with the default num_workers="
        f"{summary['default_num_workers']} ({DEFAULT_RUN.label}, batch {DEFAULT_RUN.batch_size}); "
        f"goal <= {100 * GOAL:.0f} %: {'met' if wait <= GOAL else 'MISSED'}"
    )
    notes = (
        f"training run: {number(train_rate)} images/s, so the input pipeline needs "
        f"{100 * summary['core_share_of_input']:.1f} % of one core; {machine(args.threads)}; {seconds:.0f} s"
    )
    report = {"machine": machine(args.threads), "seconds": seconds, "loader_images_per_second": rates, **summary}
    publish(args.out, "input", report, header, rows, notes, headline)


if __name__ == "__main__":
    main()

"""The input paths: how fast each delivers images, and how long a default training run waits for them.

1. Images per second at 112 px (synthetic in-memory images; crop, flip, resize to 112 px, normalise;
   batches of 256), best of ``--repeats``, the first batch (worker start-up) left out:
   ``on_device`` -- the data module's index loader and its ``on_after_batch_transfer``, which augments
   whole batches in the training process (on a CPU run the device is the CPU) -- and the DataLoader
   path with 0, 1 and 2 worker processes, one image at a time. With 0 workers the main process does
   the work, and counts as one worker. Dividing a training run's images per second by the rate per
   worker gives the share of a CPU core its input needs.
2. The input path a short default training run (``python -m project fit`` on synthetic data:
   MobileNetV2, 112 px, batch 256, ``on_device`` and ``num_workers`` left ``auto``) chose, and its
   ``data_wait_fraction``, read from its ``timing.json``: the time from the end of one training step to
   the start of the next (loading the batch, augmenting it on the device, the loop's bookkeeping)
   over the epoch time, epochs after the first. Goal on a CPU: <= 5 %.

The last line printed is the headline: the data wait fraction and the goal.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from lightning.pytorch.plugins.precision import Precision

from benchmarks._common import Setup, common_arguments, machine, parse, publish, template
from project.toolkit.timing.tables import number

GOAL = 0.05
LOADER_BATCH = 256
LOADER_BATCHES = 8  # measured, after the first
# The template's defaults but for the data set's size: two training steps an epoch, one validation batch.
DEFAULT_RUN = Setup("mobilenet_v2", image_size=112, batch_size=256, train_batches=2, epochs=2)


PATHS = (None, 0, 1, 2)  # the input paths measured, by DataLoader workers; None: on the device


def path_name(workers: int | None) -> str:
    return "on_device" if workers is None else f"{workers} worker(s)"


def cpu_trainer() -> SimpleNamespace:
    """The few Trainer attributes a data module reads, as a one-process CPU run has them."""
    return SimpleNamespace(
        world_size=1,
        global_rank=0,
        num_devices=1,
        accelerator=None,
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        precision_plugin=Precision(),
        training=True,
    )


def loader_rate(workers: int | None) -> float:
    """Images per second the training input delivers: ``workers`` DataLoader worker processes, or
    (``None``) the on-device path, batches augmented in this process as a CPU run of the template does."""
    setup = Setup(image_size=112, batch_size=LOADER_BATCH, train_batches=LOADER_BATCHES + 1, num_workers=workers)
    data = replace(setup, on_device=workers is None).data_module()
    data.trainer = cpu_trainer()
    data.setup("fit")
    loader = data.train_dataloader()
    loader.sampler.set_epoch(0)
    batches = iter(loader)
    next(batches)  # worker start-up and the first batch
    start, images = time.perf_counter(), 0
    for _ in range(LOADER_BATCHES):
        batch = data.on_after_batch_transfer(next(batches), dataloader_idx=0)
        images += len(batch[0])
    rate = images / (time.perf_counter() - start)
    del batches  # stops the workers
    return rate


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.input", __doc__.splitlines()[0], default_repeats=2, clock=False)
    args = parse(parser, argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # the 0-worker case transforms in this process
    started = time.perf_counter()
    print(f"input: {machine(args.threads)}", flush=True)
    rates: dict[int | None, float] = {}  # by workers; None: the on-device path
    for workers in PATHS:
        rates[workers] = max(loader_rate(workers) for _ in range(args.repeats))
        print(f"  {path_name(workers)}: {rates[workers]:.0f} images/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="input-") as work:
        timing = template("fit", DEFAULT_RUN, Path(work), args.threads)
    wait, train_rate = timing["data_wait_fraction"], timing["train_samples_per_second"]
    # per process doing the work: the on-device path and 0 workers use the training process
    per_worker = {workers: rate / max(workers or 0, 1) for workers, rate in rates.items()}
    rows = [[path_name(w), number(rates[w], 0), number(per_worker[w], 0)] for w in rates]
    header = ["input path", "images/s", "images/s per worker"]
    chosen = None if timing["input_path"] == "on_device" else timing["num_workers"]
    summary: dict[str, Any] = {
        "default_input_path": timing["input_path"],
        "default_num_workers": timing["num_workers"],
        "input_path_reason": timing["input_path_reason"],
        "train_images_per_second": train_rate,
        "data_wait_fraction": wait,
        "core_share_of_input": train_rate / per_worker[chosen] if chosen in per_worker else None,
    }
    seconds = time.perf_counter() - started
    headline = (
        f"input: data_wait_fraction {100 * wait:.1f} % of training time on the default input path "
        f"({timing['input_path']}, {timing['num_workers']} workers; {DEFAULT_RUN.label}, batch "
        f"{DEFAULT_RUN.batch_size}); goal <= {100 * GOAL:.0f} %: {'met' if wait <= GOAL else 'MISSED'}"
    )
    share = summary["core_share_of_input"]  # None: the default chose a worker count not measured here
    needs = f", so its input needs {100 * share:.1f} % of one core" if share is not None else ""
    notes = (
        f"default run chose {timing['input_path']} ({timing['input_path_reason']}); it trained at "
        f"{number(train_rate)} images/s{needs}; {machine(args.threads)}; {seconds:.0f} s"
    )
    rates_by_name = {path_name(w): rate for w, rate in rates.items()}
    report = {"machine": machine(args.threads), "seconds": seconds, "loader_images_per_second": rates_by_name}
    report |= summary
    publish(args, "input", report, header, rows, notes, headline)


if __name__ == "__main__":
    main()

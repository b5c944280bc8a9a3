"""The folder path's input rate with this machine's cores: images per second that ``ImageFolderDataModule``'s
training DataLoader delivers, one worker per core (``--workers``), at 112 px in batches of 256, the epochs after the
first (worker start-up, the page cache) averaged.

The files: ``--images`` generated photo-like JPEGs (:func:`benchmarks.decoding.photo`, 1.2-3.1 megapixels, quality
90, a camera's grain), each linked ``--copies`` times into two class folders, so that an epoch is long enough to
time without generating thousands of photos; the copies are decoded like any file (from the page cache: this is
the decoding's rate, not the disk's). ``bash benchmarks/gpu_run.sh`` runs it after the pairs and prints it beside
the device's training speed: a folder of photos keeps a GPU busy only if this rate is the higher.

``python -m benchmarks.folder_input`` prints one line and, with ``--out FILE``, writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import whole_number_above_0
from benchmarks.decoding import GRAIN, SHAPES, photo
from benchmarks.input import cpu_trainer
from project.data import ImageFolderDataModule

IMAGE_SIZE = 112
BATCH = 256


def _write_photo(path: Path, seed: int, index: int) -> None:
    rng = np.random.default_rng([seed, index])
    photo(rng, *SHAPES[index % len(SHAPES)], GRAIN["grainy"]).save(path, quality=90)


def write_folder(root: Path, images: int, copies: int, processes: int) -> Path:
    """``root/train/class_{0,1}/``: ``images`` generated JPEGs (in ``processes`` processes), each linked ``copies``
    times."""
    originals = root / "originals"
    originals.mkdir(parents=True)
    paths = [originals / f"{n:04d}.jpg" for n in range(images)]
    with ProcessPoolExecutor(max(1, processes)) as pool:
        list(pool.map(_write_photo, paths, [0] * images, range(images)))
    for n, path in enumerate(paths):
        folder = root / "train" / f"class_{n % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        for copy in range(copies):
            os.link(path, folder / f"{path.stem}-{copy}.jpg")
    return root


def loader_rate(folder: Path, workers: int, epochs: int, batch: int = BATCH, size: int = IMAGE_SIZE) -> dict[str, Any]:
    """Each epoch's images and seconds through the training DataLoader, as a one-process CPU run builds it (a folder
    of fewer than ten batches of ``batch`` images gets a tenth of its images as the batch, as in a run)."""
    data = ImageFolderDataModule(
        str(folder), image_size=size, batch_size=batch, num_workers=workers, val_size=0, mean=[0.5] * 3, std=[0.25] * 3
    )
    data.trainer = cpu_trainer()
    data.setup("fit")
    loader = data.train_dataloader()
    seconds, counts = [], []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        start, images = time.perf_counter(), 0
        for inputs, _ in loader:
            images += len(inputs)
        seconds.append(time.perf_counter() - start)
        counts.append(images)
    steady = slice(1, None) if epochs > 1 else slice(None)
    rate = sum(counts[steady]) / sum(seconds[steady])
    return {
        "batch_size": loader.batch_size,
        "epoch_images": counts,
        "epoch_seconds": seconds,
        "images_per_second": rate,
    }


def measure(
    work: Path, workers: int | None = None, images: int = 64, copies: int = 16, epochs: int = 3
) -> dict[str, Any]:
    """Generate the folder in ``work`` and time its training loader; the figures, the per-worker rate beside."""
    workers = workers or os.cpu_count() or 1
    started = time.perf_counter()
    folder = write_folder(work / "photos", images, copies, workers)
    generated = time.perf_counter() - started
    figures = loader_rate(folder, workers, epochs)
    return {
        "workers": workers,
        "cpu_count": os.cpu_count(),
        "files": images * copies,
        "distinct_photos": images,
        "image_size": IMAGE_SIZE,
        **figures,
        "images_per_second_per_worker": figures["images_per_second"] / workers,
        "generate_seconds": generated,
        "seconds": time.perf_counter() - started,
    }


def summary(record: dict[str, Any]) -> str:
    """``folder input: 2,300 images/s with 16 workers (144 a worker), ...``."""
    return (
        f"folder input: {record['images_per_second']:,.0f} images/s with {record['workers']} workers "
        f"({record['images_per_second_per_worker']:,.0f} a worker), {record['files']} JPEG files of 1.2-3.1 MP "
        f"at {record['image_size']} px, {record['seconds']:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.folder_input", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=whole_number_above_0, help="DataLoader workers (default: one per core)")
    parser.add_argument("--images", type=whole_number_above_0, default=64, help="photos generated (default 64)")
    parser.add_argument("--copies", type=whole_number_above_0, default=16, help="links to each (default 16)")
    parser.add_argument("--epochs", type=whole_number_above_0, default=3, help="epochs, the first not counted")
    parser.add_argument("--out", type=Path, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="folder-input-") as work:
        record = measure(Path(work), args.workers, args.images, args.copies, args.epochs)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(summary(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

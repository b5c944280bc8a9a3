"""Decoding a folder's photos: images per second per worker, a JPEG decoded whole by Pillow then resized (the way
before) against ``ImageFiles.decode`` (decoded at 1/2, 1/4 or 1/8 scale, Pillow's ``draft``, then the same resize),
with ``torchvision.io.decode_jpeg`` (whole, then the same resize) beside them for reference.

``--images`` generated photo-like colour JPEGs of 1.2-3.1 megapixels (smooth colour fields and hard edges, quality
90, landscape and portrait) in a temporary folder, of two kinds: ``grainy`` (a sensor's grain, standard deviation 5
grey levels a pixel: about 2.2 bits a pixel, as a camera's photos) and ``clean`` (grain 1: about 0.9 bits a pixel),
resized to 112 px (the folder data's default) and 232 px (a torchvision weight's resize size). A JPEG's entropy
decoding, which no scale saves, takes more of the time the more bits it has.

One process, ``--threads`` intra-op threads, one image at a time: what one DataLoader worker does. Each of
``--repeats`` rounds decodes every file by every side, the sides there and back (A B C C B A, the first side rotated
from round to round), so that a drift of the machine's speed weighs on all alike; a side's rate in a round is its
images over the process's CPU seconds (wall seconds beside, which other work on a shared machine inflates), a
round's ratio the reduced-scale rate over the whole-file rate, the figure the median over the rounds. How near the
pixels stay: the mean and the largest absolute difference from the way before, in grey levels, over the files.

The last line printed is the headline: the smallest of the cases' median ratios, against the goal (2x).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms.v2 import functional as F

from benchmarks._common import REPO, machine, publish, whole_number_above_0
from project.data.folder import ImageFiles
from project.toolkit.timing.tables import number

GOAL = 2.0
SIZES = (112, 232)
SHAPES = ((1280, 960), (1600, 1200), (2048, 1536), (960, 1280), (1200, 1600), (1536, 2048))  # (width, height)
SIDES = ("whole", "reduced", "torchvision")
GRAIN = {"grainy": 5.0, "clean": 1.0}  # the kinds of photo: grain's standard deviation, grey levels
NAMES = {
    "whole": "Pillow, whole file (before)",
    "reduced": "Pillow draft, reduced scale (now)",
    "torchvision": "torchvision.io.decode_jpeg, whole file",
}
Decoder = Callable[[Path], np.ndarray]


def photo(rng: np.random.Generator, width: int, height: int, grain: float) -> Image.Image:
    """A photo-like colour image: smooth fields of colour at two scales, a few hard-edged patches, ``grain``."""
    field = np.zeros((height, width, 3))
    for cells, weight in ((4, 0.6), (40, 0.4)):
        coarse = Image.fromarray(rng.integers(0, 256, (cells, cells * 4 // 3, 3), dtype=np.uint8))
        field += weight * np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC))
    for _ in range(6):
        top, left = rng.integers(0, height * 3 // 4), rng.integers(0, width * 3 // 4)
        field[top : top + height // 5, left : left + width // 5] = rng.integers(0, 256, 3)
    return Image.fromarray(np.clip(field + rng.normal(0, grain, (height, width, 1)), 0, 255).astype(np.uint8))


def write_photos(folder: Path, count: int, grain: float, seed: int = 0) -> list[Path]:
    """``count`` JPEGs of :data:`SHAPES` in turn, quality 90."""
    rng = np.random.default_rng(seed)
    folder.mkdir()
    paths = [folder / f"{n:03d}.jpg" for n in range(count)]
    for n, path in enumerate(paths):
        photo(rng, *SHAPES[n % len(SHAPES)], grain).save(path, quality=90)
    return paths


def whole(path: Path, size: int) -> np.ndarray:
    """The way before: the whole file decoded by Pillow, resized (shorter side ``size``, bilinear, antialiased)."""
    with Image.open(path) as file:
        pixels = np.array(file.convert("RGB"))
    image = torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1)
    return F.resize(image, size, antialias=True).permute(1, 2, 0).numpy()


def torchvision_whole(path: Path, size: int) -> np.ndarray:
    """The whole file decoded by torchvision.io (libjpeg-turbo), the same resize."""
    image = decode_jpeg(read_file(str(path)))
    return F.resize(image, size, antialias=True).permute(1, 2, 0).numpy()


def decoders(paths: list[Path], size: int) -> dict[str, Decoder]:
    files = ImageFiles(paths, size, channels=3, root=paths[0].parent)
    return {
        "whole": lambda path: whole(path, size),
        "reduced": files.decode,
        "torchvision": lambda path: torchvision_whole(path, size),
    }


def order(rotation: int) -> tuple[str, ...]:
    """The sides of a round: there and back, from side ``rotation`` (mod 3).

    >>> order(1)
    ('reduced', 'torchvision', 'whole', 'whole', 'torchvision', 'reduced')
    """
    turned = SIDES[rotation % len(SIDES) :] + SIDES[: rotation % len(SIDES)]
    return (*turned, *reversed(turned))


def rounds(paths: list[Path], size: int, repeats: int) -> list[dict[str, dict[str, float]]]:
    """Per round, each side's images per CPU second and per wall second."""
    sides = decoders(paths, size)
    for decode in sides.values():  # warm-up: the first call's one-off costs
        decode(paths[0])
    measured = []
    for rotation in range(repeats):
        spent = {side: [0.0, 0.0] for side in SIDES}
        for side in order(rotation):
            cpu, wall = time.process_time(), time.perf_counter()
            for path in paths:
                sides[side](path)
            spent[side][0] += time.process_time() - cpu
            spent[side][1] += time.perf_counter() - wall
        images = 2 * len(paths)
        measured.append({side: {"cpu": images / c, "wall": images / w} for side, (c, w) in spent.items()})
    return measured


def differences(paths: list[Path], size: int) -> dict[str, dict[str, float]]:
    """How far each side's pixels are from the way before: mean and largest absolute difference, grey levels."""
    sides = decoders(paths, size)
    found: dict[str, dict[str, float]] = {}
    for side in ("reduced", "torchvision"):
        gaps = [np.abs(sides[side](p).astype(np.int16) - whole(p, size).astype(np.int16)) for p in paths]
        found[side] = {"mean": float(np.mean([g.mean() for g in gaps])), "max": float(max(g.max() for g in gaps))}
    return found


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decoding", description=__doc__.splitlines()[0])
    out = REPO / "benchmarks" / "results" / "decoding"
    parser.add_argument("--out", type=Path, default=out, help=f"results folder (default {out})")
    parser.add_argument("--repeats", type=whole_number_above_0, default=6, help="rounds (default 6)")
    parser.add_argument("--images", type=whole_number_above_0, default=24, help="generated JPEGs (default 24)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for the resize (default 1)")
    args = parser.parse_args(argv)
    args.command = shlex.join(["python", "-m", "benchmarks.decoding", *(sys.argv[1:] if argv is None else argv)])
    return args


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(f"decoding: {machine(args.threads)}", flush=True)
    cases, rows, bits = [], [], {}
    megapixels = [np.prod(SHAPES[n % len(SHAPES)]) / 1e6 for n in range(args.images)]
    with tempfile.TemporaryDirectory(prefix="decoding-") as work:
        for kind, grain in GRAIN.items():
            paths = write_photos(Path(work) / kind, args.images, grain)
            bits[kind] = 8 * sum(path.stat().st_size for path in paths) / (1e6 * sum(megapixels))
            for size in SIZES:
                cases.append(case(kind, paths, size, args.repeats))
                rows += table_rows(cases[-1])
                print(f"  {kind} {size} px: reduced/whole {cases[-1]['ratio']:.2f}", flush=True)
    worst = min(cases, key=lambda case: case["ratio"])
    headline = (
        f"decoding: reduced-scale/whole-file images per CPU second {worst['ratio']:.2f}x ({worst['kind']} photos, "
        f"{worst['size']} px: the smallest of {len(cases)} cases; median of {args.repeats} rounds); goal >= "
        f"{GOAL:.0f}x: {'met' if worst['ratio'] >= GOAL else 'MISSED'}"
    )
    header = ["photos", "resize", "decoding", "images/CPU s", "images/wall s", "ratio to before"]
    header += ["pixels vs before: mean/max"]
    seconds = time.perf_counter() - started
    said = ", ".join(f"{kind} {value:.1f}" for kind, value in bits.items())
    notes = (
        f"{args.images} generated JPEGs of each kind, {min(megapixels):.1f}-{max(megapixels):.1f} MP, quality 90, "
        f"bits a pixel: {said}; {machine(args.threads)}; one image at a time in one process; {seconds:.0f} s"
    )
    report = {"machine": machine(args.threads), "seconds": seconds, "images": args.images, "bits_per_pixel": bits}
    publish(args, "decoding", report | {"repeats": args.repeats, "cases": cases}, header, rows, notes, headline)


def case(kind: str, paths: list[Path], size: int, repeats: int) -> dict[str, Any]:
    """One kind of photo at one resize size: each side's median rates, the ratios to the way before, the pixels."""
    measured = rounds(paths, size, repeats)
    rate = {s: {c: statistics.median(r[s][c] for r in measured) for c in ("cpu", "wall")} for s in SIDES}
    ratios = {s: [r[s]["cpu"] / r["whole"]["cpu"] for r in measured] for s in SIDES}
    found = {"kind": kind, "size": size, "ratio": statistics.median(ratios["reduced"]), "images_per_second": rate}
    return found | {"ratios": ratios, "differences": differences(paths, size)}


def table_rows(case: dict[str, Any]) -> list[list[str]]:
    """A case's rows of the table: each side's rates, ratio (median, and the rounds' range) and pixels."""
    rows = []
    for side in SIDES:
        gap = case["differences"].get(side, {"mean": 0.0, "max": 0.0})
        ratios, rate = case["ratios"][side], case["images_per_second"][side]
        rows.append([case["kind"], f"{case['size']}", NAMES[side], number(rate["cpu"], 0), number(rate["wall"], 0),
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                     f"{gap['mean']:.2f} / {gap['max']:.0f}"])  # fmt: skip
    return rows


if __name__ == "__main__":
    main()

"""A folder data set of photo-like colour JPEGs whose classes are fine stripes: orientation x period.

4 classes, ``{horizontal,vertical}_{fine,coarse}``: a sinusoidal luminance grating (amplitude 10-25 grey levels, under
a smooth random envelope of 50-100 % strength) added to ``benchmarks.decoding.photo``'s background (smooth colour
fields at two scales, six hard-edged colour patches; its contrast scaled to 0.6 about its mean), then camera-like grain
(sd 5 grey levels a pixel, the same in the three channels), saved as JPEG quality 90 (Pillow's default 4:2:0 chroma).

The period is set at the scale the model sees (the shorter side resized to 112 px): fine 2.8-3.6 px, coarse
3.6-4.6 px there (about 10-50 px in the file, by its size): adjacent ranges, so the class needs the period to a few
tenths of a pixel. Orientation 0 or 90 degrees +- 8 (a horizontal flip keeps every label). Sizes: 640x480, 800x600,
1024x768, 1280x960, 1600x1200, each landscape or portrait at random.
Each file is drawn from ``(seed, split, class, index)``, so the set is the same on every run.

Run from a clone's root (it imports ``benchmarks.decoding``):
``cd draft && /work/main/.venv/bin/python ../make_data.py --out ../data``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path.cwd()))  # the clone whose root this runs from
from benchmarks.decoding import photo  # noqa: E402

SIZE = 112  # the folder data's default image size: the scale the periods are set at
SHAPES = ((640, 480), (800, 600), (1024, 768), (1280, 960), (1600, 1200))  # (width, height), landscape
PERIODS = {"fine": (2.8, 3.6), "coarse": (3.6, 4.6)}  # grating period, px at SIZE: adjacent ranges
ORIENTATIONS = {"horizontal": 90.0, "vertical": 0.0}  # the grating's wave direction, degrees
CLASSES = [f"{o}_{p}" for o in ORIENTATIONS for p in PERIODS]
GRAIN = 5.0
CALM = 0.6  # the background's contrast kept: its fine colour field would hide the grating at 112 px
AMPLITUDE = (10.0, 25.0)  # the grating's amplitude, grey levels


def image(rng: np.random.Generator, label: int) -> Image.Image:
    """One photo of class ``CLASSES[label]``."""
    orientation, period_name = CLASSES[label].split("_")
    width, height = SHAPES[rng.integers(len(SHAPES))]
    if rng.random() < 0.5:
        width, height = height, width
    background = np.asarray(photo(rng, width, height, grain=0.0), dtype=np.float64)
    background = CALM * background + (1 - CALM) * background.mean((0, 1))  # fields and patches, less contrast
    period = rng.uniform(*PERIODS[period_name]) * min(width, height) / SIZE
    angle = np.deg2rad(ORIENTATIONS[orientation] + rng.uniform(-8, 8))
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    phase = 2 * np.pi * (x * np.cos(angle) + y * np.sin(angle)) / period + rng.uniform(0, 2 * np.pi)
    coarse = Image.fromarray(rng.integers(0, 256, (3, 4), dtype=np.uint8))  # the grating's strength, smooth
    envelope = 0.5 + 0.5 * np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC)) / 255.0
    grating = rng.uniform(*AMPLITUDE) * envelope * np.sin(phase)
    grain = rng.normal(0, GRAIN, (height, width))
    pixels = background + (grating + grain)[..., None]
    return Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the data set's folder (train/, val/)")
    parser.add_argument("--train", type=int, default=150, help="training images a class (default 150)")
    parser.add_argument("--val", type=int, default=50, help="validation images a class (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="default 0")
    args = parser.parse_args()
    for split_number, (split, count) in enumerate((("train", args.train), ("val", args.val))):
        for label, name in enumerate(CLASSES):
            folder = args.out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for n in range(count):
                rng = np.random.default_rng([args.seed, split_number, label, n])
                image(rng, label).save(folder / f"{n:04d}.jpg", quality=90)
        print(f"{split}: {len(CLASSES)} classes x {count}", flush=True)


if __name__ == "__main__":
    main()

"""Folders of generated photo-like image files for the tests of ``ImageFolderDataModule``: two classes told apart
by the direction of their stripes, under noise, at assorted sizes, as colour JPEGs and grey PNGs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("horizontal", "vertical")


def striped_image(rng: np.random.Generator, label: int, grey: bool) -> np.ndarray:
    """An ``(H, W)`` or ``(H, W, 3)`` uint8 image of ``CLASSES[label]``'s stripes in a random colour, size and
    phase, plus noise."""
    height, width = rng.integers(20, 48, size=2)
    period, phase = rng.integers(4, 9), rng.integers(0, 8)
    axis = np.arange(height if label == 0 else width)
    stripes = ((axis + phase) // (period // 2)) % 2
    pattern = stripes[:, None] if label == 0 else stripes[None, :]
    pattern = np.broadcast_to(pattern, (height, width))
    colour = rng.integers(120, 256, size=1 if grey else 3)
    pixels = pattern[..., None] * colour + rng.normal(0, 25, (height, width, len(colour)))
    return np.clip(pixels, 0, 255).astype(np.uint8).squeeze(-1 if grey else ())


def write_split(folder: Path, per_class: int, seed: int, classes: tuple[str, ...] = CLASSES) -> None:
    """``folder/<class>/`` with ``per_class`` files each: every third a grey PNG, the others colour JPEGs."""
    rng = np.random.default_rng(seed)
    for label, name in enumerate(classes):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            grey = n % 3 == 0
            image = striped_image(rng, label % 2, grey)
            Image.fromarray(image).save(folder / name / f"{n:04d}.{'png' if grey else 'jpg'}", quality=90)


def image_folder(root: Path, train: int = 40, test: int = 10, val: int = 0) -> Path:
    """A data set folder: ``train/``, ``test/`` (and ``val/`` where ``val``) with that many files per class."""
    write_split(root / "train", train, seed=0)
    write_split(root / "test", test, seed=1)
    if val:
        write_split(root / "val", val, seed=2)
    return root

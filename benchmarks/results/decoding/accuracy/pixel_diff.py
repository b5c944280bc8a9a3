"""How far the two decodings of the val folder are apart at 112 px: mean and largest absolute difference, grey levels,
over the 112 x 112 centre squares the model sees, overall and by file size.

Run from the ``draft`` clone's root: ``cd draft && /work/main/.venv/bin/python ../pixel_diff.py ../data/val``
(``ImageFiles.decode`` there is the reduced-scale decoding; ``benchmarks.decoding.whole`` the whole-file one).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

sys.path.insert(0, str(Path.cwd()))  # the clone whose root this runs from
from benchmarks.decoding import whole  # noqa: E402
from project.data.folder import ImageFiles  # noqa: E402


def centre(image: np.ndarray) -> np.ndarray:
    return F.center_crop(torch.from_numpy(image).permute(2, 0, 1), [112]).numpy().astype(np.int16)


def main() -> None:
    root = Path(sys.argv[1])
    paths = sorted(root.rglob("*.jpg"))
    files = ImageFiles(paths, 112, 3, root)
    by_size: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
    for path in paths:
        with Image.open(path) as file:
            short_long = tuple(sorted(file.size))
        by_size[short_long].append(np.abs(centre(files.decode(path)) - centre(whole(path, 112))))
    every = [gap for gaps in by_size.values() for gap in gaps]
    mean, largest = np.mean([g.mean() for g in every]), max(g.max() for g in every)
    print(f"{len(paths)} files: mean {mean:.2f}, max {largest} grey levels")
    for size, gaps in sorted(by_size.items()):
        print(
            f"  {size[1]}x{size[0]} ({len(gaps)} files): mean {np.mean([g.mean() for g in gaps]):.2f}, "
            f"max {max(g.max() for g in gaps)}"
        )


if __name__ == "__main__":
    main()

"""``ImageFiles.decode``: a large JPEG is decoded at a reduced scale (Pillow's ``draft``) no smaller than the resize
size, then resized to what the whole file gives, within a grey level or two; other files as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from project.data.folder import ImageFiles, check_readable
from project.toolkit.errors import DataError


def photo(path: Path, width: int, height: int, mode: str = "RGB") -> Path:
    """A photo-like image: smooth colour fields, a hard-edged patch, fine grain."""
    rng = np.random.default_rng(width + height)
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    field = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float64)
    field[height // 3 : height // 2, width // 4 : width // 2] = (250, 20, 40)
    pixels = np.clip(field + rng.normal(0, 4, (height, width, 1)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).convert(mode).save(path, quality=90)
    return path


def before(path: Path, size: int, mode: str) -> np.ndarray:
    """The whole file decoded, then resized: what ``decode`` gave before reduced-scale decoding."""
    with Image.open(path) as file:
        pixels = np.array(file.convert(mode))
    image = torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1)
    return F.resize(image, size, antialias=True).permute(1, 2, 0).numpy()


def decoded(path: Path, size: int, channels: int = 3) -> np.ndarray:
    return ImageFiles([path], size, channels, path.parent)[0]


@pytest.mark.parametrize(("width", "height", "size", "scaled"), [(1600, 1200, 32, (200, 150)),
                                                                 (1200, 1600, 112, (150, 200)),
                                                                 (1000, 750, 112, (250, 188)),
                                                                 (1000, 800, 224, (500, 400))])  # fmt: skip
@pytest.mark.parametrize("channels", [3, 1])
def test_a_large_jpeg_is_decoded_at_a_reduced_scale_then_resized_as_the_whole_file(
    tmp_path: Path, width: int, height: int, size: int, scaled: tuple[int, int], channels: int
) -> None:
    path = photo(tmp_path / "big.jpg", width, height)
    mode = "L" if channels == 1 else "RGB"
    with Image.open(path) as file:  # 1/8, 1/4, 1/2: the smallest DCT scale keeping both sides >= size
        file.draft(mode, (size, size))
        assert file.size == scaled and min(scaled) >= size
        pixels = np.array(file.convert(mode))
    old = before(path, size, mode)
    reduced = torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1)
    expected = F.resize(reduced, list(old.shape[:2]), antialias=True).permute(1, 2, 0).numpy()
    got = decoded(path, size, channels)
    assert got.shape == old.shape and got.shape[2] == channels  # the whole file's shape, shorter side ``size``
    assert np.array_equal(got, expected) and not np.array_equal(got, old)
    gap = np.abs(got.astype(np.int16) - old.astype(np.int16))
    # mean 0.14-0.71 and 99.9th percentile 1-12 grey levels here; single pixels at the patch's hard edge up to 28
    assert gap.mean() < 1.0 and np.percentile(gap, 99.9) <= 16, (gap.mean(), np.percentile(gap, 99.9))


def test_pngs_small_jpegs_and_cmyk_jpegs_decode_as_before(tmp_path: Path) -> None:
    png, small = photo(tmp_path / "big.png", 1200, 900), photo(tmp_path / "small.jpg", 60, 40)
    assert np.array_equal(decoded(png, 32), before(png, 32, "RGB"))  # draft is for JPEGs: the whole PNG
    assert np.array_equal(decoded(small, 32), before(small, 32, "RGB"))  # under 2 * size: decoded whole, no draft
    assert np.array_equal(decoded(png, 32, channels=1), before(png, 32, "L"))
    cmyk = photo(tmp_path / "cmyk.jpg", 1600, 1200, mode="CMYK")
    got, old = decoded(cmyk, 32), before(cmyk, 32, "RGB")
    assert got.shape == old.shape == (32, 42, 3) and np.abs(got.astype(np.int16) - old).mean() < 1.0


def test_a_large_jpeg_cut_short_is_still_refused_before_and_named_when_decoded(tmp_path: Path) -> None:
    whole = photo(tmp_path / "whole.jpg", 1600, 1200).read_bytes()
    (tmp_path / "cut.jpg").write_bytes(whole[: len(whole) // 2])  # no end marker: refused by the header check
    with pytest.raises(DataError, match=r"cut.jpg cannot be read as an image \(a truncated JPEG file"):
        check_readable([tmp_path / "cut.jpg", tmp_path / "whole.jpg"])
    (tmp_path / "hollow.jpg").write_bytes(whole[:3] + bytes(100) + b"\xff\xd9")  # JPEG's first and last bytes
    check_readable([tmp_path / "hollow.jpg"])
    with pytest.raises(DataError, match=r"hollow.jpg cannot be read as an image \(not a readable JPEG or PNG file"):
        decoded(tmp_path / "hollow.jpg", 32)

"""A split of tar shards: ``DIR/train/*.tar`` (and ``val/``, ``test/``) instead of class folders, read in place. A
few large files instead of many small ones: what a network file system, an object store's sync or a copy to local
disk moves fastest, and the format WebDataset writes.

A shard is a plain (uncompressed) tar of JPEG/PNG files, labelled either way:

- by a class folder inside the tar (``tar cf train-0000.tar -C DIR/train .`` of a folder of class folders), or
- WebDataset's way: ``KEY.jpg`` beside ``KEY.cls``, which holds the class number (classes named ``0``, ``1``, ...
  unless ``--data.classes`` names them).

The shards are indexed once (the tar headers: each image's offset and size, nothing decoded), then an image is read
by its offset when a batch needs it, so this is the folder path's data set (same sampler, augmentation, exact resume)
over other files; the images come in the order of their class and name, as from the folder they were packed from.
"""

from __future__ import annotations

import tarfile
from io import BytesIO
from pathlib import Path
from typing import NamedTuple

import numpy as np

from project.toolkit.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class Member(NamedTuple):
    """An image inside a shard: where its bytes are."""

    shard: Path
    offset: int
    size: int
    name: str

    def __str__(self) -> str:
        return f"{self.shard}:{self.name}"

    def read(self, start: int = 0, length: int | None = None) -> bytes:
        """Its bytes (``length`` of them from ``start``; negative ``start``: from its end)."""
        start = start if start >= 0 else max(0, self.size + start)
        length = self.size - start if length is None else min(length, self.size - start)
        with open(self.shard, "rb") as file:
            file.seek(self.offset + start)
            return file.read(length)

    def open(self) -> BytesIO:
        return BytesIO(self.read())


def image_source(item: Path | Member) -> Path | BytesIO:
    """What ``PIL.Image.open`` reads an image from: a file's path, or a shard member's bytes."""
    return item.open() if isinstance(item, Member) else item


def head_and_tail(item: Path | Member, tail: int) -> tuple[bytes, bytes]:
    """An image's first 8 bytes and its last ``tail`` (a file's, or a shard member's)."""
    if isinstance(item, Member):
        return item.read(0, 8), item.read(-tail)
    with open(item, "rb") as file:
        head = file.read(8)
        file.seek(max(0, file.seek(0, 2) - tail))
        return head, file.read()


def relative_name(item: Path | Member, root: Path) -> str:
    """An image's name under ``root``: a file's path, or ``shard:member``."""
    return f"{item.shard.relative_to(root)}:{item.name}" if isinstance(item, Member) else str(item.relative_to(root))


def shards_in(folder: Path) -> list[Path]:
    """The ``*.tar`` files of a split's folder, in name order."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == ".tar" and not p.name.startswith("."))


def _key_and_suffix(name: str) -> tuple[str, str]:
    """WebDataset's key of a member (its path up to the first dot of its file name) and the rest, lower case."""
    folder, _, file = name.rpartition("/")
    stem, dot, rest = file.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (dot + rest).lower()


def _index(shard: Path) -> tuple[list[Member], dict[str, int]]:
    """The images of a shard and the class numbers of its ``.cls`` members, by key."""
    images, numbers = [], {}
    try:
        with tarfile.open(shard, "r:") as tar:  # "r:": refuses a compressed tar, whose members cannot be sought
            for info in tar:
                if not info.isfile():
                    continue
                name = info.name.removeprefix("./")
                key, suffix = _key_and_suffix(name)
                if suffix in IMAGE_SUFFIXES:
                    images.append(Member(shard, info.offset_data, info.size, name))
                elif suffix == ".cls":
                    text = tar.extractfile(info).read().strip()  # type: ignore[union-attr]
                    if not text.isdigit():
                        raise DataError(f"{shard}:{name} holds {text[:20]!r}, not a class number (0, 1, ...)")
                    numbers[key] = int(text)
    except tarfile.ReadError as err:
        raise DataError(f"{shard} is not a readable plain tar file ({err}); shards must be uncompressed .tar") from None
    return images, numbers


def scan_shards(folder: Path, classes: list[str] | None = None) -> tuple[list[Member], np.ndarray, list[str]]:
    """The images of a split of shards, their labels and the class names (``classes``, where given, else found: the
    folders inside the tars, sorted, or ``0``..``K-1`` from ``.cls`` members); refused in one line where a shard is
    unreadable or an image has no class."""
    images, numbers = [], {}
    for shard in shards_in(folder):
        found, cls = _index(shard)
        images += found
        numbers |= cls
    if not images:
        raise DataError(f"{folder}'s .tar shards hold no images ({', '.join(IMAGE_SUFFIXES)})")
    keys = [_key_and_suffix(m.name)[0] for m in images]
    if numbers:
        missing = [m for m, key in zip(images, keys, strict=True) if key not in numbers]
        if missing:
            raise DataError(f"{missing[0]} has no {_key_and_suffix(missing[0].name)[0]}.cls beside it (of "
                            f"{len(missing)} image(s) without a class); every image needs one, or none")  # fmt: skip
        labels = np.asarray([numbers[key] for key in keys], dtype=np.int64)
        names = classes or [str(n) for n in range(int(labels.max()) + 1)]
    else:
        folders = [m.name.rpartition("/")[0].rpartition("/")[2] for m in images]  # the image's own folder
        if "" in folders:
            loose = images[folders.index("")]
            raise DataError(f"{loose} is in no class folder and has no .cls beside it: its class is unknown")
        names = classes or sorted(set(folders))
        unknown = sorted(set(folders) - set(names))
        if unknown:
            raise DataError(f"{folder}'s shards have class folders {unknown} that are not among the classes {names}")
        labels = np.asarray([names.index(f) for f in folders], dtype=np.int64)
    if int(labels.max()) >= len(names):
        raise DataError(f"{folder}'s shards have class number {int(labels.max())}, but there are {len(names)} classes")
    order = sorted(range(len(images)), key=lambda i: (labels[i], images[i].name))
    return [images[i] for i in order], labels[order], names

"""A folder of images as a data set: ``DIR/train/<class>/*.{jpg,jpeg,png}``, and optionally ``DIR/val/`` and
``DIR/test/`` with the same class folders (or any split as ``.tar`` shards: ``project/data/shards.py``). Files are
decoded (Pillow) in the DataLoader workers when a batch needs them, never all held in memory: each is resized
(shorter side) to ``resize_size`` whole, then augmented as any data set is (``--data.augmentation``: by default a
random crop of the zero-padded image, a horizontal flip; ``random_resized_crop``) and centre-cropped to
``image_size`` (evaluation: cropped only).

``python -m project fit --data=project.data.ImageFolderDataModule --data.data_dir=DIR``
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from project.data.shards import IMAGE_SUFFIXES, head_and_tail, image_source, relative_name, scan_shards, shards_in
from project.toolkit.data.datamodule import ImageArrayDataModule
from project.toolkit.errors import DataError
from project.toolkit.log import get_logger

log = get_logger(__name__)


class ImageFiles:
    """Image files read as a uint8 array ``(N, size, size, channels)``: an item is decoded when it is read, so a
    worker holds only its batch; it is the whole photo, its shorter side ``size``, and several items read at once
    their centre squares. ``subset`` takes files without decoding them."""

    dtype = np.dtype(np.uint8)

    def __init__(
        self, paths: Sequence[Path], size: int, channels: int, root: Path, interpolation: str = "bilinear"
    ) -> None:
        self.paths, self.size, self.channels, self.root = list(paths), size, channels, root
        self.interpolation = interpolation

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return len(self.paths), self.size, self.size, self.channels

    @property
    def nbytes(self) -> int:
        """The bytes of all images decoded (what holding them in memory would take)."""
        return int(np.prod(self.shape))

    @property
    def names(self) -> list[str]:
        """The files, relative to the data set's folder."""
        return [relative_name(path, self.root) for path in self.paths]

    def subset(self, indices: Sequence[int] | np.ndarray) -> ImageFiles:
        return ImageFiles([self.paths[i] for i in indices], self.size, self.channels, self.root, self.interpolation)

    def __getitem__(self, index: int | slice | np.ndarray) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            return self.decode(self.paths[index])
        paths = self.paths[index] if isinstance(index, slice) else [self.paths[i] for i in index]
        squares = [F.center_crop(torch.from_numpy(self.decode(path)).permute(2, 0, 1), [self.size]) for path in paths]
        return torch.stack(squares).permute(0, 2, 3, 1).numpy() if paths else np.zeros((0, *self.shape[1:]), np.uint8)

    def decode(self, path: Path) -> np.ndarray:
        """One file as ``(height, width, channels)`` uint8: grey or colour as asked, its shorter side ``size``. A
        JPEG is decoded at the smallest of 1/2, 1/4 or 1/8 scale (its DCT scaling: Pillow's ``draft``) that keeps
        both sides at least ``size`` (less work), then resized as any file, to the shape the whole file gives."""
        mode = "L" if self.channels == 1 else "RGB"
        try:
            with Image.open(image_source(path)) as file:
                width, height = file.size
                file.draft(mode, (self.size, self.size))  # other formats than JPEG ignore it
                pixels = np.array(file.convert(mode))
        except (OSError, ValueError) as err:
            reason = "not a readable JPEG or PNG file" if isinstance(err, Image.UnidentifiedImageError) else err
            raise DataError(f"{path} cannot be read as an image ({reason}); remove it or replace it") from None
        image = torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1)
        long = int(self.size * max(width, height) / min(width, height))  # as torchvision sizes the whole file
        shape = [self.size, long] if height <= width else [long, self.size]
        image = F.resize(image, shape, interpolation=InterpolationMode(self.interpolation), antialias=True)
        return image.permute(1, 2, 0).numpy()


MAGIC = {b"\xff\xd8\xff": ("JPEG", b"\xff\xd9"), b"\x89PNG\r\n\x1a\n": ("PNG", b"IEND")}  # start, end marker
TAIL = 1024  # bytes at a file's end searched for its end marker (some writers pad after it)


def unreadable_reason(path: Path) -> str | None:
    """Why ``path`` cannot be decoded, from its first and last bytes (a truncated file lacks its end marker); None
    if it looks whole. Other formats than JPEG and PNG are asked of Pillow, which reads their header."""
    try:
        head, tail = head_and_tail(path, TAIL)
    except OSError as err:
        return err.strerror or str(err)
    for magic, (kind, end) in MAGIC.items():
        if head.startswith(magic):
            return None if end in tail else f"a truncated {kind} file: it lacks its end marker"
    try:
        with Image.open(image_source(path)):
            return None
    except (OSError, ValueError):
        return "not a readable JPEG or PNG file"


def check_readable(paths: Sequence[Path]) -> None:
    """Refuse, in one line naming them, files that cannot be decoded: before a run, not when a worker meets one."""
    bad = [(path, reason) for path in paths if (reason := unreadable_reason(path))]
    if len(bad) == 1:
        raise DataError(f"{bad[0][0]} cannot be read as an image ({bad[0][1]}); remove it or replace it")
    if bad:
        named = ", ".join(f"{path} ({reason})" for path, reason in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise DataError(f"{len(bad)} image files cannot be read: {named}{more}; remove them or replace them")


def scan_split(folder: Path, classes: list[str] | None = None) -> tuple[list[Path], np.ndarray, list[str]]:
    """The image files of one split, their labels (class folders in sorted order) and the class names; refused
    in one line if the folder is missing or empty, a class has no images, or the classes differ from ``classes``."""
    if not folder.is_dir():
        raise DataError(
            f"{folder} is not a folder; a split is a folder of class folders of .jpg/.jpeg/.png files or of .tar shards"
        )
    class_folders = _subfolders(folder)
    if not class_folders and shards_in(folder):
        return scan_shards(folder, classes)
    names = [path.name for path in class_folders]
    if not names:
        raise DataError(f"{folder} has no class folders: put each class's images in {folder}/<class name>/")
    if classes is not None and names != classes:
        extra, missing = sorted(set(names) - set(classes)), sorted(set(classes) - set(names))
        raise DataError(
            f"{folder} has other classes than the training split: only here {extra or 'none'}, "
            f"missing here {missing or 'none'}; every split needs the same class folders"
        )
    files, labels, skipped = [], [], []
    for label, class_folder in enumerate(class_folders):
        found = _images_under(class_folder, skipped=skipped)
        if not found:
            raise DataError(f"class folder {class_folder} has no images ({', '.join(IMAGE_SUFFIXES)})")
        files += found
        labels += [label] * len(found)
    _say_skipped(folder, skipped, len(files))
    return files, np.asarray(labels, dtype=np.int64), names


def _subfolders(folder: Path) -> list[Path]:
    return sorted(path for path in folder.iterdir() if path.is_dir() and not path.name.startswith("."))


def _images_under(folder: Path, recursive: bool = True, skipped: list[Path] | None = None) -> list[Path]:
    """The images under ``folder``; its other files (not hidden ones) added to ``skipped``."""
    files = [p for p in (folder.rglob("*") if recursive else folder.iterdir()) if p.is_file()]
    if skipped is not None:
        skipped += sorted(p for p in files if p.suffix.lower() not in IMAGE_SUFFIXES and not p.name.startswith("."))
    return sorted(p for p in files if p.suffix.lower() in IMAGE_SUFFIXES)


_SAID: set[Path] = set()  # the folders whose skipped files were named: once a process


def _say_skipped(folder: Path, skipped: list[Path], used: int) -> None:
    """One line, once, counting and naming (the first three of) the files of ``folder`` that are not images."""
    if skipped and folder not in _SAID:
        _SAID.add(folder)
        named = ", ".join(str(p.relative_to(folder)) for p in skipped[:3]) + (" ..." if len(skipped) > 3 else "")
        log.warning("%s: %d file(s) skipped, not %s: %s (%d images used)", folder, len(skipped),
                    "/".join(IMAGE_SUFFIXES), named, used)  # fmt: skip


def scan_images(folder: Path, classes: list[str], hint: str = "") -> tuple[list[Path], np.ndarray]:
    """The images to predict in ``folder``: loose ones, and those in folders named by one of ``classes`` (labelled
    by them; predict reads no labels, loose images get 0). A folder of images named by no class is refused."""
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder; predict takes a folder of .jpg/.jpeg/.png files")
    holding = [sub for sub in _subfolders(folder) if _images_under(sub)]
    unknown = [sub.name for sub in holding if sub.name not in classes]
    if unknown:
        raise DataError(
            f"{folder} has image folders {unknown} that are not among the model's classes {classes}{hint}; name "
            f"class folders as the model's classes, or put the images directly in {folder} to predict them unlabelled"
        )
    files = _images_under(folder, recursive=False)
    labels = [0] * len(files)
    for sub in holding:
        found = _images_under(sub)
        files += found
        labels += [classes.index(sub.name)] * len(found)
    if not files:
        raise DataError(f"{folder} holds no images ({', '.join(IMAGE_SUFFIXES)}) to predict")
    return files, np.asarray(labels, dtype=np.int64)


def checked_classes(classes: Sequence[str]) -> list[str]:
    """``data.classes`` as a list of names, refused unless two or more distinct, non-empty names."""
    names = [str(name) for name in classes]
    if len(names) < 2 or len(set(names)) != len(names) or not all(names):
        raise DataError(f"data.classes={list(classes)} is not allowed: it must be two or more distinct class names")
    return names


class ImageFolderDataModule(ImageArrayDataModule):
    """Images in class folders: ``data_dir/train/<class>/*.{jpg,jpeg,png}``, validation from ``data_dir/val/``
    if there is one (else ``val_size`` of the training images), test and predict from ``data_dir/test/``;
    predict, where there is no ``test/``, from ``data_dir`` itself: its images, loose or in class folders. The
    other options are the generic data module's.

    Args:
        data_dir: The data set's folder, holding ``train/`` (and optionally ``val/``, ``test/``); for predict, also
            a folder of images.
        image_size: Side of the square images the model sees, the centre of the files resized to ``resize_size``
            (shorter side; null: ``image_size``); null: 112.
        channels: 3: colour (grey files are repeated to three channels); 1: grey (colour files are converted).
        mean: Per-channel mean on the 0-1 scale; null: measured on up to 1,000 training images.
        std: Per-channel standard deviation on the 0-1 scale; null: measured with the mean.
        classes: The class names, in label order; null: the class folders of ``train/``. Test and predict of a
            checkpoint take its classes, as its image size, channels, mean and std.
        val_folder: The validation split's folder under ``data_dir``, used where it exists.
        test_folder: The folder under ``data_dir`` that ``test`` and ``predict`` read.
    """

    default_image_size = 112

    def __init__(
        self,
        data_dir: str = "data",
        *,
        image_size: int | None = None,
        channels: Literal[1, 3] = 3,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        classes: list[str] | None = None,
        val_folder: str = "val",
        test_folder: str = "test",
        **kwargs: Any,
    ) -> None:
        root = Path(data_dir)
        if not root.is_dir():
            raise DataError(
                f"data.data_dir={data_dir} is not a folder; it must hold train/<class>/*.jpg|png (predict: images)"
            )
        self.files: list[Path] | None = None  # the training files, listed when needed
        if classes is None:
            self.files, self.labels, names = scan_split(root / "train")
        else:
            names = checked_classes(classes)
        size = self.default_image_size if image_size is None else image_size
        decoded = kwargs.get("resize_size") or size  # the files' shorter side: their whole photo, for augmentation
        self.num_classes, self.image_shape = len(names), (decoded, decoded, channels)
        self.mean, self.std = mean, std  # checked (and None: measured) by the generic data module
        super().__init__(data_dir=data_dir, image_size=size, **kwargs)
        self.label_names = names
        self.hparams["classes"] = names  # resolved: a checkpoint's test and predict take them
        self._stage = "fit"

    def setup(self, stage: str) -> None:
        self._stage = stage
        test = self.data_dir / self.hparams.test_folder
        if stage == "fit" and test.is_dir():  # its classes now, not when test runs after training
            scan_split(test, self.label_names)
        super().setup(stage)

    def _files(self, paths: list[Path]) -> ImageFiles:
        check_readable(paths)
        return ImageFiles(paths, self.image_shape[0], self.in_channels, self.data_dir, self.hparams.interpolation)

    def _split_files(self, folder: str) -> tuple[ImageFiles, np.ndarray]:
        files, labels, _ = scan_split(self.data_dir / folder, self.label_names)
        return self._files(files), labels

    def load_split(self, train: bool) -> tuple[ImageFiles, np.ndarray]:
        if train:
            if self.files is None:
                self.files, self.labels, _ = scan_split(self.data_dir / "train", self.label_names)
            return self._files(self.files), self.labels
        test_folder = self.hparams.test_folder
        if (self.data_dir / test_folder).is_dir():
            return self._split_files(test_folder)
        if self._stage == "predict":  # a folder of new images: loose, or in class folders
            hint = f" (no data.test_folder={test_folder} there to predict instead)"
            files, labels = scan_images(self.data_dir, self.label_names, hint)
            return self._files(files), labels
        raise DataError(
            f"{self.data_dir / test_folder} does not exist: test and predict read data.test_folder={test_folder} "
            f"under data.data_dir={self.data_dir}; predict, without it, the images in data.data_dir"
        )

    def load_val_split(self) -> tuple[ImageFiles, np.ndarray] | None:
        return (
            self._split_files(self.hparams.val_folder) if (self.data_dir / self.hparams.val_folder).is_dir() else None
        )

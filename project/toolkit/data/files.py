"""A data set's files: pickles read without running code, an archive downloaded, checked and unpacked atomically."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from project.toolkit.errors import DataError


class NumpyOnlyUnpickler(pickle.Unpickler):
    """Refuses anything in a pickle but numpy arrays (CIFAR-10's files), so a tampered file cannot run code."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
    _ALLOWED |= {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}  # _codecs: protocol 2's raw bytes

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name}")
        return super().find_class(module, name)


def load_numpy_pickle(path: Path) -> dict[str, Any]:
    """Load one pickled dict of numpy arrays, with its byte-string keys turned into str."""
    try:
        with open(path, "rb") as f:
            entry = NumpyOnlyUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except Exception as err:  # truncated, garbled or not a pickle at all
        raise DataError(
            f"{path}: not a readable data file ({type(err).__name__}: {err}); delete the folder and download again"
        ) from None
    if not isinstance(entry, dict):
        raise DataError(f"{path}: expected a dict, found {type(entry).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}


def download_archive(
    url: str, md5: str, data_dir: Path, folder: str, is_complete: Callable[[Path], bool], timeout: float = 60.0
) -> None:
    """Download the archive at ``url``, check its ``md5`` and unpack its ``folder`` into ``data_dir / folder``,
    moved into place with one rename: never a partial data set, nor two processes writing the same files.
    Raises ``OSError`` or ``ValueError``; the caller words the message."""
    data_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder}-download-", dir=data_dir))
    try:
        archive = staging / "archive"
        digest = hashlib.md5()
        with urllib.request.urlopen(url, timeout=timeout) as response, open(archive, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != md5:
            raise ValueError(f"checksum mismatch: got md5 {digest.hexdigest()}, expected {md5}")
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        target = data_dir / folder
        try:
            if not is_complete(target):  # else another process finished first; its copy is as good as ours
                os.replace(staging / folder, target)
        except OSError:
            if not is_complete(target):  # it finished while we renamed: fine; anything else is a failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)

"""A run at a remote fsspec URL (``s3://``, ``gs://``, ``memory://``): its run folders listed and its checkpoints
read through fsspec, and what cannot go there refused in one line. Loaded only for such a root or checkpoint."""

from __future__ import annotations

import io
from typing import Any

from fsspec.core import url_to_fs

from project.toolkit.errors import ProjectError

# The default callbacks that write this machine's files only (not through fsspec), and what they write.
LOCAL_WRITERS = {"timing": "timing.json", "evaluation": "the confusion CSVs", "predictions": "predictions.csv"}


def glob_url(root: str, pattern: str) -> list[str]:
    """The URLs under ``root`` that match the glob ``pattern``."""
    fs, base = url_to_fs(str(root).rstrip("/"))
    return [str(root).rstrip("/") + path[len(base) :] for path in fs.glob(f"{base}/{pattern}")]


def read_url(url: str, option: str) -> io.BytesIO:
    """The file at ``url``, read whole; a one-line error naming ``option`` where there is none."""
    fs, where = url_to_fs(url)
    if not fs.isfile(where):
        raise ProjectError(f"{option}={url}: no such file; pass a checkpoint file, 'last' or 'best'")
    return io.BytesIO(fs.cat_file(where))


def check_remote_root(root_dir: str, switched_off: set[str], logger: Any) -> None:
    """Refuse a remote ``default_root_dir`` where a default callback that writes local files is on, or an MLflow
    logger would keep its store there (a local ``mlflow.db``)."""
    writers = [name for name in LOCAL_WRITERS if name not in switched_off]
    if writers:
        raise ProjectError(
            f"trainer.default_root_dir={root_dir}: {', '.join(LOCAL_WRITERS[n] for n in writers)} can only be "
            f"written to this machine's files; switch {'them' if len(writers) > 1 else 'it'} off "
            f"({' '.join(f'--callbacks.{n}=false' for n in writers)}) or use a local folder"
        )
    for entry in logger if isinstance(logger, list) else [logger]:
        if str(getattr(entry, "class_path", "")).endswith("MLFlowLogger") and not entry.init_args.get("tracking_uri"):
            raise ProjectError(
                f"trainer.logger: MLFlowLogger keeps its store in a local mlflow.db, not under "
                f"trainer.default_root_dir={root_dir}; give it a tracking_uri"
            )

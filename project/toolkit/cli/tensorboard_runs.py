"""``make tensorboard``: the runs under a folder, each named by its setup (``version_3-ddp-resnet50-2xcpu-b256``), not
just ``version_N``. Outside what a run loads, and without torch: it runs before TensorBoard starts."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from project.toolkit.dotted import section_args


def run_label(folder: Path) -> str:
    """A run's name for TensorBoard, ``version_3-ddp-resnet50-2xcpu-b256``: its folder and setup (from its
    ``timing.json``, else its ``config.yaml``)."""
    setup: list[Any] = []
    timing_file, config_file = folder / "timing.json", folder / "config.yaml"
    try:
        if timing_file.is_file():
            timing = json.loads(timing_file.read_text())
            devices = f"{timing['devices']}x{timing['accelerator']}" if "devices" in timing else None
            batch = f"b{timing['batch_size']}" if "batch_size" in timing else None
            setup = [timing.get("strategy"), timing.get("arch"), devices, batch]
        elif config_file.is_file():
            config = yaml.safe_load(config_file.read_text()) or {}
            trainer, model = config.get("trainer") or {}, config.get("model") or {}
            arch = (section_args(model) or {}).get("arch")
            setup = [trainer.get("strategy"), arch, f"{trainer.get('devices')}x{trainer.get('accelerator')}"]
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        setup = []
    words = [str(word) for word in setup if word is not None and not isinstance(word, dict)]
    return "-".join(re.sub(r"[^\w.+]+", "_", word) for word in [folder.name, *words])


def tensorboard_logdir_spec(root: Path) -> str:
    """TensorBoard's ``--logdir_spec`` naming each run folder under ``root`` by :func:`run_label` (not just
    ``version_N``); ``--logdir=root`` where there is none yet."""
    folders = sorted({p.parent for p in Path(root).rglob("events.out.tfevents.*")})
    if not folders:
        return f"--logdir={root}"
    return "--logdir_spec=" + ",".join(f"{run_label(folder)}:{folder}" for folder in folders)


if __name__ == "__main__":  # make tensorboard: the runs under LOGDIR, named by their setup
    print(tensorboard_logdir_spec(Path(sys.argv[1] if len(sys.argv) > 1 else "lightning_logs")))

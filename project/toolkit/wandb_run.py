"""W&B (Weights & Biases) beside TensorBoard, ``configs/logger/wandb.yaml``; loaded only where a run has a W&B logger.
Each W&B run is named by its run folder (``version_N``; an evaluation ``version_N-<command>``) and keeps its files
there (``version_N/wandb/``); without credentials it runs offline and says how to upload it (``wandb sync <dir>``);
it gets the run's options as its config and ``timing.json`` as its summary; a fit resumed from a checkpoint of a run
folder (``--ckpt_path=last``) continues that folder's W&B run, whose id its ``config.yaml`` records."""

from __future__ import annotations

import json
import netrc
import os
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch import loggers
from lightning.pytorch.utilities import rank_zero_only

from project.toolkit.helpers import shown_path


def has_credentials(environ: Any = None) -> bool:
    """Whether W&B finds an API key: ``WANDB_API_KEY``, or its host's entry in the netrc file (``wandb login``)."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        return netrc.netrc(environ.get("NETRC")).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):  # no netrc file, or one W&B could not read either
        return False


class WandbLogger(loggers.WandbLogger):
    """Lightning's W&B logger: offline where no credentials are found (``WANDB_MODE``, when set, decides), W&B's own
    messages left out; at the end the run folder's ``timing.json`` becomes the run's summary, the run is finished and
    one line says where it went."""

    def __init__(self, *args: Any, offline: bool = False, **kwargs: Any) -> None:
        import wandb

        wandb.setup(wandb.Settings(silent=True))  # the template prints its own lines; one for W&B, at the end
        settings = {"console": "off"}
        if not offline and not os.environ.get("WANDB_MODE") and not has_credentials():
            settings["mode"] = "offline"
        super().__init__(*args, offline=offline, settings=wandb.Settings(**settings), **kwargs)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        import wandb

        run = wandb.run  # None where this command logged nothing, or finished the run already
        if run is None:
            return
        timing = Path(self.save_dir or ".") / "timing.json"
        if timing.is_file():
            run.summary.update({"timing": json.loads(timing.read_text())})
        name, offline, folder = run.name, run.offline, Path(run.dir).parent  # dir: the folder's files/
        url = None if offline else run.url
        run.finish(exit_code=0 if status == "success" else 1)
        # Offline: every folder of the run (a continued run has one in each run folder), which `wandb sync` uploads.
        every = f"{shown_path(folder.parents[2])}/*/wandb/offline-run-*-{run.id}"
        where = f"offline, in {shown_path(folder)}: upload with wandb sync {every}" if offline else url
        print(f"  {'W&B run:':<17} {name}, {where}", flush=True)


def arrange_wandb_runs(entries: list[Any], folder: Path, subcommand: str, recorded: Any, placed: re.Pattern) -> None:
    """Point the ``init_args`` of each W&B logger in ``entries`` at the run folder ``folder``: its files there, named
    by it, a new id; a name or id matching ``placed`` (``version_N...``, as a config.yaml records them) is replaced,
    one you set stays. A fit resumed from a run folder continues the W&B run among ``recorded``, the loggers that
    folder's config.yaml records."""
    resumed = recorded_run(recorded)
    label = folder.name if subcommand == "fit" else f"{folder.name}-{subcommand}"
    for args in entries:
        args.save_dir = str(folder)
        if not args.get("name") or placed.match(str(args.name)):
            args.name = resumed.get("name") or label
        if not args.get("id") or placed.match(str(args.id)):
            args.id = resumed.get("id") or f"{label}-{uuid.uuid4().hex[:8]}"


def recorded_run(entries: Any) -> dict[str, Any]:
    """The ``name`` and ``id`` of the W&B logger among ``entries`` (as a config.yaml records them); empty if none."""
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, dict) and str(entry.get("class_path", "")).endswith("WandbLogger"):
            return {key: value for key, value in (entry.get("init_args") or {}).items() if key in ("name", "id")}
    return {}

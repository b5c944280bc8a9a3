"""A compiled run (``--model.compile_mode=reduce-overhead``) in a process of its own: what compiles, and when.
(The GPU path's settings, built on the CPU: tests/unit/test_gpu_ready.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_compiled_run_recompiles_in_no_steady_epoch_and_records_its_mode(tmp_path: Path) -> None:
    """The first epoch (and the sanity check's short validation batch) compile; later epochs, whose last validation
    batch is short too, reuse what was compiled. TORCH_LOGS=recompiles is torch's own record of it."""
    marker = tmp_path / "marker.py"
    marker.write_text(
        "import sys\nfrom lightning.pytorch import Callback\nclass EpochMarker(Callback):\n"
        "    def on_train_epoch_start(self, trainer, pl_module):\n"
        "        print(f'=== epoch {trainer.current_epoch}', file=sys.stderr, flush=True)\n"
    )
    data = ["--data=tests.support.fixtures.ColourImages", "--data.image_size=32", "--data.batch_size=20"]
    data += ["--data.val_size=30"]
    options = [*data, "--data.num_workers=0", "--trainer.accelerator=cpu", "--trainer.max_epochs=3"]
    options += ["--trainer.limit_train_batches=3", "--trainer.enable_progress_bar=false", "--model.compile=true"]
    options += ["--model.arch=tests.support.user_nets.sequential_convnet", "--model.compile_mode=reduce-overhead"]
    options += [f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=marker.EpochMarker"]
    paths = os.pathsep.join([str(REPO), str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TORCH_LOGS": "recompiles", "PYTHONPATH": paths}
    done = subprocess.run(
        [sys.executable, "-m", "project", "fit", *options], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steady = done.stderr[done.stderr.index("=== epoch 1") :]
    assert "Recompiling" not in steady, steady[:3000]
    timing = json.loads(next(tmp_path.rglob("timing.json")).read_text())
    assert timing["compile_mode"] == "reduce-overhead" and timing["epochs"][0]["seconds"] > 0

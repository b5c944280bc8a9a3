"""The project as a wheel installs it (``pip install .``, not editable): it runs fit and export, and bench finds its
presets, from the installed package alone, outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["--data.synthetic=true", "--data.synthetic_size=64", "--data.image_size=32", "--data.batch_size=16"]
TINY += ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
TINY += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def run(args: list[str], cwd: Path, site: Path) -> str:
    """``python args`` in ``cwd`` with the installed package first on the path (before the editable checkout)."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_a_wheel_install_runs_fit_export_and_finds_the_bench_presets(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building in place would leave build/ and an egg-info in the checkout
    shutil.copytree(REPO / "project", source / "project", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", source], check=True)
    (wheel,) = (tmp_path / "dist").glob("project-*.whl")
    presets = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("project/tools/bench/presets/")]
    assert sorted(Path(n).name for n in presets) == ["cpu-learn.yaml", "cpu-smoke.yaml", "gpu1.yaml", "seed.yaml"]
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    work = tmp_path / "work"  # no checkout here: every file must come from the installed package
    work.mkdir()
    assert run(["-c", "import project; print(project.__file__)"], work, site).strip() == str(
        site / "project" / "__init__.py"
    )
    assert "Presets: cpu-learn, cpu-smoke, gpu1, seed." in " ".join(
        run(["-m", "project", "bench", "--help"], work, site).split()
    )
    listed = run(
        [
            "-c",
            "from project.tools.bench import config_path, load_config; print(load_config(config_path('cpu-smoke')))",
        ],
        work,
        site,
    )
    assert "strategies=['single', 'ddp', 'fsdp', 'pipeline-mb4']" in listed
    run(["-m", "project", "fit", *TINY], work, site)
    assert (work / "lightning_logs" / "version_0" / "timing.json").is_file()
    out = run(["-m", "project", "export", "--ckpt_path=last", "--format=pt2", "--out", "model.pt2"], work, site)
    assert out.startswith("exported ") and (work / "model.pt2").stat().st_size > 0

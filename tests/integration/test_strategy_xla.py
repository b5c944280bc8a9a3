"""The XLA path, for real, on torch_xla's CPU device: fit, resume from last.ckpt, test.

torch_xla pins its own torch, so these run in their own environment: ``make test-xla`` builds
.venv-xla and runs ``pytest -m xla`` there with REQUIRE_XLA=1. In the main environment, which has no
torch_xla, they are skipped; with REQUIRE_XLA set, a missing torch_xla fails instead of skipping.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from project.__main__ import main
from tests.integration.test_strategies import recorded, recorder_args
from tests.integration.test_strategy_runs import REPO, STOP_AFTER_FIRST_EPOCH, evaluate, metrics, run_project

XLA_INSTALLED = importlib.util.find_spec("torch_xla") is not None
if not XLA_INSTALLED and os.environ.get("REQUIRE_XLA"):
    pytest.fail("REQUIRE_XLA is set but torch_xla is not installed in this environment", pytrace=False)

pytestmark = [
    pytest.mark.xla,
    pytest.mark.skipif(not XLA_INSTALLED, reason="torch_xla is not installed here; `make test-xla` runs these"),
]

XLA_CPU = f"--config={REPO / 'configs' / 'strategy' / 'xla_cpu.yaml'}"


def xla_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}  # the accelerator must set it itself
    # Compilation is most of a tiny run's time; the CPU backend's optimisation passes are not what we test.
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    return env


@pytest.mark.slow
def test_fit_resume_and_test_on_the_xla_cpu_device(tiny_args: list[str], tmp_path: Path) -> None:
    common = [*tiny_args, "--data.val_size=41", XLA_CPU]
    fit = [*common, "--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    out = tmp_path / "records"
    run_project("fit", *fit, STOP_AFTER_FIRST_EPOCH, cwd=tmp_path, env=xla_env(), timeout=420)
    run_project("fit", *fit, "--ckpt_path=last", *recorder_args(out), cwd=tmp_path, env=xla_env(), timeout=420)
    resumed = recorded(out, "fit")
    assert resumed["strategy"] == "SingleXLAStrategy" and resumed["device"] == "xla:0"
    assert resumed["start"] == {"epoch": 1, "global_step": 2} and resumed["epochs"] == [1]
    assert len(resumed["losses"]) == 2

    run_project("test", *common, "--ckpt_path=last", *recorder_args(out), cwd=tmp_path, env=xla_env(), timeout=420)
    last = tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "last.ckpt"
    # the XLA-computed metrics of the checkpoint equal an ordinary CPU evaluation of it
    assert metrics(out, "test", "test") == pytest.approx(evaluate(last, "test"), rel=1e-4)


def test_xla_cpu_has_one_device(
    tiny_args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")  # what the accelerator would set; undone after the test
    with pytest.raises(SystemExit):
        main(["fit", *tiny_args, XLA_CPU, "--trainer.devices=2"])
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: --trainer.devices=2 is not allowed with xla_cpu: it has one device")
    )

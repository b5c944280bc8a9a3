"""``StepProfile``: a few training steps under ``torch.profiler``, summarised from the profiler's own trace.

On a CPU there is no device timeline; the host syncs are counted from real runs (a step that reads its loss
twice), the device figures from a trace written as CUDA runs write them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, TensorDataset

from project.__main__ import main
from project.toolkit.errors import ProjectError
from project.toolkit.timing.step_profile import StepProfile, summarise
from tests.conftest import quiet_trainer


class ReadsItsLoss(LightningModule):
    """A step that reads its loss on the host ``reads`` times."""

    def __init__(self, reads: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.reads = reads

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).sum()
        for _ in range(self.reads):
            loss.item()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def profiled(tmp_path: Path, reads: int) -> StepProfile:
    profile = StepProfile(first_step=2, steps=3)
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=8, callbacks=[profile])
    trainer.fit(ReadsItsLoss(reads), DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8))
    return profile


@pytest.mark.parametrize("reads", [0, 2])
def test_the_host_syncs_of_a_step_are_counted(tmp_path: Path, reads: int) -> None:
    summary = profiled(tmp_path, reads).summary
    assert summary is not None and summary["steps"] == 3 and summary["first_step"] == 2
    assert summary["host_syncs"] == summary["host_reads"] == reads
    assert summary["step_seconds"] > 0 and summary["device_busy_seconds"] is None  # a CPU: no device timeline
    assert any(name == "aten::linear" for name, _ in summary["top_host_ops_ms"])
    assert json.loads((tmp_path / "step_profile.json").read_text()) == summary
    trace = json.loads((tmp_path / "step_profile.trace.json").read_text())["traceEvents"]
    assert sum(e.get("name") == "project.step" for e in trace) == 3  # the window's steps, no more


def test_the_window_counts_training_steps_also_under_gradient_accumulation(tmp_path: Path) -> None:
    profile = StepProfile(first_step=2, steps=3)
    trainer = quiet_trainer(
        tmp_path, max_epochs=1, limit_train_batches=10, accumulate_grad_batches=2, callbacks=[profile]
    )
    trainer.fit(ReadsItsLoss(1), DataLoader(TensorDataset(torch.randn(80, 4)), batch_size=8))
    assert profile.summary is not None and profile.summary["steps"] == 3 and profile.summary["host_reads"] == 1
    trace = json.loads((tmp_path / "step_profile.trace.json").read_text())["traceEvents"]
    assert sum(e.get("name") == "project.step" for e in trace) == 3  # steps 2-4, then no second window


def test_bad_options_get_one_line() -> None:
    allowed = r"StepProfile\(first_step=-1, steps=5\) is not allowed: first_step >= 0, steps >= 1"
    with pytest.raises(ProjectError, match=allowed):
        StepProfile(first_step=-1)


def test_it_runs_from_the_command_line_into_the_run_folder(tiny_args: list[str], tmp_path: Path) -> None:
    options = ["--trainer.callbacks.first_step=1", "--trainer.callbacks.steps=5"]  # the run ends after 2 of them
    main(["fit", *tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=3",
          "--trainer.callbacks+=project.toolkit.timing.step_profile.StepProfile", *options])  # fmt: skip
    summary = json.loads(next(tmp_path.glob("lightning_logs/version_*/step_profile.json")).read_text())
    assert (summary["first_step"], summary["steps"]) == (1, 2)


def test_a_run_that_ends_before_the_window_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profile = StepProfile(first_step=50)
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=3, callbacks=[profile])
    trainer.fit(ReadsItsLoss(0), DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=8))
    assert profile.summary is None and not (tmp_path / "step_profile.json").exists()
    assert "the run ended after 3 training steps, before step 50; nothing profiled" in caplog.text


def test_device_figures_from_a_cuda_trace() -> None:
    """The trace of 2 steps in 10 ms as CUDA writes it: kernels (two of them overlapping), a copy, their launches,
    a read of a value (which waits through a stream sync of its own), another stream sync, and the profiler's
    own closing wait."""
    events = [
        {"cat": "kernel", "name": "conv", "ts": 0.0, "dur": 3000.0},
        {"cat": "kernel", "name": "conv", "ts": 2000.0, "dur": 2000.0},  # overlaps the first by 1 ms
        {"cat": "kernel", "name": "relu", "ts": 5000.0, "dur": 500.0},
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 6000.0, "dur": 500.0},
        *({"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0.0, "dur": 5.0} for _ in range(3)),
        {"cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 0.0, "dur": 5.0},
        {"cat": "cpu_op", "name": "aten::_local_scalar_dense", "ts": 100.0, "dur": 50.0},
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 120.0, "dur": 5.0},  # the read's own
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 500.0, "dur": 5.0},
        {"cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 900.0, "dur": 5.0},  # the profiler's
    ]
    summary = summarise(events, wall=0.010, steps=2, own_syncs=1)
    assert summary["device_busy_seconds"] == pytest.approx(0.005 / 2)  # 4 + 0.5 + 0.5 ms over 2 steps
    assert summary["device_idle_fraction"] == pytest.approx(0.5)
    assert summary["kernels"] == 1.5 and summary["launches"] == 1.5
    assert summary["host_syncs"] == 1.0 and summary["host_reads"] == 0.5  # the read and the other sync, over 2 steps
    assert summary["top_device_ms"][0] == ["conv", 2.5]

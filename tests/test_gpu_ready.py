"""The GPU path, built and tested on the CPU (the GPU issue measures it): the compile modes, fused SGD where it
applies, ddp's and fsdp's settings, the memory traffic beside MFU, and the 8-minute script's plan, runs and JSON.
(No per-step wait: the loss guard's lag in test_faults.py, the on-device batches in test_units_data_strategies.py,
the timing callback's waits in test_timing.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer

from benchmarks import gpu_runs
from project.__main__ import main
from project.model import ImageClassifier
from project.toolkit.errors import ProjectError
from project.toolkit.measure import bandwidth
from project.toolkit.measure.summary import _work
from project.toolkit.strategies import register_strategies
from project.toolkit.strategies.fsdp import cast_buffers, check_compile_mode, mixed_precision_policy
from project.toolkit.training import fusable

REPO = Path(__file__).resolve().parents[1]


def test_a_compile_mode_outside_torchs_three_is_one_line(tiny_args: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args, "--model.compile=true", "--model.compile_mode=fast"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err
    assert "model.compile_mode=fast" in err and "reduce-overhead" in err


def test_fsdp_refuses_cuda_graphs_in_one_line() -> None:
    graphs = SimpleNamespace(hparams={"compile": True, "compile_mode": "reduce-overhead"})
    with pytest.raises(ProjectError, match="reduce-overhead .* does not run under fsdp"):
        check_compile_mode(graphs)
    check_compile_mode(SimpleNamespace(hparams={"compile": True, "compile_mode": "default"}))
    check_compile_mode(SimpleNamespace(hparams={"compile": False, "compile_mode": "reduce-overhead"}))  # eager


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
    data = ["--data=tests.fixtures.ColourImages", "--data.image_size=32", "--data.batch_size=20", "--data.val_size=30"]
    options = [*data, "--data.num_workers=0", "--trainer.accelerator=cpu", "--trainer.max_epochs=3"]
    options += ["--trainer.limit_train_batches=3", "--trainer.enable_progress_bar=false", "--model.compile=true"]
    options += ["--model.arch=tests.user_nets.sequential_convnet", "--model.compile_mode=reduce-overhead"]
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


def test_sgd_is_fused_where_every_parameter_is_on_one_cuda_device() -> None:
    cuda0, cuda1, cpu = (SimpleNamespace(device=torch.device(d)) for d in ("cuda:0", "cuda:1", "cpu"))
    assert fusable([cuda0, cuda0]) is True
    assert fusable([cuda0, cuda1]) is False and fusable([cpu, cpu]) is False and fusable([]) is False
    model = ImageClassifier(arch="tests.user_nets.sequential_convnet")
    model.trainer = SimpleNamespace(estimated_stepping_batches=4, num_training_batches=2, accumulate_grad_batches=1)
    assert model.configure_optimizers()["optimizer"].defaults["fused"] is None  # on a CPU: torch's default


def test_ddp_keeps_gradients_as_bucket_views_and_a_static_graph() -> None:
    register_strategies()
    strategy = Trainer(strategy="ddp", accelerator="cpu", devices=2, logger=False).strategy
    assert strategy._ddp_kwargs == {"gradient_as_bucket_view": True, "static_graph": True}
    assert strategy._start_method == "popen"  # as Lightning's own ddp


def test_fsdp_gathers_in_the_mixed_precision_and_casts_batchnorm_statistics_to_match() -> None:
    policy = mixed_precision_policy("bf16-mixed")
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision_policy("16-mixed").param_dtype == torch.float16
    assert mixed_precision_policy("32-true") is None and mixed_precision_policy("bf16-true") is None
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    cast_buffers(net, torch.bfloat16)
    assert net[1].running_mean.dtype == torch.bfloat16 and net[1].num_batches_tracked.dtype == torch.int64
    assert net[1].weight.dtype == torch.float32  # the parameters stay: FSDP2 casts its gathered copies


def test_the_memory_traffic_of_a_step_and_its_share_of_the_peak() -> None:
    network = {"input_bytes_per_sample": 100, "activation_bytes_per_sample": 1000, "parameter_bytes": 500}
    # 10 samples/s of 100 + 2 x 1000 bytes, and 2 devices x 1 step/s x 8 x 500 bytes
    assert bandwidth.training_traffic(network, "32-true", 10.0, 1.0, 2) == 10 * 2100 + 2 * 8 * 500
    assert bandwidth.training_traffic(network, "bf16-mixed", 10.0, 1.0, 2) == 10 * 1100 + 2 * 8 * 500
    assert bandwidth.device_peak_tbps(torch.device("cpu")) is None
    assert _work(12.345, 0.41, 1.9, 0.57) == "12.3 TFLOP/s (MFU 41.0 %), 1.9e+03 GB/s moved (57 % of peak)"
    assert _work(0.001, None, 0.0002, None) == "1 GFLOP/s, 0.2 GB/s moved"


def test_a_cpu_fit_records_its_memory_traffic(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", *tiny_args, "--trainer.max_epochs=2", "--trainer.limit_train_batches=2"])
    timing = json.loads(next(tmp_path.rglob("timing.json")).read_text())
    assert timing["bandwidth_tb_per_second"] > 0
    assert timing["peak_bandwidth_tb_per_second"] is None and timing["bandwidth_fraction"] is None  # a CPU: no peak
    assert timing["compile_mode"] is None  # eager


def python3_first() -> dict[str, str]:
    """The environment where ``python3`` is this interpreter (on the GPU machine it is the one with torch)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def test_the_plan_lists_every_step_and_totals_at_most_eight_minutes() -> None:
    done = subprocess.run(
        ["bash", "benchmarks/gpu_run.sh", "--plan"], cwd=REPO, env=python3_first(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    total = next(line for line in lines if "in all" in line)
    assert int(total.split()[0]) <= 480
    names = [re.sub(r"^\s*\d+ s  ", "", line) for line in lines if "in all" not in line][1:]
    assert names == [run.name for run in gpu_runs.RUNS]
    assert [run.name for run in gpu_runs.RUNS[:3]] == [
        "mobilenet_v2 fp32 eager, profiled",
        "mobilenet_v2 bf16 eager, profiled",
        "resnet50 bf16 eager, profiled",
    ]


def test_each_run_is_the_default_job_for_two_epochs_with_its_own_options(tmp_path: Path) -> None:
    commands = {run.name: gpu_runs.fit_command(run, tmp_path) for run in gpu_runs.RUNS if not run.command}
    for command in commands.values():
        assert command[:6] == ["python3", "-m", "project", "fit", "--config", "configs/default.yaml"]
        assert "--trainer.max_epochs=2" in command and f"--trainer.default_root_dir={tmp_path}" in command
    graphs = commands["mobilenet_v2 bf16 CUDA graphs"]
    assert {"--model.compile=true", "--model.compile_mode=reduce-overhead", "--trainer.precision=bf16-mixed"} <= set(
        graphs
    )
    assert any("StepProfile" in word for word in commands["resnet50 bf16 eager, profiled"])
    assert {"--trainer.strategy=fsdp", "--trainer.devices=1"} <= set(commands["mobilenet_v2 bf16 fsdp, one rank"])


def test_a_runs_record_and_the_json_it_goes_into(tmp_path: Path) -> None:
    timing = {
        "train_samples_per_second": 15000.0,
        "first_epoch_seconds": 8.4,
        "mfu": 0.015,
        "bandwidth_fraction": 0.4,
        "data_wait_fraction": 0.03,
        "peak_memory_mb": [6000.0, None],
        "environment": {"git_commit": "abc", "device_name": "NVIDIA H100 80GB HBM3"},
    }
    run = gpu_runs.RUNS[3]
    record = gpu_runs.entry(run, timing, None, "pass", 61.23)
    assert record["images_per_second"] == 15000.0 and record["peak_memory_mib"] == 6000.0
    assert (record["arch"], record["precision"], record["compile_mode"], record["strategy"]) == (
        "mobilenet_v2",
        "bf16-mixed",
        "default",
        "auto",
    )
    assert (record["git_commit"], record["device"], record["seconds"]) == ("abc", "NVIDIA H100 80GB HBM3", 61.2)
    assert gpu_runs.entry(run, {}, None, "exit 1", 3.0)["images_per_second"] is None  # a failed run: no figures
    path = tmp_path / "out" / "runs.json"
    gpu_runs.write_runs(path, {"device_name": "x"}, [record], "bash benchmarks/gpu_run.sh out")
    assert json.loads(path.read_text())["runs"] == [record]
    assert [p.name for p in path.parent.iterdir()] == ["runs.json"]  # written whole, no temporary file left


def test_runs_that_would_overrun_the_deadline_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []

    def fake_run(argv: list[str], log: Path, timeout_s: float) -> tuple[int, str, float]:
        ran.append(argv)
        return 0, "", 1.0

    monkeypatch.setattr("benchmarks.gpu_check.run_logged", fake_run)
    monkeypatch.setattr(gpu_runs, "environment_record", lambda out: {"device_name": "fake"})
    runs = [gpu_runs.Run("short", estimate_s=1), gpu_runs.Run("too long", estimate_s=10_000)]
    records = gpu_runs.run_all(runs, tmp_path, tmp_path / "work", deadline_s=60, command="test")
    assert [r["name"] for r in records] == ["short"] and len(ran) == 1
    assert json.loads((tmp_path / "runs.json").read_text())["runs"][0]["status"] == "pass"


def test_without_a_gpu_the_script_says_so_and_exits_0(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the runs would start")
    done = subprocess.run(
        ["bash", "benchmarks/gpu_run.sh", str(tmp_path / "out")],
        cwd=REPO,
        env=python3_first(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "gpu_runs: no CUDA GPU here" in done.stdout, done.stderr

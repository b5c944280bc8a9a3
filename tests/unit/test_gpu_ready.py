"""The GPU path, built and tested on the CPU (the GPU issue measures it): the compile modes, fused SGD where it
applies, ddp's and fsdp's settings, the memory traffic beside MFU (the GPU script: tests/tools/test_gpu_run.py; a
compiled run's recompiles: tests/integration/test_compiled_run.py). (No per-step wait: the loss guard's lag in
tests/faults/test_faults.py, the on-device batches in tests/unit/test_data_strategies.py, the timing callback's waits
in tests/integration/test_timing.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer

from project.__main__ import main
from project.model import ImageClassifier
from project.toolkit.errors import ProjectError
from project.toolkit.strategies.fsdp import cast_buffers, check_compile_mode, mixed_precision_policy
from project.toolkit.strategies.registry import register_strategies
from project.toolkit.timing import flops, peaks
from project.toolkit.timing.table import work_text as _work
from project.toolkit.training import fusable


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


def test_sgd_is_fused_where_every_parameter_is_on_one_cuda_device() -> None:
    cuda0, cuda1, cpu = (SimpleNamespace(device=torch.device(d)) for d in ("cuda:0", "cuda:1", "cpu"))
    assert fusable([cuda0, cuda0]) is True
    assert fusable([cuda0, cuda1]) is False and fusable([cpu, cpu]) is False and fusable([]) is False
    model = ImageClassifier(arch="tests.support.user_nets.sequential_convnet")
    model.trainer = SimpleNamespace(
        estimated_stepping_batches=4, num_training_batches=2, accumulate_grad_batches=1, datamodule=None
    )
    assert model.configure_optimizers()["optimizer"].defaults["fused"] is None  # on a CPU: torch's default


def test_ddp_is_lightnings_own_and_ddp_static_keeps_bucket_views_and_a_static_graph() -> None:
    register_strategies()
    ddp = Trainer(strategy="ddp", accelerator="cpu", devices=2, logger=False).strategy
    assert ddp._ddp_kwargs == {} and ddp._start_method == "popen"  # as Lightning registers it: any network runs
    strategy = Trainer(strategy="ddp_static", accelerator="cpu", devices=2, logger=False).strategy
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
    assert flops.training_traffic(network, "32-true", 10.0, 1.0, 2) == 10 * 2100 + 2 * 8 * 500
    assert flops.training_traffic(network, "bf16-mixed", 10.0, 1.0, 2) == 10 * 1100 + 2 * 8 * 500
    assert peaks.device_peak_tbps(torch.device("cpu")) is None
    assert _work(12.345, 0.41, 1.9, 0.57) == "12.3 TFLOP/s (MFU 41.0 %), 1.9e+03 GB/s moved (57 % of peak)"
    assert _work(0.001, None, 0.0002, None) == "1 GFLOP/s, 0.2 GB/s moved"


def test_a_cpu_fit_records_its_memory_traffic(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", *tiny_args, "--trainer.max_epochs=2", "--trainer.limit_train_batches=2"])
    timing = json.loads(next(tmp_path.rglob("timing.json")).read_text())
    assert timing["bandwidth_tb_per_second"] > 0
    assert timing["peak_bandwidth_tb_per_second"] is None and timing["bandwidth_fraction"] is None  # a CPU: no peak
    assert timing["compile_mode"] is None  # eager

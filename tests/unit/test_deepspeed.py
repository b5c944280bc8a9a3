"""DeepSpeed: the refusals, and its checkpoint folders outside DeepSpeed (:mod:`project.toolkit.strategies.deepspeed`).

What needs DeepSpeed itself (a CUDA GPU and the deepspeed package) is not run here: training under it, the
folder it writes, and Lightning's conversion of that folder. Those run in ``python -m benchmarks.gpu_check``.
Here the folder layout is written by hand, so everything of this template's own around them is exercised.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.strategies import DeepSpeedStrategy, StrategyRegistry

from project.toolkit.errors import ProjectError
from project.toolkit.strategies import deepspeed
from project.toolkit.strategies.deepspeed import (
    check_deepspeed_checkpoint,
    check_deepspeed_choice,
    is_deepspeed_checkpoint,
    is_deepspeed_strategy,
)

CUDA_ONLY = "DeepSpeed runs on CUDA GPUs only (Lightning's DeepSpeedStrategy)"
CPU_CHOICES = "on CPUs use --trainer.strategy=ddp or --trainer.strategy=fsdp"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deepspeed, "_deepspeed_installed", lambda: True)


@pytest.fixture
def not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deepspeed, "_deepspeed_installed", lambda: False)


def refusal(strategy: object, accelerator: object) -> str:
    with pytest.raises(ProjectError) as caught:
        check_deepspeed_choice(strategy, accelerator)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- choosing DeepSpeed


def test_lightnings_deepspeed_names_are_registered() -> None:
    assert {"deepspeed", "deepspeed_stage_2", "deepspeed_stage_3"} <= set(StrategyRegistry.available_strategies())


@pytest.mark.parametrize(
    "strategy",
    [
        "deepspeed",
        "deepspeed_stage_2",
        "deepspeed_stage_3_offload",
        "lightning.pytorch.strategies.DeepSpeedStrategy",
        DeepSpeedStrategy,
        {"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy", "init_args": {"stage": 2}},
        Namespace(class_path="lightning.pytorch.strategies.DeepSpeedStrategy"),
    ],
)
def test_deepspeed_in_any_form_is_recognised(strategy: object) -> None:
    assert is_deepspeed_strategy(strategy)


@pytest.mark.parametrize("strategy", ["auto", "ddp", "fsdp", "dp", None, Namespace(class_path="a.DDPStrategy")])
def test_other_strategies_are_not(strategy: object) -> None:
    assert not is_deepspeed_strategy(strategy)


@pytest.mark.usefixtures("installed")
def test_refused_on_cpu() -> None:
    message = refusal("deepspeed_stage_2", "cpu")
    assert message.startswith("trainer.strategy='deepspeed_stage_2': ")
    assert CUDA_ONLY in message and "trainer.accelerator='cpu'" in message and CPU_CHOICES in message
    assert CUDA_ONLY in refusal(DeepSpeedStrategy, CPUAccelerator())
    assert CUDA_ONLY in refusal(Namespace(class_path="lightning.pytorch.strategies.DeepSpeedStrategy"), "cpu")


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("accelerator", ["auto", None])
def test_refused_on_auto_without_a_gpu(monkeypatch: pytest.MonkeyPatch, accelerator: object) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = refusal("deepspeed", accelerator)
    assert "trainer.accelerator='auto' and this machine has no CUDA GPU" in message and CPU_CHOICES in message


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("accelerator", ["mps", "tpu", "xla_cpu"])
def test_refused_on_other_accelerators(accelerator: str) -> None:
    assert f"trainer.accelerator={accelerator!r}" in refusal("deepspeed_stage_3", accelerator)


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    "accelerator", ["gpu", "cuda", "lightning.pytorch.accelerators.CUDAAccelerator", CUDAAccelerator]
)
def test_accepted_on_cuda(accelerator: object) -> None:
    check_deepspeed_choice("deepspeed_stage_2", accelerator)


@pytest.mark.usefixtures("installed")
def test_accepted_on_auto_with_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_deepspeed_choice("deepspeed_stage_2", "auto")


@pytest.mark.usefixtures("not_installed")
def test_refused_without_the_package_on_a_gpu() -> None:
    message = refusal("deepspeed_stage_2", "gpu")
    assert message == (
        "trainer.strategy='deepspeed_stage_2' needs the deepspeed package, which is not installed: "
        "pip install -e '.[deepspeed]'"
    )


@pytest.mark.usefixtures("not_installed")
def test_the_accelerator_is_named_first() -> None:
    """Installing deepspeed would not help a CPU run: the CPU refusal comes first."""
    assert CUDA_ONLY in refusal("deepspeed_stage_2", "cpu")


@pytest.mark.usefixtures("not_installed")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "auto", "dp"])
def test_other_strategies_pass(strategy: str) -> None:
    check_deepspeed_choice(strategy, "cpu")


def test_the_package_check_is_real() -> None:
    assert deepspeed._deepspeed_installed() == (importlib.util.find_spec("deepspeed") is not None)


# --------------------------------------------------------------------------- checkpoint folders


def fake_deepspeed_folder(path: Path, zero3: bool = False) -> Path:
    """The layout Lightning's DeepSpeedStrategy.save_checkpoint leaves (deepspeed_engine.save_checkpoint with
    tag="checkpoint"), with empty files: ``latest`` names the tag folder of model and optimizer states."""
    tag = path / "checkpoint"
    tag.mkdir(parents=True)
    (path / "latest").write_text("checkpoint")
    model = "zero_pp_rank_0_mp_rank_00_model_states.pt" if zero3 else "mp_rank_00_model_states.pt"
    (tag / model).write_bytes(b"")
    for rank in (0, 1):
        (tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    (path / "zero_to_fp32.py").write_text("")
    return path


@pytest.mark.parametrize("zero3", [False, True])
def test_a_deepspeed_folder_is_recognised(tmp_path: Path, zero3: bool) -> None:
    assert is_deepspeed_checkpoint(fake_deepspeed_folder(tmp_path / "last.ckpt", zero3))
    assert is_deepspeed_checkpoint(str(tmp_path / "last.ckpt"))


def test_what_is_not_a_deepspeed_folder(tmp_path: Path) -> None:
    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {}}, plain)
    assert not is_deepspeed_checkpoint(plain)
    assert not is_deepspeed_checkpoint(tmp_path / "missing.ckpt")
    sharded = tmp_path / "fsdp.ckpt"  # torch distributed checkpoint (fsdp with save_distributed_checkpoint)
    sharded.mkdir()
    (sharded / ".metadata").write_bytes(b"")
    assert not is_deepspeed_checkpoint(sharded)
    no_tag_folder = fake_deepspeed_folder(tmp_path / "a.ckpt")
    (no_tag_folder / "latest").write_text("global_step7")  # names a folder that is not there
    assert not is_deepspeed_checkpoint(no_tag_folder)
    empty_tag = fake_deepspeed_folder(tmp_path / "b.ckpt")
    (empty_tag / "checkpoint" / "mp_rank_00_model_states.pt").unlink()  # half written: no model states
    assert not is_deepspeed_checkpoint(empty_tag)


def test_a_folder_is_read_by_deepspeed_alone_and_the_converter_named(tmp_path: Path) -> None:
    folder = fake_deepspeed_folder(tmp_path / "last.ckpt")
    check_deepspeed_checkpoint(folder, "deepspeed_stage_2")  # DeepSpeed resumes and tests it
    for strategy in ("auto", "ddp", None):
        with pytest.raises(ProjectError, match=r"is a DeepSpeed checkpoint folder.*convert_zero_checkpoint") as caught:
            check_deepspeed_checkpoint(folder, strategy)
        assert "\n" not in str(caught.value)
    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {}}, plain)
    check_deepspeed_checkpoint(plain, "auto")  # a file: checked elsewhere


def test_the_named_converter_makes_one_file_of_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command the refusal names runs Lightning's converter on the folder (a stand-in here: it needs deepspeed)."""
    folder = fake_deepspeed_folder(tmp_path / "last.ckpt")
    with pytest.raises(ProjectError) as caught:
        check_deepspeed_checkpoint(folder, "auto")
    command = str(caught.value).split("converter: ", 1)[1]
    stand_in = tmp_path / "site" / "lightning" / "pytorch" / "utilities"
    stand_in.mkdir(parents=True)
    for package in (stand_in.parent.parent, stand_in.parent, stand_in):
        (package / "__init__.py").write_text("")
    (stand_in / "deepspeed.py").write_text(
        "def convert_zero_checkpoint_to_fp32_state_dict(folder, output):\n    open(output, 'w').write(folder)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    subprocess.run(command.replace("python ", f"{sys.executable} ", 1), shell=True, check=True)
    assert (tmp_path / "last.ckpt.fp32").read_text() == str(folder)


@pytest.mark.parametrize("strategy", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_the_command_line_refuses_deepspeed_on_a_cpu_in_one_line(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, strategy: str
) -> None:
    from project.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args, f"--trainer.strategy={strategy}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("error:")]) == 1
    line = next(line for line in err if line.startswith("error:"))
    assert strategy in line and "ddp" in line and "fsdp" in line and "Traceback" not in "\n".join(err)
    assert not list(tmp_path.rglob("*.ckpt"))

"""The speed options (``--model.compile``, ``--trainer.precision=bf16-mixed``, ``--model.channels_last``)
on a CPU, and the rule that the steps never read a device value on the host."""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.overrides import TorchFunctionMode

from project.__main__ import main
from project.data import CIFAR10DataModule
from project.model import ImageClassifier
from project.toolkit.errors import ProjectError
from project.toolkit.strategies.dp import check_not_compiled

SHORT_RUN = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]


def last_checkpoint(root: Path) -> Path:
    return root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_compiled_fit_saves_a_checkpoint_an_eager_model_loads(tiny_args: list[str], tmp_path: Path) -> None:
    # resnet18: a small graph, so that compiling forward, backward and evaluation takes a minute or two
    # on a CPU rather than several (mobilenet_v2 took over three on 2 shared cores)
    cli = main(["fit", *tiny_args, *SHORT_RUN, "--model.arch=resnet18", "--model.compile=true"])
    compiled = cli.model
    assert compiled.net._compiled_call_impl is not None  # what nn.Module.compile installs
    assert math.isfinite(cli.trainer.callback_metrics["train/loss"])

    eager = ImageClassifier.load_from_checkpoint(last_checkpoint(tmp_path), compile=False).eval()  # strict keys
    assert eager.net._compiled_call_impl is None
    assert eager.state_dict().keys() == ImageClassifier(arch="resnet18").state_dict().keys()
    images = torch.randn(20, 3, 32, 32)  # the validation batch's shape: compiled already, no recompile
    with torch.inference_mode():
        torch.testing.assert_close(eager(images), compiled.eval()(images), rtol=1e-3, atol=1e-3)


class OutputDtypes(Callback):
    """Records the dtype of the network's output in every training and test batch."""

    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()
        self.in_batch = False  # not the timing callback's FLOP count, a forward of its own at setup

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        def record(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
            if self.in_batch:
                self.dtypes.add(output.dtype)

        pl_module.net.register_forward_hook(record)

    def on_train_batch_start(self, *args: object) -> None:
        self.in_batch = True

    on_test_batch_start = on_train_batch_start

    def on_train_batch_end(self, *args: object) -> None:
        self.in_batch = False

    on_test_batch_end = on_train_batch_end


def test_bf16_mixed_fits_and_tests_on_cpu_with_finite_losses(tiny_args: list[str]) -> None:
    bf16 = ["--trainer.precision=bf16-mixed", f"--trainer.callbacks+={__name__}.OutputDtypes"]
    fitted = main(["fit", *tiny_args, *SHORT_RUN, *bf16])
    metrics = fitted.trainer.callback_metrics
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["val/loss"])
    recorder = next(c for c in fitted.trainer.callbacks if isinstance(c, OutputDtypes))
    assert recorder.dtypes == {torch.bfloat16}  # the network ran under bfloat16 autocast

    tested = main(["test", *tiny_args, "--ckpt_path=last", *bf16])
    assert math.isfinite(tested.trainer.callback_metrics["test/loss"])
    assert 0 <= tested.trainer.callback_metrics["test/acc"] <= 1


def test_channels_last_changes_the_memory_layout_not_the_result() -> None:
    torch.manual_seed(0)
    nhwc = ImageClassifier(channels_last=True).eval()
    nchw = ImageClassifier(channels_last=False).eval()
    nchw.load_state_dict(nhwc.state_dict())
    images = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(nhwc(images), nchw(images), rtol=1e-4, atol=1e-4)


def on(strategy_name: str, device: str = "cpu") -> types.SimpleNamespace:
    """Stands in for the Trainer that configure_model asks about the strategy."""
    return types.SimpleNamespace(
        strategy=types.SimpleNamespace(strategy_name=strategy_name, root_device=torch.device(device))
    )


def test_compile_works_in_place_once() -> None:
    model = ImageClassifier(compile=True)
    net, keys = model.net, model.state_dict().keys()
    model.trainer = on("single_device")
    model.configure_model()
    compiled = model.net._compiled_call_impl
    assert model.net is net and compiled is not None and model.state_dict().keys() == keys
    model.configure_model()  # again, as for validate/test after fit
    assert model.net._compiled_call_impl is compiled


def test_compile_is_refused_on_xla() -> None:
    model = ImageClassifier(compile=True)
    model.trainer = on("single_xla", "xla")
    with pytest.raises(ProjectError, match="--model.compile=true is not for XLA"):
        model.configure_model()
    assert model.net._compiled_call_impl is None


@pytest.mark.parametrize("strategy", ["dp", "dp_balanced"])
def test_compile_is_refused_by_data_parallel(strategy: str) -> None:
    model = ImageClassifier(compile=True)
    model.trainer = on("single_device")
    check_not_compiled(model.net, strategy)  # not compiled yet: fine
    model.configure_model()
    with pytest.raises(ProjectError, match=f"--model.compile=true does not work with --trainer.strategy={strategy}:"):
        check_not_compiled(model.net, strategy)


# Tensor methods that hand a value to Python: on an accelerator each waits for every queued kernel.
HOST_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
}


class HostReads(TorchFunctionMode):
    """Records the tensor methods of :data:`HOST_READS` called while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in HOST_READS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


class WatchedClassifier(ImageClassifier):
    """ImageClassifier whose steps (with Lightning's logging and the metric updates inside them) run
    under :class:`HostReads`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host_reads = HostReads()

    def training_step(self, *args: Any) -> torch.Tensor:
        with self.host_reads:
            return super().training_step(*args)

    def validation_step(self, *args: Any) -> None:
        with self.host_reads:
            super().validation_step(*args)

    def test_step(self, *args: Any) -> None:
        with self.host_reads:
            super().test_step(*args)


def test_the_steps_never_read_a_value_on_the_host(cifar_root: Path, tmp_path: Path) -> None:
    # On a CPU a host read costs nothing, so it is the calls that are checked: the same code runs on
    # GPUs. Reads inside C++ kernels (torch.unique, bincount, boolean masks) do not show here.
    model = WatchedClassifier(arch="resnet18")
    data = CIFAR10DataModule(
        data_dir=str(cifar_root), download=False, image_size=32, batch_size=20, val_size=40, num_workers=0
    )
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=3,
        limit_val_batches=2,
        limit_test_batches=2,
        log_every_n_steps=1,  # the loggers read the step values every step here, outside the steps
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, data)
    assert {"train/loss", "train/acc", "val/loss", "val/acc"} <= trainer.callback_metrics.keys()
    trainer.test(model, data)
    assert {"test/loss", "test/acc"} <= trainer.callback_metrics.keys()
    assert model.host_reads.calls == []

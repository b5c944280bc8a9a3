"""The networks and the LightningModule, on their own."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from project.__main__ import main
from project.model import ImageClassifier
from project.nets import build_network
from project.toolkit.errors import ProjectError


@pytest.mark.parametrize("arch", ["mobilenet_v2", "resnet50"])
@pytest.mark.parametrize("size", [32, 112])
def test_both_archs_give_one_logit_per_class(arch: str, size: int) -> None:
    model = ImageClassifier(arch=arch, num_classes=7).eval()
    with torch.inference_mode():
        logits = model(torch.randn(2, 3, size, size))
    assert logits.shape == (2, 7)


def test_networks_are_built_without_pretrained_weights() -> None:
    torch.manual_seed(0)
    a = build_network("mobilenet_v2", 10).features[0][0].weight
    torch.manual_seed(1)
    b = build_network("mobilenet_v2", 10).features[0][0].weight
    assert not torch.equal(a, b)  # random initialisation, not a downloaded checkpoint


def test_unknown_arch_lists_the_choices() -> None:
    with pytest.raises(ProjectError, match=r"model.arch='resnet5' .* torchvision's are: .*mobilenet_v2.*resnet50"):
        build_network("resnet5", 10)


def test_a_network_factory_by_dotted_path_gets_the_class_and_channel_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_nets.py").write_text(
        "from torch import nn\n"
        "def small(num_classes, in_channels):\n"
        "    return nn.Sequential(nn.Conv2d(in_channels, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), "
        "nn.Linear(4, num_classes))\n"
        "def not_a_net(num_classes, in_channels):\n"
        "    return 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = ImageClassifier(arch="my_nets.small", num_classes=5, in_channels=1)
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 5)
    with pytest.raises(ProjectError, match=r"model.arch='my_nets.not_a_net' returned int, not an nn.Module"):
        build_network("my_nets.not_a_net", 5)
    with pytest.raises(ProjectError, match=r"model.arch='my_nets.missing' cannot be imported"):
        build_network("my_nets.missing", 5)


@pytest.mark.parametrize("arch", ["mobilenet_v2", "resnet18"])
def test_torchvision_networks_take_one_channel_images(arch: str) -> None:
    model = ImageClassifier(arch=arch, num_classes=4, in_channels=1).eval()
    with torch.inference_mode():
        assert model(torch.randn(2, 1, 32, 32)).shape == (2, 4)


def test_another_optimizer_and_schedule_are_options(tiny_args: list[str], tmp_path: Path) -> None:
    """Through the command line, as a user gives them: AdamW at lr 0.01 and StepLR halving it per epoch."""
    main(
        [
            "fit",
            *tiny_args,
            "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=1",
            "--trainer.limit_val_batches=1",
            "--model.arch=resnet18",
            "--model.optimizer=torch.optim.AdamW",
            "--model.optimizer.lr=0.01",
            "--model.lr_scheduler=torch.optim.lr_scheduler.StepLR",
            "--model.lr_scheduler.step_size=1",
            "--model.lr_scheduler.gamma=0.5",
        ]
    )
    checkpoint = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    state = checkpoint["optimizer_states"][0]
    assert "exp_avg" in next(iter(state["state"].values()))  # AdamW's, not SGD's momentum buffer
    assert state["param_groups"][0]["lr"] == pytest.approx(0.01 * 0.5**2)
    assert checkpoint["lr_schedulers"][0]["step_size"] == 1


def test_the_default_optimizer_is_sgd_with_a_warmed_up_cosine_schedule_per_step() -> None:
    model = ImageClassifier(arch="resnet18")
    model.trainer = SimpleNamespace(
        estimated_stepping_batches=20, num_training_batches=10, accumulate_grad_batches=1, datamodule=None
    )
    config = model.configure_optimizers()
    assert isinstance(config["optimizer"], torch.optim.SGD) and config["optimizer"].defaults["nesterov"]
    assert config["lr_scheduler"]["interval"] == "step"
    assert config["lr_scheduler"]["scheduler"].lr_lambdas[0](9) == 1.0  # the warm-up's end: one epoch


def test_any_torchvision_classifier_is_accepted() -> None:
    assert ImageClassifier(arch="resnet18", num_classes=3)(torch.randn(2, 3, 32, 32)).shape == (2, 3)


def test_channels_last_is_used_by_default_and_can_be_switched_off() -> None:
    weight = ImageClassifier().net.features[0][0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last)
    assert ImageClassifier(channels_last=False).net.features[0][0].weight.is_contiguous()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"lr": 0}, "model.lr=0"),
        ({"momentum": 1.5}, "model.momentum=1.5"),
        ({"weight_decay": -1}, "model.weight_decay=-1"),
        ({"label_smoothing": 1.0}, "model.label_smoothing=1.0"),
        ({"warmup_epochs": -0.5}, "model.warmup_epochs=-0.5"),
        ({"momentum": 0.0}, "model.nesterov=true needs model.momentum > 0"),
        ({"num_classes": 1}, "model.num_classes=1"),
    ],
)
def test_bad_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ProjectError, match=message):
        ImageClassifier(**options)

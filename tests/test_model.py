"""The networks and the LightningModule, on their own."""

from __future__ import annotations

import pytest
import torch

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
    with pytest.raises(ProjectError, match=r"model.arch='resnet5' .* choose one of: .*mobilenet_v2.*resnet50"):
        build_network("resnet5", 10)


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

"""FLOPs per image, device peaks and MFU: :mod:`project.toolkit.timing.flops` and :mod:`.peaks`."""

from __future__ import annotations

import functools

import pytest
import torch
import torchvision
from lightning.pytorch.utilities.model_summary import get_human_readable_count
from torch import nn

from project.__main__ import main
from project.toolkit.timing.flops import forward_flops_by_module, mfu, model_flops_per_sample
from project.toolkit.timing.peaks import DENSE_TFLOPS, PEAK_TBPS, device_peak_tbps, device_peak_tflops, device_row


def arch_flops_per_sample(arch: str, num_classes: int, image_size: int) -> dict[str, int]:
    """The count of torchvision's ``arch``, built straight on the meta device (no weights are made)."""
    with torch.device("meta"):
        net = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    return model_flops_per_sample(net, image_size)


@functools.cache
def counted(arch: str, image_size: int) -> dict[str, int]:
    """Each (network, size) counted once for the whole module: a ResNet50 takes about a second here."""
    return arch_flops_per_sample(arch, 10, image_size)


# --------------------------------------------------------------------------- counting


def tiny_network() -> nn.Module:
    """A convolution, a depthwise (grouped) convolution and a linear layer, on 3 x 8 x 8 images."""
    return nn.Sequential(
        nn.Conv2d(3, 4, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, kernel_size=3, padding=1, groups=4),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 10),
    )


def test_a_network_counted_by_hand() -> None:
    # Multiply-adds (MACs) of the forward pass, per image; a MAC is 2 FLOPs, biases are not counted.
    conv = 8 * 8 * 4 * 3 * 3 * 3  # output positions x output channels x input channels x kernel = 6912
    depthwise = 8 * 8 * 4 * 1 * 3 * 3  # each output channel sees 4 / groups(4) = 1 input channel: 2304
    linear = 256 * 10  # 2560
    forward = 2 * (conv + depthwise + linear)  # 23552
    # The backward: every forward MAC has one MAC in the weight gradient and one in the input gradient,
    # except the first convolution's input gradient, which nothing needs (the images are not trained).
    backward = 2 * (conv + 2 * depthwise + 2 * linear)  # 2 x 16640 = 33280
    assert model_flops_per_sample(tiny_network(), image_size=8) == {"train": forward + backward, "inference": forward}
    assert forward + backward == 56832


def test_each_module_counted_by_hand() -> None:
    """The forward of the hand-counted network, by module ("": the network; ReLU and Flatten do no counted work)."""
    by_module = forward_flops_by_module(tiny_network(), image_size=8)
    assert by_module == {"": 23552, "0": 2 * 6912, "2": 2 * 2304, "4": 2 * 2560}


def test_the_fit_summary_shows_the_forward_flops_per_image(tiny_args: list[str], capsys: pytest.CaptureFixture) -> None:
    """Lightning's summary counts FLOPs only through an ``example_input_array``, which the module leaves unset: the
    template's summary shows the network's, counted on a meta copy (tiny_args: 32 px, 3 channels)."""
    options = ["--trainer.enable_model_summary=true", "--trainer.max_epochs=1", "--trainer.limit_train_batches=1"]
    cli = main(["fit", *tiny_args, *options, "--callbacks.timing=false"])
    forward = model_flops_per_sample(cli.model.net, 32, cli.model.hparams.channels_last)["inference"]
    printed = capsys.readouterr()
    totals = [
        line for line in (printed.out + printed.err).splitlines() if "Total FLOPs" in line or "Total Flops" in line
    ]
    assert len(totals) == 1 and get_human_readable_count(forward) in totals[0] and forward > 0, totals


def test_grouped_convolutions_are_not_counted_once_per_group() -> None:
    """torch's own formula counts a depthwise convolution's weight gradient C times (C = channels): a
    depthwise layer's backward must be twice its forward, whatever the number of groups."""
    for channels in (4, 64):
        net = nn.Sequential(nn.Conv2d(3, channels, 1), nn.Conv2d(channels, channels, 3, padding=1, groups=channels))
        counts = model_flops_per_sample(net, image_size=8)
        pointwise = 2 * 8 * 8 * channels * 3  # forward; its backward: the weight gradient only
        depthwise = 2 * 8 * 8 * channels * 9
        assert counts == {"train": 2 * pointwise + 3 * depthwise, "inference": pointwise + depthwise}


# The first convolution (the stem) of each network at ``size`` px, in MACs: stride 2, so (size / 2)^2 output
# positions, 3 input channels.
STEMS = {
    "mobilenet_v2": lambda size: (size // 2) ** 2 * 32 * 3 * 3 * 3,  # 3x3, 32 channels
    "resnet50": lambda size: (size // 2) ** 2 * 64 * 3 * 7 * 7,  # 7x7, 64 channels
}
CLASSIFIERS = {"mobilenet_v2": 1280 * 10, "resnet50": 2048 * 10}  # the final linear layer's MACs


@pytest.mark.parametrize("arch", ["mobilenet_v2", "resnet50"])
@pytest.mark.parametrize("size", [32, 112])
def test_training_is_three_forwards_less_the_stems_input_gradient(arch: str, size: int) -> None:
    """Each counted forward operation costs twice as much again in the backward (input and weight gradient),
    except the stem's input gradient, which is not computed: train = 3 x inference - 2 x stem MACs, exactly.
    So train is just under 3 x inference: within 4 % (the stem is 1 % of ResNet50's work, 2 % of MobileNetV2's)."""
    counts = counted(arch, size)
    assert counts["train"] == 3 * counts["inference"] - 2 * STEMS[arch](size)
    assert 2.88 < counts["train"] / counts["inference"] < 3.0


@pytest.mark.parametrize("arch", ["mobilenet_v2", "resnet50"])
def test_work_grows_with_the_number_of_pixels(arch: str) -> None:
    """At sizes that are multiples of the networks' total stride (32) every feature map grows with the image
    area, and only the classifier does not: inference(k x 32 px) = k^2 x (inference(32) - classifier) +
    classifier, exactly. At 112 px (3.5 x 32) the stride-2 layers round 3.5 up to 4 in the last stage, so the
    count is above (112 / 32)^2 x that at 32 px, by 8 % for MobileNetV2 and 5 % for ResNet50."""
    at_32 = counted(arch, 32)["inference"]
    classifier = 2 * CLASSIFIERS[arch]
    for size in (64, 224):
        k = size // 32
        assert counted(arch, size)["inference"] == k**2 * (at_32 - classifier) + classifier
    ratio = counted(arch, 112)["inference"] / at_32
    assert (112 / 32) ** 2 < ratio < 1.1 * (112 / 32) ** 2


def test_published_sizes_at_224_px() -> None:
    """ResNet50: 4.1 GMACs (8.2 GFLOPs); MobileNetV2: 300 MMACs (0.6 GFLOPs), both with 1000 classes."""
    assert arch_flops_per_sample("resnet50", 1000, 224)["inference"] / 1e9 == pytest.approx(8.2, rel=0.01)
    assert arch_flops_per_sample("mobilenet_v2", 1000, 224)["inference"] / 1e9 == pytest.approx(0.6, rel=0.02)


def test_the_network_passed_in_is_unchanged() -> None:
    torch.manual_seed(0)
    net = torchvision.models.get_model(
        "mobilenet_v2", weights=None, num_classes=10
    )  # BatchNorm: a training-mode forward would move its running stats
    before = {k: v.clone() for k, v in net.state_dict().items()}
    counts = model_flops_per_sample(net, image_size=32)
    assert counts == counted("mobilenet_v2", 32)  # a real network counts as the meta-built one
    assert net.training
    after = net.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None and p.device.type == "cpu" for p in net.parameters())
    net.eval()
    model_flops_per_sample(net, image_size=32, channels_last=False)
    assert not net.training


def test_the_memory_layout_does_not_change_the_count() -> None:
    net = tiny_network()
    assert model_flops_per_sample(net, 8, channels_last=True) == model_flops_per_sample(net, 8, channels_last=False)


# --------------------------------------------------------------------------- peaks and MFU


def peak_on(monkeypatch: pytest.MonkeyPatch, name: str, precision: str | int, tf32: bool = True) -> float | None:
    """:func:`device_peak_tflops` of a CUDA device that torch names ``name`` (an Ampere or later one), cuDNN's TF32
    switch set to ``tf32``: the lookup as it runs on that GPU, without one."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    return device_peak_tflops(torch.device("cuda", 0), str(precision))


@pytest.mark.parametrize(
    ("name", "precision", "tf32", "peak"),
    [
        ("NVIDIA H200", "bf16-mixed", False, 989.4),  # dense: Lightning's table has the sparse 2,000
        ("NVIDIA H200", "32-true", True, 494.7),
        ("NVIDIA H200 NVL", "bf16-mixed", False, 835.5),
        ("NVIDIA H100 NVL", "16-mixed", False, 835.5),  # dense: Lightning's table has the sparse 1,978.8
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", False, 989.4),  # Lightning's own, dense
        ("NVIDIA H100 80GB HBM3", "32-true", True, 494.7),  # float32 convolutions in TF32
        ("NVIDIA H100 80GB HBM3", "32-true", False, 66.9),  # the CUDA cores
        ("NVIDIA H100 PCIe", "16-mixed", False, 756.0),
        ("NVIDIA A100-SXM4-80GB", "32-true", True, 156.0),
        ("NVIDIA A100-SXM4-40GB", "bf16-true", True, 312.0),  # TF32 concerns float32 work only
        ("NVIDIA L4", "32", True, 60.0),
    ],
)
def test_dense_peaks(monkeypatch: pytest.MonkeyPatch, name: str, precision: str, tf32: bool, peak: float) -> None:
    assert peak_on(monkeypatch, name, precision, tf32) == pytest.approx(peak)


def test_the_template_s_own_figures_are_dense() -> None:
    for row in DENSE_TFLOPS.values():  # tensor cores: bf16 and fp16 alike, twice TF32, above plain FP32
        assert row["bf16"] == row["fp16"] == pytest.approx(2 * row["tf32"], rel=0.01)
        assert row["tf32"] > row["fp32"]


@pytest.mark.parametrize(
    ("name", "precision"),
    [
        ("AMD Radeon Pro", "bf16-mixed"),
        ("NVIDIA H100 80GB HBM3", "64-true"),
        ("NVIDIA H100 80GB HBM3", "transformer-engine"),
    ],
)
def test_no_guess_for_what_no_table_holds(monkeypatch: pytest.MonkeyPatch, name: str, precision: str) -> None:
    assert peak_on(monkeypatch, name, precision) is None


def test_no_peak_off_cuda() -> None:
    assert device_peak_tflops(torch.device("cpu"), "32-true") is None
    assert device_peak_tbps(torch.device("cpu")) is None


@pytest.mark.parametrize(
    ("name", "row"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA L40S", None),
    ],
)
def test_bandwidth_rows(name: str, row: str | None) -> None:
    assert device_row(name, PEAK_TBPS) == row


def test_mfu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mfu(None, 989.4) is None
    assert mfu(10.0, None) is None
    assert mfu(10.0, 0.0) is None
    assert mfu(10.0, -1.0) is None
    # 5000 images/s of MobileNetV2 at 112 px, on one H100 SXM in bf16
    achieved = 5000 * counted("mobilenet_v2", 112)["train"] / 1e12
    assert achieved == pytest.approx(2.4004, abs=1e-4)
    assert mfu(achieved, peak_on(monkeypatch, "NVIDIA H100 80GB HBM3", "bf16-mixed")) == pytest.approx(
        2.4004032 / 989.4
    )

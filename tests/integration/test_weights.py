"""Pretrained weights (``--model.weights``) and fine-tuning the head alone (``--model.freeze_backbone``): a state-dict
file into a network of another head size or channel count, the one-line refusals, torchvision's weights offline
(download monkeypatched: these tests never touch the network), and a fine-tuning run whose checkpoint serves test and
predict once the weights file is gone."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from lightning.pytorch import Callback, LightningModule, Trainer
from PIL import Image

from project.__main__ import main
from project.model import ImageClassifier
from project.nets import build_network, classifier_head
from project.toolkit.errors import ProjectError
from tests.integration.test_strategy_runs import run_project
from tests.support.image_folders import image_folder
from tests.support.runs import one_error_line
from tests.support.user_nets import sequential_convnet

USER_NET = "tests.support.user_nets.sequential_convnet"


def saved_state(tmp_path: Path, arch: str, num_classes: int = 1000, name: str = "weights.pt") -> dict:
    """Save the state dict of a freshly built ``arch`` (random, like any pretrained file to these tests) to
    ``tmp_path / name``; returns it."""
    torch.manual_seed(123)
    state = build_network(arch, num_classes).state_dict()
    torch.save(state, tmp_path / name)
    return state


def pretrained_file(tmp_path: Path) -> tuple[Path, dict]:
    """A 1000-class state dict of the tests' small network, BatchNorm statistics far from a fresh network's."""
    net = sequential_convnet(num_classes=1000, in_channels=3)
    for buffer in net.buffers():  # statistics a training BatchNorm would move
        if buffer.is_floating_point():
            buffer.copy_(torch.rand_like(buffer) + 0.5)
    torch.save(net.state_dict(), tmp_path / "pretrained.pt")
    return tmp_path / "pretrained.pt", net.state_dict()


def assert_backbone_equal(state: dict, expected: dict, head: str) -> None:
    for key, value in expected.items():
        if not key.startswith(f"{head}."):
            assert torch.equal(state[key], value), key


@pytest.mark.parametrize(("arch", "head"), [("mobilenet_v2", "classifier.1"), ("resnet18", "fc")])
def test_a_state_dict_of_1000_classes_loads_with_a_fresh_head_of_num_classes(
    tmp_path: Path, arch: str, head: str
) -> None:
    file_state = saved_state(tmp_path, arch)
    net = build_network(arch, num_classes=10, weights=str(tmp_path / "weights.pt"))
    assert classifier_head(net)[0] == head
    state = net.state_dict()
    assert state[f"{head}.weight"].shape == (10, file_state[f"{head}.weight"].shape[1])
    assert_backbone_equal(state, file_state, head)


def test_a_lightning_checkpoint_serves_as_weights(tmp_path: Path) -> None:
    """The file of a ``{"state_dict": ...}`` whose network is the LightningModule's ``net``."""
    model = ImageClassifier(arch=USER_NET, num_classes=4, channels_last=False)
    torch.save({"state_dict": model.state_dict(), "epoch": 3}, tmp_path / "run.ckpt")
    net = build_network(USER_NET, num_classes=4, weights=str(tmp_path / "run.ckpt"))
    for key, value in net.state_dict().items():
        assert torch.equal(value, model.net.state_dict()[key]), key  # the head too: same size, kept


@pytest.mark.parametrize("arch", ["resnet18", USER_NET])
def test_three_channel_weights_serve_grey_images_summed_over_channels(tmp_path: Path, arch: str) -> None:
    file_state = saved_state(tmp_path, arch)
    net = build_network(arch, num_classes=10, in_channels=1, weights=str(tmp_path / "weights.pt"))
    first_conv = "conv1.weight" if arch == "resnet18" else "stem.0.weight"
    assert torch.equal(net.state_dict()[first_conv], file_state[first_conv].sum(dim=1, keepdim=True))
    assert net(torch.randn(2, 1, 32, 32)).shape == (2, 10)


def test_weights_of_another_network_are_one_line_naming_the_file_and_keys(tmp_path: Path) -> None:
    saved_state(tmp_path, "resnet18")
    with pytest.raises(ProjectError) as error:
        build_network("mobilenet_v2", num_classes=10, weights=str(tmp_path / "weights.pt"))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"model.weights={tmp_path / 'weights.pt'} does not fit model.arch=mobilenet_v2 (")
    assert "missing: features.0.0.weight, features.0.1.weight, features.0.1.bias ..." in message
    assert "unexpected: conv1.weight, bn1.weight, bn1.bias ..." in message
    state = sequential_convnet(10, 3).state_dict()
    state["block1.0.weight"] = torch.zeros(16, 8, 5, 5)
    torch.save(state, tmp_path / "other_kernel.pt")
    with pytest.raises(ProjectError, match=r"\(other shape: block1.0.weight \(16, 8, 5, 5\), here \(16, 8, 3, 3\)\)"):
        build_network(USER_NET, num_classes=10, weights=str(tmp_path / "other_kernel.pt"))


@pytest.mark.parametrize(
    ("arch", "weights", "message"),
    [
        (
            USER_NET,
            "DEFAULT",
            f"model.weights=DEFAULT is not a file; model.arch={USER_NET} takes a state-dict file only",
        ),
        (
            "resnet18",
            "IMAGENET1K_V2",
            "is neither a file nor a weight name of resnet18: use one of DEFAULT, IMAGENET1K_V1,",
        ),
        ("resnet18", "missing.pt", "model.weights=missing.pt is neither a file nor a weight name of resnet18"),
    ],
)
def test_weight_names_are_those_of_a_torchvision_arch(arch: str, weights: str, message: str) -> None:
    with pytest.raises(ProjectError) as error:
        build_network(arch, num_classes=10, weights=weights)
    assert message in str(error.value) and "--model.weights=path/to/state_dict.pt" in str(error.value)


def test_a_file_holding_no_state_dict_is_refused(tmp_path: Path) -> None:
    torch.save([1, 2, 3], tmp_path / "list.pt")
    (tmp_path / "text.pt").write_text("not a torch file")
    with pytest.raises(ProjectError, match=r"list.pt holds no state dict; save one with torch.save"):
        build_network(USER_NET, 10, weights=str(tmp_path / "list.pt"))
    with pytest.raises(ProjectError, match=r"text.pt is not a readable state-dict file \("):
        build_network(USER_NET, 10, weights=str(tmp_path / "text.pt"))


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An empty torch.hub cache under ``tmp_path``, and no network: every download attempt is recorded and fails."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    attempts: list[str] = []

    def no_network(url: str, *args: object, **kwargs: object) -> None:
        attempts.append(url)
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    return attempts


def test_torchvision_weights_that_cannot_be_downloaded_are_one_line(offline_hub: list[str], tmp_path: Path) -> None:
    url = torchvision.models.get_model_weights("mobilenet_v2")["DEFAULT"].url
    with pytest.raises(ProjectError) as error:
        build_network("mobilenet_v2", num_classes=10, weights="DEFAULT")
    assert offline_hub == [url]
    assert str(error.value) == (
        f"model.weights=DEFAULT of mobilenet_v2 must be downloaded from {url} into "
        f"{tmp_path / 'torch_home/hub/checkpoints'}, and that failed (no network); put that file there yourself, "
        "or pass a state-dict file: --model.weights=path/to/state_dict.pt"
    )


def test_torchvision_weights_in_the_hub_cache_load_offline(offline_hub: list[str], tmp_path: Path) -> None:
    url = torchvision.models.get_model_weights("mobilenet_v2")["IMAGENET1K_V1"].url
    cache = tmp_path / "torch_home/hub/checkpoints"
    cache.mkdir(parents=True)
    file_state = saved_state(cache, "mobilenet_v2", name=url.rpartition("/")[2])
    net = build_network("mobilenet_v2", num_classes=10, weights="IMAGENET1K_V1")
    assert offline_hub == []
    assert_backbone_equal(net.state_dict(), file_state, "classifier.1")


def test_freeze_backbone_trains_the_head_alone_and_keeps_batchnorm_statistics() -> None:
    model = ImageClassifier(arch="resnet18", num_classes=5, freeze_backbone=True)
    assert [name for name, p in model.named_parameters() if p.requires_grad] == ["net.fc.weight", "net.fc.bias"]
    model.train()
    assert not model.net.bn1.training and not model.net.layer1[0].bn2.training and model.net.fc.training
    model.eval()
    assert not model.net.fc.training
    unfrozen = ImageClassifier(arch="resnet18", num_classes=5).train()
    assert unfrozen.net.bn1.training and all(p.requires_grad for p in unfrozen.parameters())


def test_freeze_backbone_needs_a_linear_head() -> None:
    with pytest.raises(ProjectError, match="model.freeze_backbone=true needs a classifier head .* has none"):
        ImageClassifier(arch="squeezenet1_0", num_classes=5, freeze_backbone=True)


class HeadAtStart(Callback):
    """Keeps the head's weight as training starts (in ``HeadAtStart.weight``)."""

    weight: torch.Tensor | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        type(self).weight = classifier_head(pl_module.net)[1].weight.detach().clone()


def test_fine_tuning_run_trains_the_head_alone_and_its_checkpoint_needs_no_weights_file(
    tiny_args: list[str], tmp_path: Path
) -> None:
    """Through the command line: a 1000-class file into 10 classes, backbone frozen (BatchNorm statistics included),
    then test and predict from the checkpoint after the file is gone."""
    weights, file_state = pretrained_file(tmp_path)
    options = [f"--model.arch={USER_NET}", f"--model.weights={weights}", "--model.freeze_backbone=true"]
    short = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    main(["fit", *tiny_args, *options, *short, f"--trainer.callbacks+={__name__}.HeadAtStart"])

    checkpoint = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    state = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    assert_backbone_equal(state, file_state, "head.2")
    assert state["head.2.weight"].shape == (10, 32) and not torch.equal(state["head.2.weight"], HeadAtStart.weight)
    assert len(checkpoint["optimizer_states"][0]["param_groups"][0]["params"]) == 2  # its weight and bias alone
    assert checkpoint["hyper_parameters"]["weights"] == str(weights)  # what the run started from, on record

    weights.unlink()
    for command in ("test", "predict"):  # the options given again (one config for all commands) or left out
        main([command, *tiny_args, "--ckpt_path=last", *(options if command == "test" else [])])
    assert (tmp_path / "lightning_logs/version_0/predictions.csv").is_file()


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("--model.weights=missing.pt", "model.weights=missing.pt is neither a file nor a weight name of resnet18"),
        (f"--model.arch={USER_NET} --model.weights=DEFAULT", "takes a state-dict file only"),
        ("--model.freeze_backbone=maybe", "freeze_backbone"),
    ],
)
def test_bad_values_on_the_command_line_are_one_line(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, argument: str, message: str
) -> None:
    line = one_error_line("fit", [*tiny_args, "--model.arch=resnet18", *argument.split()], capsys)
    assert message in line, line
    assert not (tmp_path / "lightning_logs").exists()


def test_a_failed_download_on_the_command_line_is_one_line(
    tiny_args: list[str], capsys: pytest.CaptureFixture, offline_hub: list[str]
) -> None:
    line = one_error_line("fit", [*tiny_args, "--model.arch=mobilenet_v2", "--model.weights=DEFAULT"], capsys)
    assert "must be downloaded from https://download.pytorch.org/models/mobilenet_v2-" in line
    assert "(no network)" in line and line.endswith("--model.weights=path/to/state_dict.pt")


@pytest.mark.slow
def test_fine_tuning_under_ddp_keeps_the_backbone_and_pipeline_refuses_in_one_line(
    tiny_args: list[str], tmp_path: Path
) -> None:
    weights, file_state = pretrained_file(tmp_path)
    options = [f"--model.arch={USER_NET}", f"--model.weights={weights}", "--model.freeze_backbone=true"]
    common = [*tiny_args, *options, "--trainer.devices=2", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]
    run_project("fit", *common, "--trainer.strategy=ddp", "--trainer.limit_val_batches=1", cwd=tmp_path)
    checkpoint = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    state = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    assert_backbone_equal(state, file_state, "head.2")
    assert state["head.2.weight"].shape == (10, 32)

    err = run_project("fit", *common, "--trainer.strategy=pipeline", cwd=tmp_path, expect=2)
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: pipeline stage(s) [0] would have no parameter to train (a frozen backbone: "
        "--model.freeze_backbone=true?); train it on one device, ddp or fsdp"
    ]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error:")


def test_a_torchvision_weight_name_sets_the_datas_preprocessing_unless_given(
    offline_hub: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    weights = torchvision.models.get_model_weights("mobilenet_v2")["IMAGENET1K_V1"]
    cache = tmp_path / "torch_home/hub/checkpoints"  # the download replaced by a local state dict of that name
    cache.mkdir(parents=True)
    saved_state(cache, "mobilenet_v2", name=weights.url.rpartition("/")[2])
    root = image_folder(tmp_path / "photos", train=4, test=2)
    run = ["fit", "--data=project.data.ImageFolderDataModule", f"--data.data_dir={root}", "--data.batch_size=4",
           "--data.val_size=2", "--model.arch=mobilenet_v2", "--trainer.fast_dev_run=true",
           "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    imagenet = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}

    data = main([*run, "--model.weights=IMAGENET1K_V1"]).trainer.datamodule
    options = {key: data.hparams[key] for key in ("image_size", "resize_size", "interpolation", "mean", "std")}
    assert options == {"image_size": 224, "resize_size": 256, "interpolation": "bilinear", **imagenet}
    assert data.channel_stats == (tuple(imagenet["mean"]), tuple(imagenet["std"]))
    assert (
        "model.weights=IMAGENET1K_V1 of mobilenet_v2: the data as its weights expect: data.image_size=224, "
        "data.resize_size=256, data.mean=[0.485, 0.456, 0.406], data.std=[0.229, 0.224, 0.225], "
        "data.interpolation=bilinear\n"
    ) in capsys.readouterr().err
    val = data._datasets["val"]  # an evaluated file: the weights' own transforms of it (resize 256, centre 224)
    photo = torch.from_numpy(np.array(Image.open(val.images.paths[0]).convert("RGB"))).permute(2, 0, 1)
    grey_level = 1 / (255 * min(imagenet["std"]))  # its uint8 resize rounds some pixels the other way
    torch.testing.assert_close(val[0][0], weights.transforms()(photo), rtol=0, atol=grey_level + 1e-5)

    given = ["--data.image_size=32", "--data.mean=[0.5,0.5,0.5]", "--data.std=[0.25,0.25,0.25]"]
    data = main([*run, "--model.weights=IMAGENET1K_V1", *given]).trainer.datamodule
    assert (data.hparams.image_size, data.hparams.resize_size, data.hparams.mean) == (32, None, [0.5] * 3)
    assert (
        "the data as its weights expect: data.interpolation=bilinear; left as set: data.image_size, data.mean, "
        "data.resize_size, data.std\n"
    ) in capsys.readouterr().err

    saved_state(tmp_path, "mobilenet_v2")  # a state-dict file: the data's options as they are
    data = main([*run, f"--model.weights={tmp_path / 'weights.pt'}"]).trainer.datamodule
    assert (data.hparams.image_size, data.hparams.resize_size) == (112, None)
    assert data.hparams.mean != imagenet["mean"]  # measured on the photos
    assert "as its weights expect" not in capsys.readouterr().err

"""The blocks a network splits into for fsdp and pipeline: torchvision's (declared in project/nets.py), an
nn.Sequential's (the default), a network's own declaration, the refusals; and the view through which
strategies run a module's steps without writing on it. All in this process."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torchvision.models import mobilenet_v2, resnet18

from project.__main__ import main
from project.model import ImageClassifier
from project.nets import network_blocks
from project.toolkit.blocks import as_blocks, check_covers, module_blocks
from project.toolkit.errors import ProjectError
from project.toolkit.strategies.contract import module_view
from tests.support.user_nets import DeclaredNet, TwoPartNet, sequential_convnet


def _chained(blocks: list, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block.module(x)
    return x


@pytest.mark.parametrize(
    "build, first, last",
    [
        (resnet18, ("stem", ("conv1", "bn1", "relu", "maxpool")), ("fc", ("avgpool", "fc"))),
        (mobilenet_v2, ("features.0", ("features.0",)), ("classifier", ("classifier",))),
        (sequential_convnet, ("stem", ("stem",)), ("head", ("head",))),  # the default: a Sequential's children
    ],
    ids=["resnet18", "mobilenet_v2", "user-sequential"],
)
def test_declared_blocks_are_the_networks_own_modules_and_chain_to_its_forward(
    build: type, first: tuple, last: tuple
) -> None:
    net = build(num_classes=10, **({"in_channels": 3} if build is sequential_convnet else {})).eval()
    blocks = as_blocks(net, network_blocks(net), "pipeline")
    assert ((blocks[0].name, blocks[0].paths), (blocks[-1].name, blocks[-1].paths)) == (first, last)
    check_covers(net, blocks, "pipeline")  # every parameter in a block ...
    names = {id(p): name for name, p in net.named_parameters()}
    for block in blocks:  # ... under the network's own name, below one of the block's paths
        assert all(
            names[id(p)].startswith(tuple(f"{path}." for path in block.paths)) for p in block.module.parameters()
        )
    assert sum(b.parameter_count for b in blocks) == sum(p.numel() for p in net.parameters())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(_chained(blocks, x), net(x))


def test_a_network_may_declare_its_own_blocks_and_the_module_passes_them_on() -> None:
    model = ImageClassifier(arch="tests.support.user_nets.declared_net", channels_last=False).eval()
    assert isinstance(model.net, DeclaredNet)
    blocks = module_blocks(model, "fsdp")
    assert [(b.name, b.paths) for b in blocks] == [
        ("features.0", ("features.0",)),
        ("features.1", ("features.1",)),
        ("classifier", ("classifier",)),
    ]
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(_chained(blocks, x), model.net(x))


@pytest.mark.parametrize("strategy", ["fsdp", "pipeline"])
def test_a_network_that_declares_no_blocks_is_refused_in_one_line(strategy: str) -> None:
    model = ImageClassifier(arch="tests.support.user_nets.undeclared_net")
    assert network_blocks(model.net) is None
    with pytest.raises(ProjectError) as error:
        module_blocks(model, strategy)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"--trainer.strategy={strategy} splits the network into blocks, and TwoPartNet declares")
    assert "nn.Sequential" in message and "network_blocks()" in message


@pytest.mark.parametrize(
    "declare, message",
    [
        (lambda net: [], "must be a non-empty list of (name, nn.Module) pairs"),
        (lambda net: [("a", net.features), ("a", net.classifier)], "need distinct, non-empty names; repeated or empty"),
        (
            lambda net: [("a", net.features), ("b", nn.Linear(16, 10))],
            "'b' holds a parameter that is not the network's",
        ),
        (lambda net: [("a", net.features), ("b", net.features[1])], "'a' and 'b' share the parameter features.1.0"),
    ],
    ids=["empty", "repeated-name", "copy", "shared"],
)
def test_a_malformed_declaration_is_refused_naming_what_is_wrong(declare: object, message: str) -> None:
    net = TwoPartNet(num_classes=10, in_channels=3)
    with pytest.raises(ProjectError, match="--trainer.strategy=fsdp: the blocks TwoPartNet declares") as error:
        as_blocks(net, declare(net), "fsdp")
    assert message in str(error.value)


def test_pipeline_refuses_blocks_that_leave_parameters_out() -> None:
    net = TwoPartNet(num_classes=10, in_channels=3)
    blocks = as_blocks(net, [("features", net.features)], "pipeline")
    with pytest.raises(ProjectError, match="leave out the parameters classifier.weight, classifier.bias"):
        check_covers(net, blocks, "pipeline")


def test_fsdp_refuses_an_undeclared_network_at_setup_in_one_line(
    tiny_args: list[str], capsys: pytest.CaptureFixture
) -> None:
    environment = dict(os.environ)
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["fit", *tiny_args, "--trainer.strategy=fsdp", "--model.arch=tests.support.user_nets.undeclared_net"])
    finally:
        if dist.is_initialized():  # the one-process group fsdp set up in this process
            dist.destroy_process_group()
        # and what Lightning set for it (LOCAL_RANK, MASTER_PORT, ...): a later run's launcher would take
        # LOCAL_RANK for a process started by someone else, and start no other process
        os.environ.clear()
        os.environ.update(environment)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert [line for line in err if line.startswith("error:") or "Traceback" in line] == [err[-1]]
    assert err[-1].startswith("error: --trainer.strategy=fsdp splits the network into blocks, and TwoPartNet")


def test_a_view_replaces_what_the_strategy_needs_and_leaves_the_module_as_it_was() -> None:
    model = ImageClassifier(arch="tests.support.user_nets.sequential_convnet")
    before = dict(vars(model))
    wrapped = nn.Sequential(model.net)
    view = module_view(model, net=wrapped, training_loss=lambda images, labels: ("loss", labels))
    assert view.net is wrapped and view.training_loss(None, 3) == ("loss", 3) and isinstance(view, ImageClassifier)
    assert model.net is not wrapped and model.training_loss.__func__ is ImageClassifier.training_loss
    view.some_state = 1  # what a step writes lands on the module's own state, the one the loggers read
    assert model.some_state == 1
    del model.some_state
    assert vars(model) == before and type(model) is ImageClassifier
    assert list(view.state_dict()) == list(model.state_dict())  # the network's own keys, not the wrapper's

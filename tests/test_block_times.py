"""The blocks' timing after a single-device fit (project/toolkit/plan/block_times.py): what it measures,
that it leaves the network as it was, and that a fit records it beside the network's units."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

from project.__main__ import main
from project.toolkit.plan.block_times import block_seconds


def test_times_every_block_at_both_sizes_and_leaves_the_network_as_it_was() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Dropout(0.5), nn.Flatten(), nn.Linear(8 * 64, 4)
    )
    net(torch.randn(4, 3, 8, 8)).sum().backward()  # gradients the run had
    grads = [p.grad.clone() for p in net.parameters()]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    images = torch.randn(16, 3, 8, 8)
    rng = torch.get_rng_state()

    times = block_seconds(list(net), images, lambda x: x, time.perf_counter)

    assert times["batch_sizes"] == [16, 4]
    for kind in ("forward", "backward"):
        assert [len(row) for row in times[kind]] == [5, 5]
        assert all(t >= 0 for row in times[kind] for t in row) and sum(times[kind][0]) > 0
    for key, value in net.state_dict().items():  # BatchNorm's running statistics included
        assert torch.equal(value, state[key]), key
    assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), grads, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)  # the dropout's draws did not move the run's generator


def test_a_batch_too_small_to_split_is_timed_at_its_size_only() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    assert block_seconds(list(net), torch.randn(6, 4), lambda x: x, time.perf_counter)["batch_sizes"] == [6]


def test_a_single_device_fit_times_its_declared_blocks(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", *tiny_args, "--model.arch=resnet18", "--trainer.max_epochs=1", "--trainer.limit_train_batches=3"])
    timing = json.loads(next(tmp_path.glob("lightning_logs/version_*/timing.json")).read_text())
    network = timing["network"]
    names = [unit[0] for unit in network["units"]]
    assert names[0] == "stem" and names[-1] == "fc" and len(names) == 10  # ResNet18's declared blocks
    times = network["block_seconds"]
    assert times["batch_sizes"] == [20, 5]  # tiny_args' batch and a quarter of it
    assert all(len(row) == len(names) for row in times["forward"] + times["backward"])
    assert sum(times["backward"][0]) > 0


def test_the_timing_can_be_switched_off(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", *tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--timing.block_times=false"])
    timing = json.loads(next(tmp_path.glob("lightning_logs/version_*/timing.json")).read_text())
    assert "units" in timing["network"] and "block_seconds" not in timing["network"]

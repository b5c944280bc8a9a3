"""The blocks' timing after a single-device fit (project/tools/plan/block_times.py): what it measures, that it leaves
the network as it was, and that a fit given the BlockTimes callback writes it beside its timing.json, and only then."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from lightning.pytorch import LightningModule
from torch import nn

from project.__main__ import main
from project.tools.plan import read_run
from project.tools.plan.block_times import block_seconds, probe_after_fit
from tests.conftest import quiet_trainer


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


def test_nothing_is_timed_but_a_single_device_fit_of_declared_blocks(tmp_path: Path) -> None:
    declared, undeclared = LightningModule(), LightningModule()
    declared.net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())  # an nn.Sequential's children are its blocks
    undeclared.net = nn.Linear(4, 4)
    like = ((8, 4), (4, 1), torch.float32)
    single = quiet_trainer(tmp_path, devices=1)
    assert probe_after_fit(single, declared, like)["batch_sizes"] == [8, 2]
    assert probe_after_fit(single, declared, None) is None  # no training batch seen
    assert probe_after_fit(single, undeclared, like) is None
    assert probe_after_fit(quiet_trainer(tmp_path, devices=2, strategy="ddp"), declared, like) is None


FIT = ["--model.arch=tests.support.user_nets.sequential_convnet", "--trainer.max_epochs=1"]
FIT += ["--trainer.limit_train_batches=4"]
FIT += ["--trainer.limit_val_batches=1", "--timing.warmup_iterations=1", "--timing.anatomy_steps=2"]  # what plan reads


def test_the_callback_writes_the_blocks_times_beside_timing_json_and_plan_reads_them(
    tiny_args: list[str], tmp_path: Path
) -> None:
    main(["fit", *tiny_args, *FIT, "--trainer.callbacks+=project.tools.plan.block_times.BlockTimes"])
    run = next(tmp_path.glob("lightning_logs/version_*"))
    names = [unit[0] for unit in json.loads((run / "timing.json").read_text())["network"]["units"]]
    assert names == ["stem", "block1", "block2", "head"]  # the network's declared blocks
    times = json.loads((run / "block_times.json").read_text())
    assert times["batch_sizes"] == [20, 5]  # tiny_args' batch and a quarter of it
    assert all(len(row) == len(names) for row in times["forward"] + times["backward"])
    assert sum(times["backward"][0]) > 0
    assert read_run(run).block_seconds == times


def test_a_fit_without_the_callback_times_no_blocks(tiny_args: list[str], tmp_path: Path) -> None:
    main(["fit", *tiny_args, *FIT])
    run = next(tmp_path.glob("lightning_logs/version_*"))
    assert (run / "timing.json").is_file() and not (run / "block_times.json").exists()
    assert read_run(run).block_seconds is None

"""``pipeline``: the split of a network into stages (balanced, named, refused), the consolidated
checkpoint's key names, the pipeline's arithmetic with micro-batches and its bubble meter, in this
process; and one end-to-end check of 2-process runs (gloo) against a single device, slow."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torchvision.models import mobilenet_v2, resnet18, resnet50

from project.__main__ import main
from project.model import ImageClassifier
from project.nets import network_blocks
from project.toolkit.blocks import Block, as_blocks
from project.toolkit.errors import ProjectError
from project.toolkit.strategies.pipeline import SCHEDULES, PipelineStrategy
from project.toolkit.strategies.stages import block_costs, build_stage, plan_split, release_other_stages
from project.toolkit.timing.bubble import BubbleMeter
from tests.integration.test_strategies import one_process_group, recorded, recorder_args  # noqa: F401 (a fixture)
from tests.integration.test_strategy_runs import REPO, evaluate, run_project

# --------------------------------------------------------------------------- the split


def blocks_of(net: nn.Module) -> list[Block]:
    """The blocks the template's hook declares for ``net``, as the strategies take them."""
    return as_blocks(net, network_blocks(net), "pipeline")


@pytest.mark.parametrize("build", [resnet50, mobilenet_v2], ids=["resnet50", "mobilenet_v2"])
@pytest.mark.parametrize("image_size", [32, None], ids=["flops", "parameters"])
def test_automatic_split_is_balanced(build: type, image_size: int | None) -> None:
    net = build(num_classes=10)
    blocks = blocks_of(net)
    costs = block_costs(blocks, image_size)
    stages = plan_split(blocks, costs, 2, None)
    assert [b for stage in stages for b in stage] == blocks  # every block once, in order
    stage_costs = [sum(costs[blocks.index(b)] for b in stage) for stage in stages]
    mean = sum(stage_costs) / 2
    assert max(stage_costs) <= 1.5 * mean, stage_costs


def test_named_split_gives_the_materials_resnet50_layer1_2_and_layer3_4_stages() -> None:
    net = resnet50(num_classes=10)
    blocks = blocks_of(net)
    first, second = plan_split(blocks, [1.0] * len(blocks), 2, "layer3")
    assert [b.name for b in first] == ["stem", "layer1.0", "layer1.1", "layer1.2", *(f"layer2.{i}" for i in range(4))]
    assert second[0].name == "layer3.0" and second[-1].name == "fc"
    three = plan_split(blocks, [1.0] * len(blocks), 3, "layer2.1, layer4")
    assert [stage[0].name for stage in three] == ["stem", "layer2.1", "layer4.0"]


@pytest.mark.parametrize(
    "split, stages, message",
    [
        ("layer9", 2, "'layer9' is not a block a later stage can start at; choose from: layer1.0"),
        ("stem", 2, "'stem' is not a block a later stage can start at"),
        ("layer2,layer3", 2, "names 2 block(s), but 2 stages (devices) need 1"),
        ("layer3,layer2", 3, "must be named in the network's order"),
    ],
)
def test_a_bad_split_is_refused_naming_what_is_allowed(split: str, stages: int, message: str) -> None:
    blocks = blocks_of(resnet50(num_classes=10))
    with pytest.raises(ProjectError, match=f"trainer.strategy.split={split!r}.*") as err:
        plan_split(blocks, [1.0] * len(blocks), stages, split)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"micro_batches": 0}, "trainer.strategy.micro_batches=0 is not allowed"),
        ({"schedule": "zigzag"}, "trainer.strategy.schedule='zigzag' is not a schedule; choose one of: gpipe, 1f1b"),
    ],
)
def test_bad_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ProjectError, match=message):
        PipelineStrategy(**options)


def test_a_batch_that_does_not_split_into_micro_batches_is_refused() -> None:
    with pytest.raises(ProjectError, match="a batch of 6 images does not split into trainer.strategy.micro_batches=4"):
        PipelineStrategy(micro_batches=4)._training_loss(torch.zeros(6, 3, 8, 8), torch.zeros(6, dtype=torch.long))


def test_a_training_step_returning_another_loss_than_the_schedules_is_refused() -> None:
    strategy = PipelineStrategy(micro_batches=1)
    strategy.module_view = SimpleNamespace(training_step=lambda batch, batch_idx: torch.tensor(2.0))
    with pytest.raises(ProjectError, match=r"trains the loss `training_loss\(images, labels\)` returns, as is"):
        strategy.training_step((torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.long)), 0)


def test_one_device_is_refused_in_one_line(tiny_args: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *tiny_args, "--trainer.strategy=pipeline", "--trainer.max_epochs=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert err[0].startswith("error: --trainer.strategy=pipeline splits the network across 2 or more devices; this run")


# --------------------------------------------------------------------------- each rank's share


@pytest.mark.parametrize("build", [resnet18, mobilenet_v2], ids=["resnet18", "mobilenet_v2"])
def test_each_stage_holds_only_its_blocks_and_their_union_is_the_network_under_its_own_names(build: type) -> None:
    net = build(num_classes=10)
    full = net.state_dict()
    blocks = blocks_of(net)
    costs = block_costs(blocks, None)
    stages = plan_split(blocks, costs, 2, None)
    parts = []
    for rank in range(2):  # what each rank keeps, of its own copy of the network
        copy_ = copy.deepcopy(net)
        copy_blocks = blocks_of(copy_)
        own = plan_split(copy_blocks, costs, 2, None)[rank]
        stage = build_stage(own, lambda x: x, is_last=rank == 1)
        release_other_stages(copy_, copy_blocks, own)
        parts.append(copy_.state_dict())
        assert {id(p) for p in stage.parameters()} == {id(p) for p in copy_.parameters()}  # the stage trains them
    assert not set(parts[0]) & set(parts[1])  # no parameter or buffer on both ranks
    assert sum(p.numel() for part in parts for p in part.values()) == sum(p.numel() for p in full.values())
    merged = {**parts[0], **parts[1]}
    assert set(merged) == set(full) and all(torch.equal(merged[k], full[k]) for k in full)
    # the stages chained compute what the network does
    net.eval()
    x = torch.randn(2, 3, 32, 32)
    chained = x
    for own in stages:
        chained = build_stage(own, lambda t: t, is_last=own is stages[-1]).eval()(chained)
    torch.testing.assert_close(chained, net(x))


# --------------------------------------------------------------------------- micro-batches and the bubble


def _stage_with_batchnorm() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("frozen_batchnorm", [True, False], ids=["batchnorm-frozen", "batchnorm-training"])
def test_micro_batches_give_the_gradients_of_the_batch_mean_loss_unless_batchnorm_trains(
    one_process_group: object,  # noqa: F811 (the fixture, imported)
    frozen_batchnorm: bool,
    schedule: str,
) -> None:
    """What ``micro_batches > 1`` changes, in a one-stage pipeline: the schedule divides the summed
    micro-batch gradients by their number, which is the gradient of the whole batch's mean loss, exactly
    so where BatchNorm uses fixed statistics; a training BatchNorm normalises each micro-batch by its own
    statistics, so the gradients differ (and the running statistics are updated once per micro-batch)."""
    images, labels = torch.randn(8, 3, 8, 8), torch.arange(8) % 3
    whole, piped = _stage_with_batchnorm(), _stage_with_batchnorm()
    for module in (whole, piped):
        module.train()
        if frozen_batchnorm:
            module[1].eval()
    nn.functional.cross_entropy(whole(images), labels).backward()
    losses: list[torch.Tensor] = []
    stage = PipelineStage(piped, 0, 1, torch.device("cpu"))
    SCHEDULES[schedule](stage, n_microbatches=4, loss_fn=nn.functional.cross_entropy).step(
        images, target=labels, losses=losses
    )
    assert len(losses) == 4
    close = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(_grads(whole), _grads(piped), strict=True))
    assert close == frozen_batchnorm


def test_bubble_is_the_share_of_step_time_outside_the_stages_compute() -> None:
    meter = BubbleMeter(torch.device("cpu"))
    # the first step (left out), then one of 10 s with 2 s of compute, twice: start, compute x 2, end
    ticks = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0, 13.0, 14.0, 16.0, 20.0])
    meter._mark = lambda: next(ticks)  # type: ignore[method-assign]
    compute = meter.timed_loss(lambda: None)  # timed as compute, as each stage's forward and backward are
    for _ in range(2):
        meter.step(lambda: (compute(), compute()))
    assert meter.fraction("epoch") == pytest.approx(1 - 4 / 10)
    assert meter.fraction("epoch") is None  # a new epoch, no step yet
    assert meter.fraction("fit") == pytest.approx(0.6)


# --------------------------------------------------------------------------- 2 processes, end to end


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow
def test_pipeline_runs_match_one_device_resume_exactly_and_serve_a_single_device(
    tiny_args: list[str], tmp_path: Path
) -> None:
    """One pipeline fit (ResNet18, 2 processes, micro_batches=1) against a single-device fit of the same seed, a
    pipeline run resumed from the first epoch's checkpoint, and a single-device test of the last one."""
    common = [
        *tiny_args,
        # No dropout (MobileNetV2 has some): its masks are drawn on the last stage's process, whose random
        # stream also feeds the pipeline's first-step shape inference, so they differ from one device's.
        "--model.arch=resnet18",
        "--data.val_size=41",  # as evaluate() splits the data
        "--trainer.max_epochs=2",
        "--trainer.limit_train_batches=2",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.deterministic=true",
        "--model.lr=0.02",  # 0.1 (for batch 256) diverges at batch 20, which would magnify rounding differences
        "--checkpoint.save_top_k=-1",  # every epoch's checkpoint: the first is the mid-run one
        "--precise_bn.enabled=false",  # recomputed on one device, skipped under pipeline: the statistics would differ
    ]
    pipeline = [f"--config={REPO / 'configs' / 'strategy' / 'pipeline.yaml'}", "--trainer.strategy.micro_batches=1"]
    pipeline += ["--trainer.devices=2"]
    single, piped, resumed = tmp_path / "single", tmp_path / "piped", tmp_path / "resumed"
    # One thread per process in both runs (Lightning would give each of the pipeline's processes half the
    # cores, and one device all of them): a different thread count may sum a convolution's terms in
    # another order, and over a few steps of a freshly initialised network such last-bit differences grew
    # to 2e-3 relative here. With the same count the runs do the same arithmetic.
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}
    run_project(
        "fit",
        *common,
        f"--trainer.default_root_dir={single}",
        *recorder_args(single / "rec"),
        cwd=tmp_path,
        env=one_thread,
    )
    run_project(
        "fit",
        *common,
        *pipeline,
        f"--trainer.default_root_dir={piped}",
        *recorder_args(piped / "rec"),
        cwd=tmp_path,
        env=one_thread,
    )
    checkpoints = piped / "lightning_logs" / "version_0" / "checkpoints"
    first_epoch = next(checkpoints.glob("epoch000-*.ckpt"))
    run_project(
        "fit", *common, *pipeline, f"--trainer.default_root_dir={resumed}", f"--ckpt_path={first_epoch}", cwd=tmp_path
    )
    last = checkpoints / "last.ckpt"
    run_project(
        "test",
        *tiny_args,
        f"--trainer.default_root_dir={piped}",
        "--ckpt_path=last",
        *recorder_args(piped / "test"),
        cwd=tmp_path,
    )

    # micro_batches=1 is the single-device computation, stage after stage: the same kernels on the same
    # batches, on as many threads, give the same losses and weights, to the last bit.
    reference, ranks = recorded(single / "rec", "fit"), [recorded(piped / "rec", "fit", r) for r in (0, 1)]
    assert ranks[0]["losses"] == reference["losses"] and len(reference["losses"]) == 4
    assert ranks[1]["losses"] == ranks[0]["losses"]  # the last stage's loss, broadcast to every rank
    expected, got = _weights(single / "lightning_logs/version_0/checkpoints/last.ckpt"), _weights(last)
    assert list(got) == list(expected)  # one consolidated file, the network's own key names and order
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)
    # each rank held and trained only its stage's parameters; together, the network
    local = [r["params"]["local"] for r in ranks]
    assert all(0 < n < reference["params"]["local"] for n in local) and sum(local) == reference["params"]["local"]
    assert all(r["batch_sizes"] == [20] * 4 for r in ranks)  # every stage read the whole global batch

    # metrics are right and logged once: val of the last epoch equals a one-process evaluation of last.ckpt
    assert {k: ranks[0]["metrics"][k] for k in ("val/acc", "val/loss")} == pytest.approx(
        evaluate(last, "val"), rel=1e-5
    )
    timing = json.loads((piped / "lightning_logs/version_0/timing.json").read_text())
    assert [e["samples"] for e in timing["epochs"]] == [40, 40]  # each sample counted once, not per stage
    assert len(timing["bubble_fraction"]) == 2 and all(0 <= b < 1 for b in timing["bubble_fraction"])
    # the split ResNet18 declares in project/nets.py, balanced over the 2 stages, as each rank held it
    stages = timing["parallel_plan"]["stages"]
    names = [name for stage in stages for name in stage["blocks"]]
    assert len(names) == 10 and (names[0], names[-1]) == ("stem", "fc")
    assert [stage["parameters"] for stage in stages] == local and timing["parallel_plan"]["split_by"] == "flops"
    # the pipeline's loss and forward ran in its view of the module: nothing written on the module itself
    assert all(r["module_writes"] and all(writes == [] for writes in r["module_writes"]) for r in ranks)

    # resumed from the first epoch's checkpoint: the weights of the unbroken run
    resumed_weights = _weights(resumed / "lightning_logs/version_0/checkpoints/last.ckpt")
    for key, value in _weights(last).items():
        torch.testing.assert_close(resumed_weights[key], value, rtol=0, atol=0, msg=key)

    # the pipeline's last.ckpt on one device, without the strategy
    test_metrics = recorded(piped / "test", "test")["metrics"]
    assert {k: test_metrics[k] for k in ("test/acc", "test/loss")} == pytest.approx(evaluate(last, "test"), rel=1e-5)


class MixupLikeClassifier(ImageClassifier):
    """A training step as mixup writes it: the loss of ``self(images)``, not of ``training_loss``."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        return self.criterion(self(images), labels)


class RegularisedClassifier(ImageClassifier):
    """A regulariser added to the loss ``training_loss`` gave."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        penalty = sum(p.square().sum() for p in self.parameters())
        return super().training_step(batch, batch_idx) + 1e-4 * penalty


@pytest.mark.slow
@pytest.mark.parametrize("module", [MixupLikeClassifier, RegularisedClassifier], ids=["self-images", "regulariser"])
def test_a_loss_the_pipeline_would_not_train_is_one_error_line(
    module: type, tiny_args: list[str], tmp_path: Path
) -> None:
    """The pipeline's schedule runs the backward of ``training_loss``'s loss itself: a step that returns another
    one is refused on every rank in one line, not trained as if it were the schedule's (or not at all)."""
    script = tmp_path / "train.py"  # the toolkit's command line with a user's module, as a launcher reruns it
    script.write_text(f"from project.toolkit.cli import main\nmain(model='{__name__}.{module.__name__}')\n")
    args = [*tiny_args, "--trainer.strategy=pipeline", "--trainer.devices=2", "--trainer.max_epochs=1"]
    args += ["--trainer.limit_train_batches=2", "--trainer.num_sanity_val_steps=0", "--model.arch=resnet18"]
    done = subprocess.run(
        [sys.executable, str(script), "fit", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert f"{module.__name__}.training_step returned another" in errors[0] and "in criterion, or ddp" in errors[0]

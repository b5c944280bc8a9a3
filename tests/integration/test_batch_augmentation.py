"""MixUp and CutMix (``--data.batch_augmentation``): each training batch mixed with itself rolled by one image, its
labels made class probabilities, the same on both input paths and as a function of (seed, epoch, batch), so a resume
sees the unbroken run's batches; the loss takes the soft targets (label smoothing too), train accuracy the likeliest
class; evaluation and precise BatchNorm are never mixed; ddp and pipeline train with it (slow); bad values refused."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn

from project.__main__ import main
from project.model import ImageClassifier
from project.toolkit.data.batch_mixing import BatchMixing
from project.toolkit.data.samplers import EpochIndex
from tests.integration.test_host_waits import OpsSeen
from tests.integration.test_performance import HostReads
from tests.integration.test_strategy_runs import REPO, run_project
from tests.support.data_modules import attach, make_dm, on_device_batches
from tests.support.runs import one_error_line

KINDS = ("mixup", "cutmix", "mixup_or_cutmix")


def modules(cifar_root: Path, kind: str, **options: Any) -> list:
    """The DataLoader path's and the on-device path's data modules with ``batch_augmentation=kind``, set up."""
    dms = [attach(make_dm(cifar_root, on_device=flag, batch_augmentation=kind, **options)) for flag in (False, True)]
    for dm in dms:
        dm.setup("fit")
        dm.setup("test")
    return dms


def train_batches(dm: Any, epoch: int, batches_done: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What the training step gets in ``epoch`` (from its ``batches_done``-th batch, as a resumed run)."""
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    if batches_done:
        loader.sampler.resume_at(epoch, batches_done)
    return on_device_batches(dm, loader, "train") if dm.on_device else list(loader)


def kind_of_mix(mixed: torch.Tensor, soft: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> str:
    """Which mix made ``(mixed, soft)`` of the batch ``(images, labels)``, checked to the pixel and the share:
    MixUp's blend of each image with the previous one, or CutMix's box of the previous one's pixels."""
    previous, one_hot = images.roll(1, 0), F.one_hot(labels, 10).float()
    differ = labels != labels.roll(1)
    assert differ.any()
    share = soft[differ, labels[differ]][0]  # each image's own share, the same for the whole batch
    torch.testing.assert_close(soft, share * one_hot + (1 - share) * one_hot.roll(1, 0))
    box = (mixed != images).any(dim=0).any(dim=0)  # (H, W): where the images took their previous one's pixels
    if torch.equal(mixed, torch.where(box, previous, images)):
        rows, cols = box.any(dim=1).sum(), box.any(dim=0).sum()
        assert rows * cols == box.sum()  # a rectangle
        assert float(box.float().mean()) == pytest.approx(1 - float(share), abs=1e-6)
        return "cutmix"
    torch.testing.assert_close(mixed, share * images + (1 - share) * previous, rtol=0, atol=1e-5)
    return "mixup"


@pytest.mark.parametrize("kind", KINDS)
def test_both_input_paths_give_the_same_mixup_or_cutmix_batches(cifar_root: Path, kind: str) -> None:
    default, on_device = modules(cifar_root, kind)
    plain = modules(cifar_root, "none")[0]
    state = torch.random.get_rng_state()
    mixed, on_device_mixed, unmixed = (train_batches(dm, epoch=2) for dm in (default, on_device, plain))
    assert torch.equal(torch.random.get_rng_state(), state)  # the mixing's seeding leaves torch's as it was
    assert len(mixed) == len(on_device_mixed) == len(unmixed) == 8
    kinds = []
    for (images, soft), (on_device_images, on_device_soft), (originals, labels) in zip(
        mixed, on_device_mixed, unmixed, strict=True
    ):
        assert soft.shape == (20, 10) and soft.dtype == torch.float32
        torch.testing.assert_close(on_device_images, images, rtol=0, atol=1e-6)  # the workers' batch, the device's
        torch.testing.assert_close(on_device_soft, soft, rtol=0, atol=0)
        kinds.append(kind_of_mix(images, soft, originals, labels))
    assert set(kinds) == ({"mixup", "cutmix"} if kind == "mixup_or_cutmix" else {kind})
    assert any(not torch.equal(images, originals) for (images, _), (originals, _) in zip(mixed, unmixed, strict=True))


def test_a_mix_is_a_function_of_seed_epoch_and_batch_whatever_the_workers_or_resume(cifar_root: Path) -> None:
    for dm in modules(cifar_root, "mixup_or_cutmix"):
        whole = train_batches(dm, epoch=3)
        resumed = train_batches(dm, epoch=3, batches_done=5)
        assert len(resumed) == 3
        for (images, soft), (want_images, want_soft) in zip(resumed, whole[5:], strict=True):
            assert torch.equal(images, want_images) and torch.equal(soft, want_soft)
        again, other_epoch = train_batches(dm, epoch=3), train_batches(dm, epoch=4)
        assert all(torch.equal(a[1], b[1]) for a, b in zip(again, whole, strict=True))
        assert not torch.equal(other_epoch[0][1], whole[0][1])
    in_workers = train_batches(modules(cifar_root, "mixup_or_cutmix", num_workers=2)[0], epoch=3)
    for (images, soft), (want_images, want_soft) in zip(in_workers, whole, strict=True):
        torch.testing.assert_close(images, want_images, rtol=0, atol=1e-6)
        assert torch.equal(soft, want_soft)


def test_evaluation_and_precise_batchnorm_batches_are_never_mixed(cifar_root: Path) -> None:
    for mixing, plain in zip(modules(cifar_root, "cutmix"), modules(cifar_root, "none"), strict=True):
        for stage in ("val", "test"):
            loaders = [getattr(dm, f"{stage}_dataloader")() for dm in (mixing, plain)]
            if mixing.on_device:
                got, want = (
                    on_device_batches(dm, loader, stage) for dm, loader in zip((mixing, plain), loaders, strict=True)
                )
            else:
                got, want = (list(loader) for loader in loaders)
            assert len(got) == len(want) > 0
            for (images, labels), (want_images, want_labels) in zip(got, want, strict=True):
                assert labels.dtype == torch.int64 and labels.shape == (len(images),)
                assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        batches = [list(dm.training_batches(epoch=2)) for dm in (mixing, plain)]
        for (images, labels), (want_images, want_labels) in zip(*batches, strict=True):
            assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


@pytest.mark.parametrize("kind", KINDS)
def test_mixing_reads_no_value_of_the_batch_on_the_host(kind: str) -> None:
    # A meta tensor has no values: any host read of the batch (.item(), one_hot's range check off CUDA) would raise.
    images = torch.empty(8, 3, 32, 32, device="meta")
    labels = torch.empty(8, dtype=torch.int64, device="meta")
    mixed, soft = BatchMixing(kind, num_classes=10)(images, labels, EpochIndex(3, seed=0, epoch=1))
    assert mixed.shape == images.shape and soft.shape == (8, 10) and soft.device.type == "meta"


def test_the_loss_takes_the_soft_targets_smoothed_and_accuracy_the_likeliest_class() -> None:
    model = ImageClassifier(arch="tests.support.user_nets.sequential_convnet", label_smoothing=0.1)
    model.net = nn.Flatten()  # the images are the logits: (N, 10, 1, 1) -> (N, 10)
    labels = torch.arange(8)
    one_hot = F.one_hot(labels, 10).float()
    soft = 0.3 * one_hot + 0.7 * one_hot.roll(1, 0)  # each image's likeliest class: its previous one's
    logits = torch.randn(8, 10)
    predicted = torch.tensor([7, 0, 1, 2, 3, 4, 6, 7])  # the likeliest class six times, the own label twice
    logits[torch.arange(8), predicted] += 10
    reads, ops = HostReads(), OpsSeen()
    with reads, ops:
        loss = model.training_step((logits[:, :, None, None], soft), 0)
    assert reads.calls == [] and ops.seen == []  # the step reads nothing on the host
    smoothed = 0.9 * soft + 0.1 / 10
    torch.testing.assert_close(loss, -(smoothed * logits.log_softmax(dim=1)).sum(dim=1).mean())
    assert float(loss) != pytest.approx(float(F.cross_entropy(logits, labels, label_smoothing=0.1)))
    assert float(model.train_acc.compute()) == 0.75


class MixRecorder(Callback):
    """Writes ``<out>/rank<R>.json``: every training batch's (epoch, index), labels, images' sum and loss, the
    evaluation batches' label shapes and the final metrics; with ``crash_at`` fails at that batch of epoch 1."""

    def __init__(self, out: str = "mixes", crash_at: int = -1) -> None:
        self.out, self.crash_at, self.record = Path(out), crash_at, {"train": [], "val_label_shapes": []}

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 1 and batch_idx == self.crash_at:
            raise RuntimeError("simulated crash")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        images, labels = batch
        self.record["train"].append(
            {
                "at": [trainer.current_epoch, batch_idx],
                "labels": labels.tolist(),
                "images": float(images.double().sum()),
                "loss": float(outputs["loss"]),
            }
        )

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, *_: Any) -> None:
        self.record["val_label_shapes"].append(list(batch[1].shape))

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record["metrics"] = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.record))


def mix_records(out: Path, rank: int = 0) -> dict[str, Any]:
    return json.loads((out / f"rank{rank}.json").read_text())


def recorder(out: Path) -> list[str]:
    return [f"--trainer.callbacks+={__name__}.MixRecorder", f"--trainer.callbacks.out={out}"]


def assert_soft(labels: list, batch: int) -> None:
    soft = torch.tensor(labels)
    assert soft.shape == (batch, 10) and soft.dtype == torch.float32
    torch.testing.assert_close(soft.sum(dim=1), torch.ones(batch))
    assert (soft.max(dim=1).values < 1).any()  # some image is a mix of two classes


@pytest.mark.parametrize("on_device", ["true", "false"])
def test_a_fit_trains_on_mixed_batches_and_evaluates_unmixed(
    tiny_args: list[str], tmp_path: Path, on_device: str
) -> None:
    args = ["--data.batch_augmentation=cutmix", "--data.cutmix_alpha=0.5", f"--data.on_device={on_device}"]
    args += ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", *recorder(tmp_path / "mixes")]
    cli = main(["fit", *tiny_args, *args])
    assert cli.datamodule.on_device is (on_device == "true") and cli.datamodule.batch_mixing.kind == "cutmix"
    record = mix_records(tmp_path / "mixes")
    assert len(record["train"]) == 2
    for batch in record["train"]:
        assert_soft(batch["labels"], 20)
    assert record["val_label_shapes"] and all(len(shape) == 1 for shape in record["val_label_shapes"])
    assert 0 <= record["metrics"]["train/acc"] <= 1 and 0 <= record["metrics"]["val/acc"] <= 1


@pytest.mark.slow
def test_a_run_resumed_mid_epoch_mixes_and_trains_as_the_unbroken_one(tiny_args: list[str], tmp_path: Path) -> None:
    common = [*tiny_args, "--data.batch_augmentation=mixup_or_cutmix", "--trainer.max_epochs=2"]
    common += ["--trainer.limit_train_batches=5", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0"]
    common += ["--checkpoint.every_n_train_steps=1"]
    main(["fit", *common, *recorder(tmp_path / "unbroken")])
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["fit", *common, *recorder(tmp_path / "crashed"), "--trainer.callbacks.crash_at=3"])
    main(["fit", *common, *recorder(tmp_path / "resumed"), "--ckpt_path=last"])
    unbroken, resumed = (mix_records(tmp_path / run)["train"] for run in ("unbroken", "resumed"))
    assert [batch["at"] for batch in resumed] == [[1, 3], [1, 4]]  # epoch 1 from its 4th batch on
    assert resumed == unbroken[-2:]  # the same mixed images and soft labels, the same losses


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data.batch_augmentation=mixupp"], "data.batch_augmentation=mixupp is not allowed; expected"),
        (["--data.batch_augmentation=mixup", "--data.mixup_alpha=0"], "data.mixup_alpha=0.0 is not allowed: it must"),
        (["--data.batch_augmentation=cutmix", "--data.cutmix_alpha=-1"], "data.cutmix_alpha=-1.0 is not allowed"),
    ],
)
def test_a_bad_value_is_one_error_line(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    line = one_error_line("fit", [*tiny_args, *args], capsys)
    assert message in line, line
    if "mixupp" in line:  # the allowed values named
        assert all(value in line for value in ("none", *KINDS)), line
    assert not (tmp_path / "lightning_logs").exists()


@pytest.mark.slow
def test_two_process_ddp_mixes_each_shard_of_its_own(tiny_args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "mixes"
    common = [*tiny_args, "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.num_sanity_val_steps=0"]
    common += ["--data.batch_augmentation=mixup_or_cutmix", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]
    run_project("fit", *common, *recorder(out), cwd=tmp_path)
    ranks = [mix_records(out, rank) for rank in (0, 1)]
    for record in ranks:
        assert len(record["train"]) == 2 and all(torch.isfinite(torch.tensor(b["loss"])) for b in record["train"])
        for batch in record["train"]:
            assert_soft(batch["labels"], 10)  # the global batch of 20, split
        assert 0 <= record["metrics"]["train/acc"] <= 1
    assert ranks[0]["train"][0]["labels"] != ranks[1]["train"][0]["labels"]  # disjoint shards, mixed apart


@pytest.mark.slow
def test_pipeline_trains_the_mixed_batches_as_one_device_does(tiny_args: list[str], tmp_path: Path) -> None:
    """The pipeline's schedule computes the loss of ``training_loss(images, labels)`` on its last stage: the soft
    labels flow through it (every stage mixes the same batch), so the losses are one device's to the last bit."""
    common = [*tiny_args, "--model.arch=resnet18", "--model.lr=0.02", "--data.on_device=true"]
    common += ["--data.batch_augmentation=mixup_or_cutmix", "--trainer.max_epochs=1", "--trainer.limit_train_batches=3"]
    common += ["--trainer.num_sanity_val_steps=0", "--trainer.deterministic=true", "--precise_bn.enabled=false"]
    pipeline = [f"--config={REPO / 'configs' / 'strategy' / 'pipeline.yaml'}", "--trainer.strategy.micro_batches=1"]
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}  # as test_pipeline.py: the same arithmetic in both runs
    single, piped = tmp_path / "single", tmp_path / "piped"
    run_project("fit", *common, *recorder(single), f"--trainer.default_root_dir={single}", cwd=tmp_path, env=one_thread)
    run_project(
        "fit",
        *common,
        *pipeline,
        "--trainer.devices=2",
        *recorder(piped),
        f"--trainer.default_root_dir={piped}",
        cwd=tmp_path,
        env=one_thread,
    )
    reference, ranks = mix_records(single), [mix_records(piped, rank) for rank in (0, 1)]
    for batch in reference["train"]:
        assert_soft(batch["labels"], 20)
    for record in ranks:  # every stage read the same batch, mixed alike, and trained the loss of its soft labels
        assert [b["labels"] for b in record["train"]] == [b["labels"] for b in reference["train"]]
        assert [b["loss"] for b in record["train"]] == [b["loss"] for b in reference["train"]]

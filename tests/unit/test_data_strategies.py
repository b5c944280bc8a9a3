"""Unit examples of the data and strategy machinery, moved out of the doctests of ``project/toolkit/data`` and
``project/toolkit/strategies`` (same inputs, same assertions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy, StrategyRegistry
from torch import nn

from project.toolkit.blocks import Block, as_blocks, check_covers, default_blocks, short_count
from project.toolkit.data.augmentation import crop_and_flip, draw_crops_and_flips, rows_of, to_model_input
from project.toolkit.data.datasets import AugmentedImages, ImageArrayDataset, IndexBatches
from project.toolkit.data.declarations import check_declarations, declared_channel_stats
from project.toolkit.data.input_path import InputPath, Machine, choose_input_path, data_wait_advice, memory_budget
from project.toolkit.data.samplers import EpochIndex, EvenBatchSampler, KeyBatches, SliceBatches, TrainingSampler
from project.toolkit.data.statistics import measure_channel_stats
from project.toolkit.errors import ProjectError
from project.toolkit.strategies.contract import check_module, module_view
from project.toolkit.strategies.deepspeed import (
    check_deepspeed_checkpoint,
    check_deepspeed_choice,
    is_deepspeed_strategy,
)
from project.toolkit.strategies.dp import NetWithLoss, check_batch_splits_evenly, data_parallel
from project.toolkit.strategies.fsdp import describe_units
from project.toolkit.strategies.registry import register_strategies
from project.toolkit.strategies.stages import named_starts


def test_draw_crops_and_flips_is_one_cached_table() -> None:
    table = draw_crops_and_flips(seed=0, epoch=3, count=5)
    assert (table.shape, table.dtype.name, bool((table == draw_crops_and_flips(0, 3, 5)).all())) == (
        (5, 3),
        "int64",
        True,
    )


def test_rows_of_gives_a_channels_last_batch() -> None:
    batch = rows_of(torch.zeros(5, 4, 4, 3, dtype=torch.uint8), torch.tensor([4, 0]))
    assert tuple(batch.shape) == (2, 3, 4, 4)
    assert batch.is_contiguous(memory_format=torch.channels_last)


def test_crop_and_flip_shifts_and_flips() -> None:
    image = torch.arange(1, 10, dtype=torch.uint8).reshape(1, 1, 3, 3)
    shifted = crop_and_flip(image, torch.tensor([[0, 0, 0]]), padding=1)[0, 0].tolist()  # shifted down-right
    assert shifted == [[0, 0, 0], [0, 1, 2], [0, 4, 5]]
    flipped = crop_and_flip(image, torch.tensor([[1, 1, 1]]), padding=1)[0, 0].tolist()  # centred, flipped
    assert flipped == [[3, 2, 1], [6, 5, 4], [9, 8, 7]]


def test_to_model_input_resizes_and_normalises() -> None:
    images = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    assert to_model_input(images, 112, (0.5,) * 3, (0.25,) * 3).shape == torch.Size([2, 3, 112, 112])
    white = torch.full((1, 1, 8, 8), 255, dtype=torch.uint8)
    assert to_model_input(white, 4, [0.5], [0.25]).unique().tolist() == [2.0]


def test_image_array_dataset_items() -> None:
    ds = ImageArrayDataset(np.zeros((2, 32, 32, 3), np.uint8), np.array([3, 7]))
    image, label = ds[1]
    assert (tuple(image.shape), label) == ((3, 32, 32), 7)


def test_augmented_images_items() -> None:
    ds = AugmentedImages(np.zeros((3, 32, 32, 1), np.uint8), np.array([3, 7, 1]), 48, mean=[0.5], std=[0.2])
    image, label = ds[EpochIndex(1, seed=0, epoch=0)]
    assert (tuple(image.shape), label) == ((1, 48, 48), 7)


def test_index_batches_collates_a_batch() -> None:
    images, labels = IndexBatches(ImageArrayDataset(np.zeros((3, 32, 32, 3), np.uint8), np.arange(3)))[[0, 2]]
    assert (tuple(images.shape), labels.tolist()) == ((2, 3, 32, 32), [0, 2])


def test_check_declarations_returns_the_declared_statistics() -> None:
    class Grey:
        num_classes, image_shape, mean, std = 10, (28, 28, 1), (0.13,), (0.31,)

    assert repr(check_declarations(Grey)) == "ChannelStats(mean=(0.13,), std=(0.31,))"


def test_declared_channel_stats() -> None:
    assert repr(declared_channel_stats("Grey", [0.5], [0.25], channels=1)) == "ChannelStats(mean=(0.5,), std=(0.25,))"
    assert declared_channel_stats("Grey", None, None, channels=1) is None


def test_measure_channel_stats_of_half_black_half_white() -> None:
    images = np.zeros((2, 1, 2, 1), np.uint8)
    images[1] = 255  # half black, half white: mean 0.5, standard deviation 0.5
    assert repr(measure_channel_stats(images)) == "ChannelStats(mean=(0.5,), std=(0.5,))"


def test_epoch_index_is_an_int_with_its_epoch() -> None:
    key = EpochIndex(7, seed=42, epoch=3)
    assert (key == 7, key.epoch, repr(key)) == (True, 3, "EpochIndex(7, seed=42, epoch=3)")


def test_training_sampler_resumes_mid_epoch() -> None:
    sampler = TrainingSampler(range(6), batch_size=2, num_replicas=1, rank=0, seed=0)
    sampler.set_epoch(1)
    order = list(sampler)
    sampler.resume_at(epoch=1, batches_done=2)
    assert list(sampler) == order[4:]
    assert len(sampler) == 6
    assert repr(order[4]) == "EpochIndex(3, seed=0, epoch=1)"


def test_key_batches_carry_each_images_crop_and_flip() -> None:
    sampler = TrainingSampler(range(5), batch_size=2, num_replicas=1, rank=0, seed=0)
    batches, order, table = KeyBatches(sampler), sampler.shard(), draw_crops_and_flips(0, 0, 5)
    assert len(batches) == 2
    expected = [[[i, *table[i]] for i in order[:2]], [[i, *table[i]] for i in order[2:4]]]
    assert [batch.tolist() for batch in batches] == expected


def test_key_batches_are_views_of_one_table_copied_to_the_device_once_an_epoch() -> None:
    """No copy per step on the on-device path (on a GPU a pageable copy each step may wait for the stream): the
    epoch's table is made on the device, and each batch is a view of it."""
    sampler = TrainingSampler(range(9), batch_size=2, num_replicas=1, rank=0, seed=0)
    batches = list(KeyBatches(sampler, device="meta"))
    assert len(batches) == 4 and all(batch.device.type == "meta" for batch in batches)
    assert [batch.storage_offset() for batch in batches] == [0, 8, 16, 24]  # rows of 4: one tensor's views


def test_even_batch_sampler_gives_every_process_as_many_batches() -> None:
    batches = [list(EvenBatchSampler(range(5), batch_size=2, num_replicas=2, rank=rank)) for rank in (0, 1)]
    assert batches == [[[0, 2], [4]], [[1], [3]]]
    sizes = [[len(batch) for batch in EvenBatchSampler(range(41), 10, num_replicas=2, rank=rank)] for rank in (0, 1)]
    assert sizes == [[10, 10, 1], [10, 9, 1]]


def test_slice_batches() -> None:
    slices = [list(SliceBatches(5, batch_size=2, num_replicas=2, rank=rank)) for rank in (0, 1)]
    assert slices == [[slice(0, 3, 2), slice(4, 5, 2)], [slice(1, 2, 2), slice(3, 4, 2)]]
    assert SliceBatches(5, batch_size=2, num_replicas=2, rank=0).batch_indices() == [[0, 2], [4]]


def test_choose_input_path_on_a_gpu() -> None:
    gpu = Machine("cuda", memory_bytes=80 * 2**30, cpus=16)
    assert choose_input_path("auto", "auto", 180_000_000, gpu).name == "on_device"  # CIFAR-10 on an 80 GB GPU
    big = choose_input_path("auto", "auto", 150 * 10**9, gpu)  # an ImageNet-sized set does not fit
    assert (big.name, big.num_workers, big.reason.split("; ")[0]) == (
        "dataloader",
        4,
        "the data set (150000 MB) is more than 25 % of the cuda device's memory (80 GiB)",
    )
    assert choose_input_path("auto", 2, 180_000_000, gpu).name == "dataloader"  # an explicit value wins


def test_memory_budget_shares_ram_but_not_a_gpu() -> None:
    assert memory_budget(Machine("cpu", memory_bytes=16 * 2**30, cpus=8, processes=2)) / 2**30 == 2.0
    assert memory_budget(Machine("cuda", memory_bytes=16 * 2**30, cpus=8, processes=2)) / 2**30 == 4.0


def test_data_wait_advice() -> None:
    cpu = Machine("cpu", memory_bytes=2**34, cpus=2)
    assert data_wait_advice(0.3, InputPath(False, 2, "data.num_workers=2"), cpu).split("; ") == [
        "training waited for its input 30 % of the epoch time (dataloader, 2 workers)",
        "try --data.on_device=true: the data set in memory, augmented in batches",
    ]
    assert data_wait_advice(0.05, InputPath(False, 2, ""), cpu) is None


def test_register_strategies_makes_the_names_known() -> None:
    register_strategies()
    assert {"dp", "dp_balanced", "fsdp", "pipeline", "single_xla"} <= set(StrategyRegistry.available_strategies())


def test_default_blocks() -> None:
    assert repr(default_blocks(nn.Sequential(nn.Linear(2, 3), nn.ReLU()))) == (
        "[('0', Linear(in_features=2, out_features=3, bias=True)), ('1', ReLU())]"
    )
    assert default_blocks(nn.Linear(2, 3)) is None


def test_as_blocks_names_the_networks_submodules() -> None:
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    blocks = as_blocks(net, [("a", net[0]), ("b", nn.Sequential(net[1], net[2]))])
    assert [(b.name, b.paths, b.parameter_count) for b in blocks] == [("a", ("0",), 9), ("b", ("1", "2"), 4)]


def test_check_covers_refuses_parameters_left_out() -> None:
    net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    with pytest.raises(ProjectError, match=r"Sequential declares leave out the parameters 1\.weight, 1\.bias; "):
        check_covers(net, as_blocks(net, [("first", net[0])]), "pipeline")


def test_short_count() -> None:
    assert (short_count(950), short_count(12_800), short_count(23_520_842)) == ("950", "12.8k", "23.5M")


def test_check_module_names_what_is_missing() -> None:
    class Bare(nn.Module): ...

    with pytest.raises(
        ProjectError, match=r"^--trainer.strategy=fsdp needs a LightningModule with its network in `net` "
    ):
        check_module(Bare(), "fsdp")


def test_named_starts_takes_a_layers_first_block() -> None:
    blocks = [Block(n, nn.Identity(), (n,)) for n in ("stem", "layer1.0", "layer2.0", "layer3.0", "fc")]
    assert named_starts(blocks, "layer3", 2) == [3]


def test_module_view_replaces_without_writing_on_the_module() -> None:
    net = nn.Linear(2, 2)
    view = module_view(net, forward=lambda x: x * 0)
    assert view(torch.ones(1, 2)).tolist() == [[0.0, 0.0]]
    assert view.weight is net.weight
    assert "forward" not in vars(net)


def test_is_deepspeed_strategy() -> None:
    assert [is_deepspeed_strategy(s) for s in ("deepspeed_stage_2", DeepSpeedStrategy, "ddp")] == [True, True, False]


def test_check_deepspeed_choice_refuses_a_cpu() -> None:
    with pytest.raises(ProjectError, match=r"^trainer.strategy='deepspeed_stage_2': DeepSpeed runs on CUDA GPUs only "):
        check_deepspeed_choice("deepspeed_stage_2", "cpu")
    assert check_deepspeed_choice("ddp", "cpu") is None


def test_a_file_or_nothing_is_no_deepspeed_folder() -> None:
    check_deepspeed_checkpoint("runs/version_0/checkpoints/last.ckpt", "ddp")  # nothing there: checked elsewhere


def test_net_with_loss_returns_the_loss_sum_and_the_classes() -> None:
    net_with_loss = NetWithLoss(nn.Linear(4, 3), nn.CrossEntropyLoss())
    loss_sum, predictions = net_with_loss(torch.zeros(2, 4), torch.tensor([0, 1]))
    assert (loss_sum.shape, predictions.shape, net_with_loss(torch.zeros(2, 4)).shape) == (
        torch.Size([1]),
        torch.Size([2]),
        torch.Size([2, 3]),
    )


def test_data_parallel_off_cuda_is_a_pass_through() -> None:
    wrapped = data_parallel(nn.Linear(2, 2), [torch.device("cpu")])
    assert (isinstance(wrapped, nn.DataParallel), wrapped.device_ids) == (True, [])


def test_check_batch_splits_evenly() -> None:
    assert check_batch_splits_evenly(256, 4) is None
    with pytest.raises(
        ProjectError, match=r"^data.batch_size=30 does not split evenly across the 4 GPUs .* multiple of 4$"
    ):
        check_batch_splits_evenly(30, 4)


def test_describe_units() -> None:
    text = describe_units([{"name": "0", "parameters": 1200}, {"name": "root", "parameters": 0}], 2)
    assert text == "fsdp plan: 1 unit(s) + root, sharded over 2 process(es):\n  0 1.2k, root 0"

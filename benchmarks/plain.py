"""The plain PyTorch loops the template is compared with: the training and evaluation loops a careful
user writes (:func:`plain_fit`, :func:`plain_infer`), given the template's recipe -- network, SGD with
Nesterov momentum and weight decay, linear warm-up then cosine stepped every iteration, cross-entropy,
the crop-and-flip augmentation, the same split of the same images -- and stamped at the same instants
as :class:`benchmarks.stamps.StepStamps` stamps the template.

The input is what a plain loop does best with a data set that fits in memory: the images held as one
uint8 tensor on the device (on a CPU: in memory), each batch indexed out of it and augmented at once in
the training process (:func:`project.toolkit.data.augmentation.augment`, plain tensor operations: a
gather for the crop and flip, a resize, a normalisation), with no DataLoader. The order of each epoch
and the crops and flips are drawn from a torch generator of the loop's own (seeded by the setup's
seed): the same distributions as the template's, other draws. On a CPU the process keeps the memory it
frees for reuse, as the template's ``host_memory_reuse`` callback makes a run do (unless the setup turns
that off on both sides): that setting alone changes a step's time by up to 3x, so both sides allocate alike
and the ratio shows what the template's machinery costs.

They run in the process of a session (:mod:`benchmarks.paired`) beside the template, or -- the training
loop, for benchmarks of one side -- in a fresh process of their own, started by
:func:`benchmarks._common.plain_fit_run` as ``python -m benchmarks.plain '<json list>' OUT`` in the
repository root.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import torch
from lightning.pytorch import seed_everything
from torch import nn
from torch.nn import functional as F

from benchmarks._common import Setup
from project.toolkit.data.augmentation import PADDING, augment, rows_of, to_model_input
from project.toolkit.host_memory import DEFAULT_TRIM_THRESHOLD_MB, keep_freed_host_memory
from project.toolkit.timing.clocks import SyncingClock, synchronizer


class StepObserver(Protocol):
    """What :func:`plain_infer` tells where the template's batch hooks would run."""

    def step_started(self) -> None: ...

    def step_ended(self) -> None: ...


def build_net(setup: Setup, device: torch.device, num_classes: int = 10) -> nn.Module:
    from project.nets import build_network

    net = build_network(setup.arch, num_classes).to(device)
    if setup.channels_last:
        net = net.to(memory_format=torch.channels_last)
    if setup.compile:
        net.compile(mode=setup.compile_mode)
    return net


def sgd(parameters: Any, setup: Setup, device: torch.device) -> torch.optim.SGD:
    """The template's SGD (Nesterov momentum, weight decay), fused on a CUDA device as the template's is."""
    fused = True if device.type == "cuda" else None
    return torch.optim.SGD(parameters, lr=setup.lr, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=fused)


def clock_of(device: torch.device) -> Any:
    """A function returning ``(wall, cpu)`` seconds: ``perf_counter()`` after waiting for the device, and
    the process's CPU time, as :class:`~benchmarks.stamps.StepStamps` stamps the template."""
    mark = SyncingClock(synchronizer(device)).mark
    return lambda: (mark(), time.process_time())


def as_layout(stamps: Any, which: int = 0) -> Any:
    """Stamps recorded as ``(wall, cpu)`` pairs, in StepStamps' layout: the wall times, with the CPU times
    under ``"cpu"``."""

    def pick(value: Any) -> Any:
        if isinstance(value, tuple):
            return value[which]
        if isinstance(value, list):
            return [pick(v) for v in value]
        return value

    picked = {key: pick(value) for key, value in stamps.items()}
    return {**picked, "cpu": as_layout(stamps, 1)} if which == 0 else picked


def autocast(setup: Setup, device: torch.device) -> AbstractContextManager:
    if setup.precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if setup.precision == "16-mixed":
        return torch.autocast(device.type, dtype=torch.float16)
    return nullcontext()


class InMemory:
    """One split of the data set as uint8 ``(N, H, W, C)`` images (as the arrays come) and labels on
    ``device``, batched by indexing as channels_last ``(n, C, H, W)`` views: the plain loop's whole
    input pipeline."""

    def __init__(self, images: Any, labels: Any, device: torch.device, stats: Any) -> None:
        self.images = torch.from_numpy(images).to(device)
        self.labels = torch.from_numpy(labels).to(device)
        self.mean, self.std = stats  # the data set's normalisation, as the template uses it

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, batch_size: int, setup: Setup) -> Any:
        """Evaluation batches in order, every image once (:meth:`evaluation_batch`)."""
        for start in range(0, len(self), batch_size):
            yield self.evaluation_batch(slice(start, start + batch_size), setup)

    def evaluation_batch(self, index: slice, setup: Setup) -> tuple[torch.Tensor, torch.Tensor]:
        """The images at ``index`` resized and normalised, as the network takes them, and their labels."""
        images = to_model_input(rows_of(self.images, index), setup.image_size, self.mean, self.std)
        return as_input(images, setup), self.labels[index]

    def training_batch(
        self, index: torch.Tensor, crops: torch.Tensor, setup: Setup
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The images at ``index`` augmented with their ``crops`` (:func:`epoch_draws`), as the network takes
        them, and their labels."""
        images = augment(rows_of(self.images, index), crops[index], setup.image_size, self.mean, self.std)
        return as_input(images, setup), self.labels[index]


def reuse_freed_host_memory(setup: Setup) -> None:
    """On a CPU, keep freed memory for reuse as the template's ``host_memory_reuse`` callback does, unless the
    setup turns that off: process-wide, so once per process, before its first run."""
    if setup.host_memory_reuse and not torch.cuda.is_available():
        keep_freed_host_memory(DEFAULT_TRIM_THRESHOLD_MB)


def training_steps(setup: Setup, images: int) -> int:
    """Steps an epoch of ``images`` training images takes: whole batches only (the template drops the last
    incomplete one too), at most ``setup.train_batches``."""
    steps = images // setup.batch_size
    return steps if setup.train_batches is None else min(steps, setup.train_batches)


def device_of_plain_loops() -> torch.device:
    """The device the plain loops run on: the GPU where there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def epoch_draws(count: int, draws: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One epoch's order of ``count`` training images and every image's crop offsets (0..8 on each axis) and
    flip, as the template's table has them, drawn from the loop's own generator ``draws``."""
    order = torch.randperm(count, generator=draws, device=device)
    high = torch.tensor([2 * PADDING + 1, 2 * PADDING + 1, 2], device=device)
    return order, (torch.rand(count, 3, generator=draws, device=device) * high).long()


def as_input(images: torch.Tensor, setup: Setup) -> torch.Tensor:
    return images.contiguous(memory_format=torch.channels_last) if setup.channels_last else images


def splits(setup: Setup, device: torch.device, stage: str, batch_size: int | None = None) -> dict[str, InMemory]:
    """The splits of the setup's data set that ``stage`` needs, as the template's data module splits them
    (its seeded validation split): its arrays are read through the module, the loaders are not used."""
    data = setup.data_module(batch_size)
    data.setup(stage)
    names = ("train", "val") if stage == "fit" else ("test",)
    # The data module's arrays (ImageArrayDataset.images / .labels), read once.
    return {
        name: InMemory(data._datasets[name].images, data._datasets[name].labels, device, data.channel_stats)
        for name in names
    }


def plain_fit(setup: Setup, out: Path, test: bool = False) -> dict[str, Any]:
    """The training loop a careful user writes: the input above; SGD (Nesterov momentum, weight decay)
    with the template's warm-up + cosine schedule stepped every iteration; channels_last;
    ``zero_grad(set_to_none=True)``; loss and accuracy summed on the device and read once per epoch;
    a validation pass under ``inference_mode`` before training (where the template has its sanity
    check) and after every epoch; a checkpoint (model, optimizer, schedule) every epoch. With ``test``,
    the test split's accuracy after the last epoch.

    Besides its stamps (under ``"clock"``, in the layout of :class:`~benchmarks.stamps.StepStamps`)
    it returns ``epochs`` as ``timing.json`` has them: seconds from the epoch's start to its last step
    (validation and the checkpoint come after) and images.
    """
    from project.toolkit.training import WarmupCosine

    device = device_of_plain_loops()
    now = clock_of(device)
    seed_everything(setup.seed, verbose=False)  # as the template: seeded before the network is built
    data = splits(setup, device, "fit")
    train, val = data["train"], data["val"]
    net = build_net(setup, device, setup.data_module().num_classes)
    optimizer = sgd(net.parameters(), setup, device)
    steps = training_steps(setup, len(train))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(steps, steps * setup.epochs))
    scaler = torch.amp.GradScaler(device.type, enabled=setup.precision == "16-mixed")
    draws = torch.Generator(device).manual_seed(setup.seed)  # the loop's own: order, crops and flips
    # Before training, as the template's sanity check does: the first evaluation has one-off costs
    # (and so does the first training step after it), which then fall before the first epoch, too.
    evaluate(net, val, setup, device, batches=1)
    clock: dict[str, Any] = {"epoch_starts": [], "train_batch_ends": []}
    epochs = []
    for epoch in range(setup.epochs):
        clock["epoch_starts"].append(start := now())
        seed_everything(setup.seed + epoch, verbose=False)  # as the template's ReseedEveryEpoch: dropout
        clock["train_batch_ends"].append(ends := [])
        order, crops = epoch_draws(len(train), draws, device)
        net.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        for step in range(steps):
            index = order[step * setup.batch_size : (step + 1) * setup.batch_size]
            images, labels = train.training_batch(index, crops, setup)
            with autocast(setup, device):
                logits = net(images)
                loss = F.cross_entropy(logits, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach() * len(labels)
            correct += (logits.argmax(1) == labels).sum()
            ends.append(now())
            schedule.step()
        samples = steps * setup.batch_size
        epochs.append({"seconds": ends[-1][0] - start[0], "samples": samples})
        evaluate(net, val, setup, device)
        train_loss, train_acc = loss_sum.item() / samples, correct.item() / samples  # once per epoch
        checkpoint = {"net": net.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}
        torch.save(checkpoint, out.parent / "plain-last.pt.tmp")
        os.replace(out.parent / "plain-last.pt.tmp", out.parent / "plain-last.pt")
        print(f"epoch {epoch}: loss {train_loss:.3f} acc {train_acc:.3f}", flush=True)
    clock["train_end"] = now()
    result: dict[str, Any] = {"epochs": epochs, "clock": as_layout(clock)}
    if test:
        result["test_acc"] = evaluate(net, splits(setup, device, "test")["test"], setup, device)
    return result


def evaluate(net: nn.Module, split: InMemory, setup: Setup, device: torch.device, batches: int | None = None) -> float:
    """The accuracy of ``net`` on the first ``batches`` batches of ``split`` (None: all of it), in eval
    mode under ``inference_mode``."""
    net.eval()
    correct, seen = torch.zeros((), dtype=torch.long, device=device), 0
    with torch.inference_mode(), autocast(setup, device):
        for number, (images, labels) in enumerate(split.batches(setup.batch_size, setup)):
            if number == batches:
                break
            correct += (net(images).argmax(1) == labels).sum()
            seen += len(labels)
    net.train()
    return correct.item() / max(1, seen)


def plain_infer(setup: Setup, batch_size: int, predict: bool, observer: StepObserver | None = None) -> dict[str, Any]:
    """The evaluation loop a careful user writes: eval mode, ``inference_mode``, channels_last, batches
    resized and normalised in the loop, the loss and accuracy of ``test`` summed on the device and read
    once at the end (``predict``: the predicted classes, gathered once at the end). A batch is stamped
    from its arrival on the device ready for the network to its result, where the template's
    ``on_*_batch_start`` / ``on_*_batch_end`` hooks run; ``observer`` is told at the same places, after the
    start's stamp and after the end's."""
    device = device_of_plain_loops()
    now = clock_of(device)
    seed_everything(setup.seed, verbose=False)
    test = splits(setup, device, "test", batch_size)["test"]
    net = build_net(setup, device).eval()
    batches, predictions = [], []
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    with torch.inference_mode(), autocast(setup, device):
        for step, (images, labels) in enumerate(test.batches(batch_size, setup)):
            if step == setup.test_batches:
                break
            start = now()
            if observer is not None:
                observer.step_started()
            logits = net(images)
            if predict:
                predictions.append(logits.argmax(1))
            else:
                loss_sum += F.cross_entropy(logits, labels, reduction="sum")
                correct += (logits.argmax(1) == labels).sum()
            batches.append([start, now(), len(labels)])
            if observer is not None:
                observer.step_ended()
    results = torch.cat(predictions).cpu().tolist() if predict else [loss_sum.item(), correct.item()]
    return {"results": len(results), "clock": as_layout({"eval_batches": batches})}


def main(specs: str, out: str) -> None:
    """``python -m benchmarks.plain '<json list>' OUT``: the plain training runs of
    :func:`benchmarks._common.plain_fit_run`, written to OUT as a JSON list."""
    results = []
    for spec in json.loads(specs):
        setup = Setup(**spec["setup"])
        reuse_freed_host_memory(setup)
        results.append(plain_fit(setup, Path(out), test=spec.get("test", False)))
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])

"""The plain PyTorch loops the template is compared with: the training and evaluation loops a careful
user writes (:func:`plain_fit`, :func:`plain_infer`), on the same data module, network, optimizer
and schedule as the template, stamped at the same instants as
:class:`project.toolkit.measure.stamps.StepStamps` stamps the template.

Each runs in a fresh process of its own, started by :func:`benchmarks._common.plain_fit_run` or
:func:`~benchmarks._common.plain_infer_run` as ``python -m benchmarks.plain fit|infer '<json list>'
OUT`` in the repository root.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import seed_everything
from torch import nn
from torch.nn import functional as F

from benchmarks._common import SEED, Setup
from project.toolkit.measure.devices import SyncingClock, synchronizer


def build_net(setup: Setup, device: torch.device) -> nn.Module:
    from project.nets import build_network

    net = build_network(setup.arch, 10).to(device)
    if setup.channels_last:
        net = net.to(memory_format=torch.channels_last)
    if setup.compile:
        net.compile()
    return net


def autocast(setup: Setup, device: torch.device) -> AbstractContextManager:
    if setup.precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if setup.precision == "16-mixed":
        return torch.autocast(device.type, dtype=torch.float16)
    return nullcontext()


def to_device(images: torch.Tensor, labels: torch.Tensor, setup: Setup, device: torch.device) -> tuple:
    memory_format = torch.channels_last if setup.channels_last else torch.preserve_format
    images = images.to(device, non_blocking=True, memory_format=memory_format)
    return images, labels.to(device, non_blocking=True)


def plain_fit(setup: Setup, out: Path) -> dict[str, Any]:
    """The training loop a careful user writes: SGD (Nesterov momentum, weight decay) with the
    template's warm-up + cosine schedule stepped every iteration, channels_last, zero_grad with
    ``set_to_none``, loss and accuracy summed on the device and read once per epoch, a validation
    batch under ``inference_mode`` before training and after every epoch, and a checkpoint (model,
    optimizer, schedule) every epoch.

    Besides its stamps (under ``"clock"``, in the layout of :class:`~project.toolkit.measure.stamps.StepStamps`)
    it returns ``epochs`` as ``timing.json`` has them: seconds from the epoch's start to its last step
    (validation and the checkpoint come after) and images.
    """
    from project.toolkit.training import WarmupCosine

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    now = SyncingClock(synchronizer(device)).mark  # waits for the device, then reads the host clock
    seed_everything(SEED, verbose=False)  # as the template: the same initial weights and order of batches
    data = setup.data_module()
    data.setup("fit")
    train_loader, val_loader = data.train_dataloader(), data.val_dataloader()
    net = build_net(setup, device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps = setup.train_batches
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(steps, steps * setup.epochs))
    scaler = torch.amp.GradScaler(device.type, enabled=setup.precision == "16-mixed")
    # Before training, as the template's sanity check does: the first evaluation has one-off costs
    # (and so does the first training step after it), which then fall before the first epoch, too.
    evaluate_once(net, val_loader, setup, device)
    clock: dict[str, Any] = {"epoch_starts": [], "train_batch_ends": []}
    epochs = []
    for epoch in range(setup.epochs):
        clock["epoch_starts"].append(start := now())
        seed_everything(SEED + epoch, verbose=False)  # as the template's ReseedEveryEpoch: the same dropout
        clock["train_batch_ends"].append(ends := [])
        train_loader.sampler.set_epoch(epoch)  # the data module's sampler reshuffles by epoch
        net.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        for step, (images, labels) in enumerate(train_loader):
            if step == steps:
                break
            images, labels = to_device(images, labels, setup, device)
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
        epochs.append({"seconds": ends[-1] - start, "samples": samples})
        evaluate_once(net, val_loader, setup, device)
        train_loss, train_acc = loss_sum.item() / samples, correct.item() / samples  # once per epoch
        checkpoint = {"net": net.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}
        torch.save(checkpoint, out.parent / "plain-last.pt.tmp")
        os.replace(out.parent / "plain-last.pt.tmp", out.parent / "plain-last.pt")
        print(f"epoch {epoch}: loss {train_loss:.3f} acc {train_acc:.3f}", flush=True)
    clock["train_end"] = now()
    return {"epochs": epochs, "clock": clock}


def evaluate_once(net: nn.Module, loader: Any, setup: Setup, device: torch.device) -> None:
    """One pass over ``loader`` in eval mode under ``inference_mode``."""
    net.eval()
    with torch.inference_mode(), autocast(setup, device):
        for images, labels in loader:
            images, labels = to_device(images, labels, setup, device)
            F.cross_entropy(net(images), labels)
    net.train()


def plain_infer(setup: Setup, batch_size: int, predict: bool) -> dict[str, Any]:
    """The evaluation loop a careful user writes: eval mode, ``inference_mode``, channels_last, the
    loss and accuracy of ``test`` summed on the device and read once at the end (``predict``: the
    predicted classes, gathered once at the end). A batch is stamped from its arrival on the device
    to its result, where the template's ``on_*_batch_start`` / ``on_*_batch_end`` hooks run."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    now = SyncingClock(synchronizer(device)).mark  # waits for the device, then reads the host clock
    seed_everything(SEED, verbose=False)
    data = setup.data_module(batch_size)
    data.setup("test")
    loader = data.test_dataloader()
    net = build_net(setup, device).eval()
    batches, predictions = [], []
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    with torch.inference_mode(), autocast(setup, device):
        for step, (images, labels) in enumerate(loader):
            if step == setup.test_batches:
                break
            images, labels = to_device(images, labels, setup, device)
            start = now()
            logits = net(images)
            if predict:
                predictions.append(logits.argmax(1))
            else:
                loss_sum += F.cross_entropy(logits, labels, reduction="sum")
                correct += (logits.argmax(1) == labels).sum()
            batches.append([start, now(), len(labels)])
    results = torch.cat(predictions).cpu().tolist() if predict else [loss_sum.item(), correct.item()]
    return {"results": len(results), "clock": {"eval_batches": batches}}


def main(task: str, specs: str, out: str) -> None:
    """``python -m benchmarks.plain fit|infer '<json list>' OUT``: the plain-loop measurements of
    :func:`benchmarks._common.plain_fit_run` / :func:`~benchmarks._common.plain_infer_run`, written to
    OUT as a JSON list."""
    results = []
    for spec in json.loads(specs):
        setup = Setup(**spec["setup"])
        if task == "fit":
            results.append(plain_fit(setup, Path(out)))
        else:
            results.append(plain_infer(setup, spec["batch_size"], spec["predict"]))
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])

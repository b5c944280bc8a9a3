"""What the three performance benchmarks share: running the template (``python -m project ...``) and
the plain PyTorch loops it is compared with, each in a fresh process, and reading their clocks.

Both sides of every comparison run as their own process (the template through its real entry point,
the plain loop through ``python benchmarks/_common.py fit|infer ...``), so neither inherits the other's
warm caches, threads or memory. Both read their batches from the data module's own DataLoaders
(same in-memory data, augmentation, sampler, workers, pinning): the input pipeline is measured on its
own (``benchmarks/input.py``); the comparison is about the loop around it.

Both sides are timed at the same instants: the template by one extra callback, :class:`Clock` (a
``perf_counter()`` per batch, microseconds), the plain loops by the same calls in their code, after
waiting for the device where it runs asynchronously. The figures are medians of per-step times:

- a step cycle is the time from the end of one batch to the end of the next, so it holds
  everything the loop does per batch -- loading, the hooks, logging, metrics, the progress bar, and
  for training forward, backward and the optimizer step;
- the first epoch, and the first evaluation batches, are left out (warm-up).

Medians, because this was built on 2 CPU cores shared with other work: a burst of load slows a few
steps, which a median ignores and a mean or an epoch total does not.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import nn
from torch.nn import functional as F

from project.measure.devices import SyncingClock, synchronizer
from project.measure.environment import machine_description
from project.measure.tables import markdown_table, text_table

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "perf"
SUBPROCESS_TIMEOUT_S = 600
SEED = 42  # the template's seed_everything default


# --------------------------------------------------------------------------- what is run


@dataclass(frozen=True)
class Setup:
    """One configuration, run identically by the template and by the plain loop.

    ``train_batches`` steps per epoch (the training set is ``train_batches * batch_size`` images),
    one validation batch per epoch, ``test_batches`` test batches.
    """

    arch: str = "mobilenet_v2"
    image_size: int = 112
    batch_size: int = 32
    train_batches: int = 4
    epochs: int = 3
    test_batches: int = 4
    precision: str = "32-true"
    channels_last: bool = True
    compile: bool = False
    num_workers: int | None = None  # None: the data module's default

    @property
    def label(self) -> str:
        options = [self.precision] if self.precision != "32-true" else []
        options += ["contiguous"] if not self.channels_last else []
        options += ["compile"] if self.compile else []
        return f"{self.arch}@{self.image_size}" + "".join(f" {o}" for o in options)

    def data_module(self, batch_size: int | None = None) -> Any:
        """The template's data module on this setup's synthetic data."""
        from project.data import CIFAR10DataModule

        return CIFAR10DataModule(**self.data_options(batch_size))

    def data_options(self, batch_size: int | None = None) -> dict[str, Any]:
        """Synthetic data with one validation batch, and a test set of exactly ``test_batches``
        batches of ``batch_size`` (the data module makes a fifth of ``synthetic_size`` its test set)."""
        train = (self.train_batches + 1) * self.batch_size
        test = self.test_batches * (batch_size or self.batch_size)
        options = {
            "synthetic": True,
            "synthetic_size": max(train, 5 * test),
            "val_size": self.batch_size,
            "image_size": self.image_size,
            "batch_size": batch_size or self.batch_size,
        }
        if self.num_workers is not None:
            options["num_workers"] = self.num_workers
        return options

    def cli_args(self, batch_size: int | None = None) -> list[str]:
        """The same setup as ``python -m project`` options."""
        data = self.data_options(batch_size)
        return [
            *(f"--data.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in data.items()),
            f"--model.arch={self.arch}",
            f"--model.channels_last={str(self.channels_last).lower()}",
            f"--model.compile={str(self.compile).lower()}",
            f"--trainer.precision={self.precision}",
            f"--trainer.max_epochs={self.epochs}",
            f"--trainer.limit_train_batches={self.train_batches}",
            f"--trainer.limit_test_batches={self.test_batches}",
            f"--trainer.limit_predict_batches={self.test_batches}",
            f"--trainer.accelerator={'gpu' if torch.cuda.is_available() else 'cpu'}",
            "--trainer.devices=1",
        ]


# --------------------------------------------------------------------------- the observer callback


class Clock(Callback):
    """Writes ``perf_counter()`` stamps to ``path`` (JSON), in the layout the plain loops return:
    ``epoch_starts`` and ``train_end`` (after the last checkpoint), ``train_batch_ends`` (a list per
    epoch), and ``eval_batches`` (``[start, end, images]`` of every test or predict batch)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamps: dict[str, Any] = {"epoch_starts": [], "train_batch_ends": [], "eval_batches": []}
        self._clock = SyncingClock()
        self._start = 0.0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Waits for the device at each stamp, as the plain loops do: both sides pay the same.
        self._clock = SyncingClock(synchronizer(trainer.strategy.root_device))

    def _now(self) -> float:
        return self._clock.mark()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.stamps["epoch_starts"].append(self._now())
        self.stamps["train_batch_ends"].append([])

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.stamps["train_batch_ends"][-1].append(self._now())

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.stamps["train_end"] = self._now()
        self._write()

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, *args: Any) -> None:
        self._start = self._now()

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        self.stamps["eval_batches"].append([self._start, self._now(), len(batch[0])])

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write()

    # predict is clocked exactly as test is
    on_predict_batch_start = on_test_batch_start
    on_predict_batch_end = on_test_batch_end
    on_predict_end = on_test_end

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.stamps))


# --------------------------------------------------------------------------- running a side


def environment(threads: int) -> dict[str, str]:
    """The child's environment: ``benchmarks/`` importable (for :class:`Clock`), and ``threads``
    intra-op threads (0: torch's own choice, one per core)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "benchmarks"), str(REPO), env.get("PYTHONPATH")]))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run(command: list[str], threads: int, cwd: Path) -> None:
    """Run ``command``; on failure raise with the end of its output."""
    cwd.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        command, cwd=cwd, env=environment(threads), capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{tail}")


def template(stage: str, setup: Setup, folder: Path, threads: int, batch_size: int | None = None) -> dict[str, Any]:
    """``python -m project <stage>`` with the template's defaults and ``setup`` (evaluating in
    batches of ``batch_size``); returns its ``timing.json``, with the :class:`Clock` stamps under
    ``"clock"``."""
    clock = folder / "clock.json"
    command = [
        sys.executable,
        "-m",
        "project",
        stage,
        *setup.cli_args(batch_size),
        f"--trainer.default_root_dir={folder}",
        "--trainer.callbacks+=_common.Clock",
        f"--trainer.callbacks.path={clock}",
    ]
    run(command, threads, cwd=folder)
    timing = json.loads(next(folder.glob("lightning_logs/version_*/timing.json")).read_text())
    timing["clock"] = json.loads(clock.read_text())
    return timing


def plain_fit_run(setup: Setup, out: Path, threads: int) -> dict[str, Any]:
    """:func:`plain_fit` in a fresh process; returns what it measured (also written to ``out``)."""
    return _plain("fit", [{"setup": asdict(setup)}], out, threads)[0]


def plain_infer_run(jobs: list[tuple[Setup, int, bool]], out: Path, threads: int) -> list[dict[str, Any]]:
    """:func:`plain_infer` for each ``(setup, batch size, predict)`` of ``jobs``, one after the other
    in one fresh process; returns what each measured."""
    specs = [{"setup": asdict(setup), "batch_size": batch, "predict": predict} for setup, batch, predict in jobs]
    return _plain("infer", specs, out, threads)


def _plain(task: str, specs: list[dict[str, Any]], out: Path, threads: int) -> list[dict[str, Any]]:
    run([sys.executable, str(Path(__file__)), task, json.dumps(specs), str(out)], threads, cwd=out.parent)
    return json.loads(out.read_text())


# --------------------------------------------------------------------------- the plain loops


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

    Besides the :class:`Clock` stamps it returns ``epochs`` as ``timing.json`` has them: seconds from
    the epoch's start to its last step (validation and the checkpoint come after) and images.
    """
    from project.model import WarmupCosine

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


# --------------------------------------------------------------------------- reading the numbers


def steady_epoch_wall(clock: dict[str, Any]) -> float:
    """Mean wall seconds of an epoch after the first: from its start to the next one's (or to the end
    of training) -- training, validation, checkpoint, epoch-end logging and everything between."""
    stamps = [*clock["epoch_starts"][1:], clock["train_end"]]
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def steady_step_cycle(clock: dict[str, Any]) -> float:
    """The median training step cycle (end of one batch to the end of the next) of the epochs after
    the first; an epoch's first batch, which follows the epoch-start work, is left out."""
    return statistics.median(b - a for ends in clock["train_batch_ends"][1:] for a, b in itertools.pairwise(ends))


def eval_step_cycle(clock: dict[str, Any], warmup: int) -> float:
    """The median evaluation step cycle after the first ``warmup`` batches."""
    ends = [end for _, end, _ in clock["eval_batches"][warmup:]]
    return statistics.median(b - a for a, b in itertools.pairwise(ends))


def eval_latency(clock: dict[str, Any], warmup: int) -> float:
    """The median time of an evaluation batch (arrival on the device to result) after ``warmup``."""
    return statistics.median(end - start for start, end, _ in clock["eval_batches"][warmup:])


def epoch_throughput(epochs: list[dict[str, Any]]) -> float:
    """Images per second over the epochs after the first, as ``timing.json`` computes
    ``train_samples_per_second`` (each epoch from its start to its last step)."""
    steady = epochs[1:] or epochs
    return sum(e["samples"] for e in steady) / sum(e["seconds"] for e in steady)


def best(values: list[float]) -> float:
    """The best of the repeats: on a shared machine disturbances only ever slow a run down."""
    return max(values)


def spread(values: list[float]) -> float:
    """How much repeats of one side differ: the largest over the smallest, minus one."""
    return max(values) / min(values) - 1


def machine(threads: int) -> str:
    return f"{machine_description()}, {threads or 'default'} intra-op thread(s)"


def publish_comparison(
    args: argparse.Namespace,
    name: str,
    what: str,
    cases: list[dict[str, Any]],
    header: list[str],
    rows: list[list[str]],
    started: float,
    goal: float,
) -> None:
    """Publish a template/plain comparison begun at ``started`` (``time.perf_counter``) with, as the
    headline, its worst case's ratio against ``goal``."""
    worst = min(cases, key=lambda case: case["ratio"])
    status = "met" if worst["ratio"] >= goal else "MISSED"
    headline = (
        f"{name}: min template/plain {what} ratio {worst['ratio']:.3f} ({worst['case']}; "
        f"repeats of one side differ by up to {100 * worst['spread']:.0f} %); goal >= {goal}: {status}"
    )
    seconds = time.perf_counter() - started
    where = machine(args.threads)
    notes = f"{where}; {args.repeats} alternations per case; {seconds:.0f} s"
    publish(args.out, name, {"machine": where, "seconds": seconds, "cases": cases}, header, rows, notes, headline)


def publish(
    out: Path, name: str, report: dict[str, Any], header: list[str], rows: list[list[str]], notes: str, headline: str
) -> None:
    """Write ``<name>.json`` (``report`` and the headline) and ``<name>.md`` under ``out``, and print
    the table, the notes and, as the last line, the headline."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({**report, "headline": headline}, indent=2) + "\n")
    (out / f"{name}.md").write_text(f"{markdown_table(header, rows)}\n\n{notes}\n\n{headline}\n")
    print(text_table(header, rows))
    print(notes)
    print(headline)


def common_arguments(description: str, default_repeats: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    parser.add_argument(
        "--repeats", type=int, default=default_repeats, help="alternations of template and plain loop per case"
    )
    # One thread by default on a CPU: where other work shares the cores, a step split across several
    # OpenMP threads waits for the one that was descheduled (steps took 5-10x longer here, and varied
    # as much), and that noise would swamp a 2 % difference. Both sides always get the same.
    parser.add_argument(
        "--threads",
        type=int,
        default=0 if torch.cuda.is_available() else 1,
        help="intra-op threads (OMP_NUM_THREADS) of both sides; 0: torch's default, one per core "
        "(default: 1 on a CPU-only machine, else 0)",
    )
    return parser


def _main(task: str, specs: str, out: str) -> None:
    """``python benchmarks/_common.py fit|infer '<json list>' OUT``: the plain-loop measurements of
    :func:`plain_fit_run` / :func:`plain_infer_run`, written to OUT as a JSON list."""
    results = []
    for spec in json.loads(specs):
        setup = Setup(**spec["setup"])
        if task == "fit":
            results.append(plain_fit(setup, Path(out)))
        else:
            results.append(plain_infer(setup, spec["batch_size"], spec["predict"]))
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    _main(*sys.argv[1:])

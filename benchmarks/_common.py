"""What the performance benchmarks share: running the template (``python -m project ...``) and the plain
PyTorch loops it is compared with, and reading their clocks.

The template runs through its real entry point, the plain loops are those of :mod:`benchmarks.plain`.
The template/plain comparisons (``overhead``, ``inference``) run their sides -- with a third, Lightning's
loop alone -- in one fresh process per session, alternated (:func:`session`, :mod:`benchmarks.paired`,
which says why); the benchmarks of one side's settings (``host_memory``, ``parity``) run each side in a
fresh process of its own (:func:`template`, :func:`plain_fit_run`). Every process starts in the
repository root, where ``-m`` imports this checkout's ``project`` and ``benchmarks`` without any
PYTHONPATH. All sides hold the images in memory and make each batch at once in the training process, as
the template does by default on a CPU; the input paths are measured on their own (``python -m
benchmarks.input``).

All sides are timed at the same instants: the template and Lightning's loop by one extra callback,
:class:`benchmarks.stamps.StepStamps` (a ``perf_counter()`` per batch, microseconds), the
plain loops by the same calls in their code, after waiting for the device where it runs
asynchronously. The figures are medians of per-step times:

- a step cycle is the time from the end of one batch to the end of the next, so it holds
  everything the loop does per batch -- loading, the hooks, logging, metrics, the progress bar, and
  for training forward, backward and the optimizer step;
- the first epoch, and the first evaluation batches, are left out (warm-up).

Medians, because this was built on 2 CPU cores shared with other work: a burst of load slows a few
steps, which a median ignores and a mean or an epoch total does not.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks._figures import (  # noqa: F401  (re-exported: the benchmarks import them from here)
    CLOCKS,
    ROUND,
    SIDES,
    balanced,
    epoch_throughput,
    eval_between,
    eval_latency,
    eval_step_cycle,
    on,
    ratios_by_clock,
    round_means,
    session_ratio,
    steady_epoch_wall,
    steady_step_cycle,
    verdict,
)
from project.toolkit.dotted import import_object
from project.toolkit.timing.environment import machine_description
from project.toolkit.timing.tables import markdown_table, text_table

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "perf"
SUBPROCESS_TIMEOUT_S = 600
SEED = 42  # the template's seed_everything default
Table = tuple[list[str], list[list[str]]]  # a table to publish: its header and its rows
DEFAULT_DATA = "project.data.CIFAR10DataModule"  # the template's default data set, here synthetic


# --------------------------------------------------------------------------- what is run


@dataclass(frozen=True)
class Setup:
    """One configuration, run identically by the template and by the plain loop.

    ``train_batches`` steps per epoch (None: the whole training set), one validation batch per epoch
    (``val_size``: None) or the data set's validation split, ``test_batches`` test batches (None: all).
    The data is synthetic CIFAR-shaped images unless ``data`` names another data module; the template
    runs with its defaults for everything not named here -- the input path (``on_device`` and
    ``num_workers`` ``auto``) included, unless ``on_device`` / ``num_workers`` are given.
    """

    arch: str = "mobilenet_v2"
    image_size: int = 112
    batch_size: int = 32
    train_batches: int | None = 4
    epochs: int = 3
    test_batches: int | None = 4
    precision: str = "32-true"
    channels_last: bool = True
    compile: bool = False
    compile_mode: str = "default"  # torch.compile's mode where compile is on (reduce-overhead: CUDA graphs)
    # The template's --callbacks.host_memory_reuse; the plain loop sets the same on a CPU (both sides
    # allocate alike, so the ratio shows the template's own cost)
    host_memory_reuse: bool = True
    num_workers: int | None = None  # None: the template's default (auto)
    on_device: bool | None = None  # None: the template's default (auto)
    data: str = DEFAULT_DATA  # the data module's class; the default: synthetic CIFAR-10
    val_size: int | None = None  # None: one batch
    lr: float = 0.1  # the template's default peak learning rate
    seed: int = SEED

    @property
    def synthetic(self) -> bool:
        return self.data == DEFAULT_DATA

    @property
    def label(self) -> str:
        options = [self.precision] if self.precision != "32-true" else []
        options += ["contiguous"] if not self.channels_last else []
        options += [f"compile {self.compile_mode}".removesuffix(" default")] if self.compile else []
        options += ["no-host-memory-reuse"] if not self.host_memory_reuse else []
        return f"{self.arch}@{self.image_size}" + "".join(f" {o}" for o in options)

    def data_module(self, batch_size: int | None = None) -> Any:
        """The template's data module with this setup's options."""
        return import_object(self.data)(**self.data_options(batch_size))

    def data_options(self, batch_size: int | None = None) -> dict[str, Any]:
        """The data module's options. Synthetic data: one validation batch, and a test set of exactly
        ``test_batches`` batches of ``batch_size`` (the data module makes a fifth of ``synthetic_size``
        its test set)."""
        options: dict[str, Any] = {"image_size": self.image_size, "batch_size": batch_size or self.batch_size}
        if self.synthetic:
            train = ((self.train_batches or 4) + 1) * self.batch_size
            test = (self.test_batches or 4) * (batch_size or self.batch_size)
            options.update(synthetic=True, synthetic_size=max(train, 5 * test))
        options["val_size"] = self.batch_size if self.val_size is None else self.val_size
        for name in ("num_workers", "on_device"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return options

    def cli_args(self, batch_size: int | None = None) -> list[str]:
        """The same setup as ``python -m project`` options."""
        data = self.data_options(batch_size)
        limits = [("train", self.train_batches), ("test", self.test_batches), ("predict", self.test_batches)]
        return [
            *([f"--data={self.data}"] if not self.synthetic else []),
            *(f"--data.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in data.items()),
            f"--seed_everything={self.seed}",
            f"--model.arch={self.arch}",
            f"--model.lr={self.lr}",
            f"--model.channels_last={str(self.channels_last).lower()}",
            f"--model.compile={str(self.compile).lower()}",
            *([f"--model.compile_mode={self.compile_mode}"] if self.compile else []),
            f"--callbacks.host_memory_reuse={str(self.host_memory_reuse).lower()}",
            f"--trainer.precision={self.precision}",
            f"--trainer.max_epochs={self.epochs}",
            *(f"--trainer.limit_{stage}_batches={n}" for stage, n in limits if n is not None),
            f"--trainer.accelerator={'gpu' if torch.cuda.is_available() else 'cpu'}",
            "--trainer.devices=1",
        ]


# The job on a GPU: 112 px, global batch 256, each network at the precision that trained it fastest on an H100
# (benchmarks/results/gpu-nvidia-h100-80gb-hbm3/): MobileNetV2 in fp32 (TF32; bf16-mixed was 1.4x slower
# there), ResNet50 in bf16-mixed (its fp32 run was not reached there).
GPU_FASTEST_PRECISION = {"mobilenet_v2": "32-true", "resnet50": "bf16-mixed"}


def gpu_job_setup(arch: str, **options: Any) -> Setup:
    """The job's setup on a GPU for ``arch`` (MobileNetV2 or ResNet50), with ``options`` on top."""
    return Setup(arch, image_size=112, batch_size=256, precision=GPU_FASTEST_PRECISION[arch], **options)


# --------------------------------------------------------------------------- running a side


def environment(threads: int) -> dict[str, str]:
    """The child's environment: this one, with ``threads`` intra-op threads (0: torch's own choice,
    one per core)."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run(command: list[str], threads: int, runs: int = 1) -> None:
    """Run ``command`` (a ``python -m ...`` of ``runs`` runs) in the repository root, where ``-m`` finds this
    checkout's ``project`` and ``benchmarks``; on failure raise with the end of its output."""
    timeout = SUBPROCESS_TIMEOUT_S * runs
    result = subprocess.run(
        command, cwd=REPO, env=environment(threads), capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{tail}")


def template(stage: str, setup: Setup, folder: Path, threads: int, batch_size: int | None = None) -> dict[str, Any]:
    """``python -m project <stage>`` with the template's defaults and ``setup`` (evaluating in
    batches of ``batch_size``), writing into ``folder``; returns its ``timing.json``, with the
    :class:`~benchmarks.stamps.StepStamps` under ``"clock"``."""
    folder.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "project", *template_arguments(stage, setup, folder, batch_size)], threads)
    return template_results(folder)


def template_arguments(stage: str, setup: Setup, folder: Path, batch_size: int | None = None) -> list[str]:
    """The arguments of ``python -m project`` for :func:`template`: ``stage``, ``setup``'s options, ``folder``
    as the run's root and the :class:`~benchmarks.stamps.StepStamps` callback."""
    return [
        stage,
        *setup.cli_args(batch_size),
        f"--trainer.default_root_dir={folder}",
        "--trainer.callbacks+=benchmarks.stamps.StepStamps",
        f"--trainer.callbacks.path={folder / 'clock.json'}",
    ]


def template_results(folder: Path) -> dict[str, Any]:
    """The ``timing.json`` of the template's run in ``folder``, with its stamps under ``"clock"``."""
    timing = json.loads(next(folder.glob("lightning_logs/version_*/timing.json")).read_text())
    timing["clock"] = json.loads((folder / "clock.json").read_text())
    return timing


def session(
    stage: str, setup: Setup, folder: Path, threads: int, batch_size: int | None = None, rotation: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """One session of :mod:`benchmarks.paired` in a fresh process: every side (plain, lightning, template)
    runs ``stage`` (``fit``, ``test`` or ``predict``) on ``setup`` twice in that one process, in the order
    :func:`benchmarks.paired.order` gives for ``rotation``. Returns each side's results in the order they ran,
    their stamps under ``"clock"`` (the template's: its ``timing.json``, with the stamps added)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"stage": stage, "setup": asdict(setup), "batch_size": batch_size, "rotation": rotation}
    run([sys.executable, "-m", "benchmarks.paired", json.dumps(spec), str(folder)], threads, runs=2 * len(SIDES))
    return json.loads((folder / "session.json").read_text())


def run_sessions(
    stage: str,
    setup: Setup,
    folder: Path,
    threads: int,
    repeats: int,
    figures: Callable[[dict[str, Any]], dict[str, float]],
    ratios: dict[str, tuple[str, str]],
    batch_size: int | None = None,
) -> tuple[dict[str, list[dict[str, float]]], list[dict[str, float]]]:
    """``repeats`` sessions (:func:`session`, in ``folder``-0, -1, ..., session ``k`` in the order of rotation
    ``k``): every run's ``figures``, by side in the order they ran, and each session's ``ratios`` (name: the
    figure's key and the side whose ratio to the plain loop it is, :func:`session_ratio`), printed as each
    session ends."""
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    each: list[dict[str, float]] = []
    for repeat in range(repeats):
        ran = session(stage, setup, folder.with_name(f"{folder.name}-{repeat}"), threads, batch_size, rotation=repeat)
        measured = {side: [figures(result) for result in ran[side]] for side in SIDES}
        for side in SIDES:
            runs[side].extend(measured[side])
        each.append({name: session_ratio(measured, key, side) for name, (key, side) in ratios.items()})
        said = ", ".join(f"{name} {ratio:.3f}" for name, ratio in each[-1].items())
        print(f"  {folder.name} session {repeat} (over the plain loop): {said}", flush=True)
    return runs, each


def plain_fit_run(setup: Setup, out: Path, threads: int, test: bool = False) -> dict[str, Any]:
    """:func:`benchmarks.plain.plain_fit` in a fresh process; returns what it measured (also written
    to ``out``), with ``test``: its test accuracy under ``"test_acc"``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    specs = [{"setup": asdict(setup), "test": test}]
    run([sys.executable, "-m", "benchmarks.plain", json.dumps(specs), str(out)], threads)
    return json.loads(out.read_text())[0]


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
    extra: Table | None = None,
) -> None:
    """Publish a template/plain comparison begun at ``started`` (``time.perf_counter``) with, as the
    headline, its worst case's ratio against ``goal`` and how many of its rounds reach it -- of the cases held
    to it (``"goal"``, default true), or every case's ratio where none is; ``extra``: a second table (header,
    rows)."""
    held = [case for case in cases if case.get("goal", True)]
    if held:
        worst = min(held, key=lambda case: case["ratio"])
        ratios = worst[f"{args.clock}_session_ratios"]
        headline = (
            f"{name}: min template/plain {what} ratio {worst['ratio']:.3f} on the {args.clock} clock "
            f"({worst['case']}; {len(ratios)} sessions in rotated orders, rounds of {ROUND} averaged, the median "
            f"over whole rounds; the sessions gave {min(ratios):.3f} to {max(ratios):.3f}); "
            f"{verdict(ratios, goal)}"
        )
    else:
        each = "; ".join(f"{case['case']}: {case['ratio']:.3f}" for case in cases)
        headline = f"{name}: template/plain {what} ratios on the {args.clock} clock, none held to the goal: {each}"
    seconds = time.perf_counter() - started
    where = machine(args.threads)
    sessions = (
        f"{args.repeats} sessions per case, each one process running every side twice, there and back, the order "
        f"rotated from session to session"
    )
    notes = f"{where}; {sessions}; {seconds:.0f} s"
    report = {"machine": where, "seconds": seconds}
    report.update(clock=args.clock, threads=args.threads, repeats=args.repeats, cases=cases)
    publish(args, name, report, header, rows, notes, headline, (extra,) if extra else ())


def publish(
    args: argparse.Namespace,
    name: str,
    report: dict[str, Any],
    header: list[str],
    rows: list[list[str]],
    notes: str,
    headline: str,
    extras: tuple[Table, ...] = (),
) -> None:
    """Write ``<name>.json`` (``report``, the command that made it and the headline) and ``<name>.md`` under
    ``args.out``, and print the table (and the ``extras``), the notes with the command and, as the last
    line, the headline."""
    tables = [(header, rows), *extras]
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    notes = f"{notes}; command: {args.command}"
    report = {**report, "command": args.command, "headline": headline}
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = "\n\n".join(markdown_table(h, r) for h, r in tables)
    (out / f"{name}.md").write_text(f"{markdown}\n\n{notes}\n\n{headline}\n")
    for h, r in tables:
        print(text_table(h, r))
    print(notes)
    print(headline)


def whole_number_above_0(text: str) -> int:
    """``--repeats``' value: a whole number above 0 (no session, run or seed measures nothing).

    >>> whole_number_above_0("3")
    3
    """
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number above 0")
    return int(digits)


def common_arguments(
    module: str, description: str, default_repeats: int, clock: bool = True
) -> argparse.ArgumentParser:
    """The options every benchmark has; ``module`` is how it is started (``benchmarks.overhead``); ``clock``:
    whether it has ``--clock`` (those that compare step times)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.set_defaults(module=module)
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    parser.add_argument(
        "--repeats",
        type=whole_number_above_0,
        default=default_repeats,
        help="how often each case is measured (sessions, runs or seeds: see the benchmark's notes)",
    )
    # One thread by default on a CPU: where other work shares the cores, a step split across several
    # OpenMP threads waits for the one that was descheduled (steps took 5-10x longer here, and varied
    # as much), and that noise would swamp a 2 % difference. Every side always gets the same.
    parser.add_argument(
        "--threads",
        type=int,
        default=0 if torch.cuda.is_available() else 1,
        help="intra-op threads (OMP_NUM_THREADS) of every side; 0: torch's default, one per core "
        "(default: 1 on a CPU-only machine, else 0)",
    )
    if not clock:
        return parser
    # The CPU clock on a CPU: with one intra-op thread and no worker processes, the CPU seconds a step
    # costs its process hardly change when other work shares the cores, while its wall time doubles.
    # Both are measured and shown; this one decides the headline.
    parser.add_argument(
        "--clock",
        choices=CLOCKS,
        default="wall" if torch.cuda.is_available() else "cpu",
        help="the clock of the headline ratio: wall (perf_counter after waiting for the device) or cpu (the "
        "process's CPU seconds, all threads; for a CPU-only run). Default: cpu on a CPU-only machine, else wall",
    )
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed options, with the command they came from (``command``) to be written beside the results."""
    args = parser.parse_args(argv)
    args.command = shlex.join(["python", "-m", args.module, *(sys.argv[1:] if argv is None else argv)])
    return args

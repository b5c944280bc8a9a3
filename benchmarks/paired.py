"""One session of a template/plain comparison: the three sides in one process, alternated.

``python -m benchmarks.paired '<json spec>' FOLDER`` (started by :func:`benchmarks._common.session`) runs
the spec's stage (``fit``, ``test`` or ``predict``) on its setup in this process, each side twice, in the
order :func:`order` gives for the spec's ``rotation``, and writes each side's results, in the order they ran,
to ``FOLDER/session.json``. The sides:

- ``plain``: the plain PyTorch loops of :mod:`benchmarks.plain`;
- ``lightning``: Lightning's loop around the plain loop's steps (:mod:`benchmarks.lightning_loop`), which
  shows what of the template's cost is Lightning's own;
- ``template``: the template through its real entry point (``project.__main__.main``, as ``python -m
  project`` calls it), with its defaults and the :class:`~benchmarks.stamps.StepStamps`
  callback.

Why the sides share a process: on this 2-core CPU the speed of a fresh process running a loop is partly
luck (where its memory happens to lie, which core it gets); with each side in processes of its own, the
last round's repeats of one side differed by 4-14 %, more than the 2 % to be resolved. Within one process
the sides' runs move together: a side's repeats still differ by 1-4 % as the machine drifts, but an
order that runs back the way it came cancels a steady drift, and the sessions' ratios spread by a point
or two. What such an order does not cancel is the place a run has in its session: in the two readings before
the order rotated (16 cases, order plain, lightning, template, template, lightning, plain), the runs in the
first and last places averaged 0.2-2 % above their session's mean and those in the two middle places up to
2 % below it, in 15 of the 16 cases -- the places the template always held, so a fixed order cannot tell
what the place costs from what the side costs. The sessions therefore rotate the order (:func:`order`):
over every three, each side runs once in each pair of places, and
:func:`benchmarks._common.round_means` averages within such rounds. In the first rotated reading the
places weighed nothing (each pair within 0.8 % of its session's mean over 8 cases) and the gaps were the
sides'; the rotation stays, so that no side's figure rests on its place.

Process-wide settings are made once, before the first run, as the template makes them, so every
side runs under the same (freed host memory reused on a CPU, cuDNN autotuning on a GPU); with
``--model.compile=true`` dynamo's caches are emptied before each run, so every side compiles afresh. A
session's first run pays the process's one-off costs -- the imports, the first
network's allocations -- in its first epoch or first batches, which no figure counts.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import SIDES, Setup, template_arguments, template_results
from benchmarks.lightning_loop import lightning_fit, lightning_infer
from benchmarks.plain import plain_fit, plain_infer, reuse_freed_host_memory

ONCE = ("template", "lightning", "plain")  # a session of the GPU pairs: each side once, the template first


def order(rotation: int, sides: tuple[str, ...] = SIDES) -> tuple[str, ...]:
    """The order of a session's runs: each side twice, there and back (which cancels a steady drift),
    starting from side ``rotation`` (mod their number) of ``sides``, so that as many sessions in a row as
    there are sides put each side once in each pair of places (first and last, second and fifth, the two
    middle ones, for three).

    >>> order(0), order(1)
    (('plain', 'lightning', 'template', 'template', 'lightning', 'plain'), \
('lightning', 'template', 'plain', 'plain', 'template', 'lightning'))
    """
    start = rotation % len(sides)
    turned = sides[start:] + sides[:start]
    return (*turned, *reversed(turned))


def settle_process(setup: Setup) -> None:
    """Make the process-wide settings once, before a session's first run, as the template makes them (its
    host_memory_reuse callback; cuDNN autotuning, which its Trainer would otherwise switch on halfway through
    the session): every run of the session goes under the same."""
    reuse_freed_host_memory(setup)
    torch.backends.cudnn.benchmark = True


def run_side(
    side: str, stage: str, setup: Setup, folder: Path, batch_size: int | None, template_options: Sequence[str] = ()
) -> dict[str, Any]:
    """One run of ``side`` in this process, writing under ``folder``; ``template_options``: added to the
    template's command."""
    folder.mkdir(parents=True, exist_ok=True)
    if setup.compile:  # else the later runs may hit dynamo's recompile limit and fall back to eager
        torch._dynamo.reset()
    if side == "lightning":
        if stage == "fit":
            return lightning_fit(setup, folder)
        return lightning_infer(setup, batch_size or setup.batch_size, stage == "predict", folder)
    if side == "plain":
        if stage == "fit":
            return plain_fit(setup, folder / "plain.json")
        return plain_infer(setup, batch_size or setup.batch_size, predict=stage == "predict")
    from project.__main__ import main

    main([*template_arguments(stage, setup, folder, batch_size), *template_options])
    return template_results(folder)


def main(spec: str, folder: str) -> None:
    """Run the session ``spec`` (``{"stage", "setup", "batch_size", "rotation"}``) and write
    ``folder/session.json``. With ``"once": true`` (the GPU pairs, :mod:`benchmarks.gpu_runs`) each side runs
    once, the template first (the process's one-off costs, cuDNN's autotuning and the compilation fall in its
    first epoch, which no figure counts), with ``template_options`` added to its command; a side that raises
    is recorded as ``{"error": ...}`` and the next one runs; the file is rewritten after each side, so a
    session stopped at a deadline keeps the sides it finished."""
    options = json.loads(spec)
    setup = Setup(**options["setup"])
    settle_process(setup)
    once = options.get("once", False)
    sides = ONCE if once else order(options["rotation"])
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for number, side in enumerate(sides):
        where = Path(folder) / f"{number}-{side}"
        extra = options.get("template_options", [])
        try:
            run = run_side(side, options["stage"], setup, where, options["batch_size"], extra)
        except (Exception, SystemExit) as err:  # the template's one-line errors exit
            if not once:
                raise
            traceback.print_exc()
            run = {"error": f"{type(err).__name__}: {err}"}
        results[side].append(run)
        Path(folder, "session.json").write_text(json.dumps(results))


if __name__ == "__main__":
    sys.argv, arguments = sys.argv[:1], sys.argv[1:]  # LightningCLI, called with its own arguments, warns otherwise
    main(*arguments)

"""Host work per inference batch, counted rather than timed: the Python calls of each side in a step and
between two steps, and where the template's come from.

``python -m benchmarks.host_calls`` runs MobileNetV2's ``test`` and ``predict`` at the settings of
``benchmarks.inference`` once per side -- the plain loop, Lightning's loop alone, the template with its defaults
(the sides of :mod:`benchmarks.paired`) -- in this one process, with every Python call counted
(``sys.setprofile``: Python functions and built-ins alike) in the two windows ``inference.md`` times: in the
step (from the batch's ``on_*_batch_start`` to its ``on_*_batch_end``, where the stamps are taken) and
between two steps. Each call is put down to where it comes from (:func:`origin`, the innermost frame that
says): this repository's code (a frame under ``project/`` -- the template's -- or ``benchmarks/`` -- the plain
loop, the lightning side's steps, the counting callback --, by function), the network (an ``nn.Module`` call: the
template's LightningModule's, so the network's forward and the module's own around it), Lightning's own work,
named by the function its loop called (``Lightning: logger_connector.on_batch_end``: that call and all under
it), or the rest (torch's functions called from none of these). The figures are means per batch over the
batches after the first 3 (the warm-up every side leaves out), with the garbage collector's collections per
batch (``gc.callbacks``) beside them: a side whose objects made the collector run would pay for it there. The
plain loop tells its counter directly where a step starts and ends; the Lightning sides' counts also hold
Lightning's dispatch of the counting callback's two hooks, a fixed handful of calls a batch, the same on both.

Why count: a MobileNetV2 test batch of the template's takes a few tenths of a millisecond longer than the
plain loop's on this CPU (``inference.md``, a few percent), and a ``perf`` profile (``docs/performance.md``)
put the clear part of the difference in the Python interpreter. On a shared 2-core machine that cannot be
timed to a tenth of a millisecond per batch; its calls can be counted exactly, whatever the load. So a
change that adds work per batch shows here as calls.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn

from benchmarks._common import REPO, RESULTS, SIDES, Setup, machine, parse, publish, template_arguments
from benchmarks.inference import MOBILENET, WARMUP_BATCHES
from benchmarks.lightning_loop import lightning_infer
from benchmarks.paired import settle_process
from benchmarks.plain import plain_infer
from project.toolkit.timing.tables import number

SETUP = replace(MOBILENET, test_batches=12)  # a batch's calls hardly vary after the warm-up
STAGES = ("test", "predict")
WINDOWS = ("step", "between")
NETWORK, REST = "the network", "torch and the rest"
LIGHTNING = "Lightning: "  # the origins in Lightning's loop: the function it called, or "the loop" itself
REPOSITORY = f"{REPO}/"
# Code of this repository's, named by file and function: the template's, and the benchmarks' own (the plain loop,
# the lightning side's steps, the counting callback).
OWN_CODE = tuple(f"{REPOSITORY}{folder}/" for folder in ("project", "benchmarks"))
# An nn.Module call's frames: everything under them is the network's.
MODULE_CALLS = {nn.Module._call_impl.__code__, nn.Module._wrapped_call_impl.__code__}
# Where Lightning's loops run: a frame of this repository's above them (the template's entry point, the lightning
# side's run) owns nothing.
LOOPS = "/lightning/pytorch/loops/"
SHOWN = 12  # origins listed in the second table: those whose calls differ most between the two sides
COLLECTIONS = "garbage collections"  # per_batch's key of a window's collections, which are not calls
LIGHTNING_SHOWN = 8  # origins listed in the third table per window: the biggest of Lightning's own


def origin(frame: FrameType | None) -> str:
    """Where the call made in ``frame`` comes from, by the innermost frame up to Lightning's loop that says: a
    frame of the template's or the benchmarks' code (``project/...py:function``, ``benchmarks/...``) or an
    ``nn.Module`` call (:data:`NETWORK`); else, under Lightning's loop, the function the loop called, by the last
    part of its module's name (``Lightning: call._call_callback_hooks``; ``Lightning: the loop`` for the calls the
    loop makes itself); :data:`REST` where no frame says."""
    called = None  # the frame the one in hand called, on the way up
    while frame is not None:
        code = frame.f_code
        if code in MODULE_CALLS:
            return NETWORK
        if code.co_filename.startswith(OWN_CODE):
            return f"{code.co_filename[len(REPOSITORY) :]}:{code.co_name}"
        if LOOPS in code.co_filename:
            if called is None:
                return f"{LIGHTNING}the loop"
            module = called.f_globals.get("__name__", "?").rpartition(".")[2]
            return f"{LIGHTNING}{module}.{called.f_code.co_name}"
        called, frame = frame, frame.f_back
    return REST


class CallCounter:
    """Counts the Python calls of this thread by :func:`origin`, one counter per window: a step (from
    :meth:`step_started` to :meth:`step_ended`) or the time between two steps (from one's end to the next one's
    start; the one after the last step is dropped by :meth:`stop`); and the garbage collector's collections in
    each window, under the key :data:`COLLECTIONS`."""

    def __init__(self) -> None:
        self.windows: dict[str, list[Counter[str]]] = {window: [] for window in WINDOWS}
        self._open: Counter[str] | None = None
        self.collections: dict[str, list[int]] = {window: [] for window in WINDOWS}  # each window's, in order
        self._window = ""  # the kind of window open

    def step_started(self) -> None:
        """A step starts: count into a new step window."""
        self._switch("step")

    def step_ended(self) -> None:
        """A step ended: count into a new window between steps."""
        self._switch("between")

    def stop(self) -> None:
        """Stop counting; the window open since the last step ended is not between two steps: dropped."""
        sys.setprofile(None)
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        if self._open is not None and self.windows["between"] and self.windows["between"][-1] is self._open:
            self.windows["between"].pop()
            self.collections["between"].pop()
        self._open = None

    def _switch(self, window: str) -> None:
        sys.setprofile(None)
        self._open, self._window = Counter(), window
        self.windows[window].append(self._open)
        self.collections[window].append(0)
        if self._collected not in gc.callbacks:
            gc.callbacks.append(self._collected)
        sys.setprofile(self._count)

    def _count(self, frame: FrameType, event: str, arg: Any) -> None:
        # (the collection callback below is the counter's own work: not counted)
        if event in ("call", "c_call") and self._open is not None and frame.f_code is not COLLECTED:
            self._open[origin(frame)] += 1

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start" and self._open is not None:
            self.collections[self._window][-1] += 1

    def per_batch(self) -> dict[str, dict[str, float]]:
        """Each window's mean calls per batch by origin, and its mean garbage collections per batch under
        :data:`COLLECTIONS`, over the batches after the warm-up."""
        means = {}
        for window, counters in self.windows.items():
            kept = counters[WARMUP_BATCHES:]
            seen = set().union(*kept)
            means[window] = {o: statistics.fmean(c[o] for c in kept) for o in seen}
            if kept:
                means[window][COLLECTIONS] = statistics.fmean(self.collections[window][WARMUP_BATCHES:])
        return means


COLLECTED = CallCounter._collected.__code__  # the collection callback's code: the counter's own, not counted


class CountedSteps(Callback):
    """A :class:`CallCounter` at a Lightning run's test and predict batch hooks, written to ``path`` (JSON:
    :meth:`CallCounter.per_batch`) when the run ends. Add it after the stamps, as :mod:`benchmarks.paired`
    adds them: ``--trainer.callbacks+=benchmarks.host_calls.CountedSteps --trainer.callbacks.path=...``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.counter = CallCounter()

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.counter.step_started()

    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.counter.step_ended()

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.counter.stop()
        self.path.write_text(json.dumps(self.counter.per_batch()))

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.counter.stop()  # a run that raised before its end: no profile hook or collection callback left behind

    on_predict_batch_start = on_test_batch_start
    on_predict_batch_end = on_test_batch_end
    on_predict_end = on_test_end


def counted(side: str, stage: str, setup: Setup, folder: Path) -> dict[str, dict[str, float]]:
    """One run of ``side`` on ``stage`` in this process, its calls counted: mean calls per batch by window and
    origin."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "calls.json"
    counter = CallCounter()  # the plain loop's; a Lightning run's is its CountedSteps callback's
    try:
        if side == "plain":
            plain_infer(setup, setup.batch_size, stage == "predict", observer=counter)
        elif side == "lightning":
            lightning_infer(setup, setup.batch_size, stage == "predict", folder, (CountedSteps(str(path)),))
        else:
            from project.__main__ import main as template_main

            # by its importable name: run as ``python -m``, this module is ``__main__``
            counting = ["--trainer.callbacks+=benchmarks.host_calls.CountedSteps", f"--trainer.callbacks.path={path}"]
            template_main([*template_arguments(stage, setup, folder), *counting])
    finally:
        counter.stop()
    return counter.per_batch() if side == "plain" else json.loads(path.read_text())


def total(calls: dict[str, float], only: str | None = None) -> float:
    """The calls of one window (origin: calls per batch, and its :data:`COLLECTIONS`, which are not calls), or
    those of the origin ``only``."""
    return sum(n for o, n in calls.items() if o != COLLECTIONS and (only is None or o == only))


def origins(calls: dict[str, float]) -> set[str]:
    """The origins of one window's calls."""
    return set(calls) - {COLLECTIONS}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_calls", description=__doc__.splitlines()[0])
    parser.set_defaults(module="benchmarks.host_calls", threads=0)  # counts do not depend on threads
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    args = parse(parser, argv)
    started, where = time.perf_counter(), machine(args.threads)
    print(f"host_calls: {where}", flush=True)
    settle_process(SETUP)  # as in a session: every side runs under the template's process-wide settings
    calls: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="host-calls-") as work:
        for stage in STAGES:
            calls[stage] = {side: counted(side, stage, SETUP, Path(work) / f"{stage}-{side}") for side in SIDES}
    rows = []
    for stage in STAGES:
        for side in SIDES:
            step, between = (calls[stage][side][w] for w in WINDOWS)
            over_plain = total(step) + total(between) - total(calls[stage]["plain"]["step"])
            over_plain -= total(calls[stage]["plain"]["between"])
            figures = [total(step), total(step, NETWORK), total(between), total(step) + total(between), over_plain]
            collections = step[COLLECTIONS] + between[COLLECTIONS]
            rows.append([stage, side, *(number(f, 0) for f in figures), number(collections, 2)])
    header = ["stage", "side", "in the step", "of them the network's", "between steps", "a batch", "over plain"]
    header += ["garbage collections a batch"]
    differ_header = ["stage", "window", "origin", "lightning", "template", "template over lightning"]
    differ_rows = []
    for stage in STAGES:
        for window in WINDOWS:
            light, tmpl = (calls[stage][side][window] for side in ("lightning", "template"))
            differ = [o for o in origins(light) | origins(tmpl) if tmpl.get(o, 0) != light.get(o, 0)]
            for name in sorted(differ, key=lambda o: (-abs(tmpl.get(o, 0) - light.get(o, 0)), o))[:SHOWN]:
                by_lightning, by_template = light.get(name, 0), tmpl.get(name, 0)
                difference = f"{by_template - by_lightning:+.1f}"
                differ_rows.append([stage, window, name, number(by_lightning, 1), number(by_template, 1), difference])
    # Where Lightning's loop alone makes its calls: what no option of the template's removes.
    lightning_header = ["stage", "window", "origin", "lightning's calls"]
    lightning_rows = []
    for stage in STAGES:
        for window in WINDOWS:
            light = calls[stage]["lightning"][window]
            own = [o for o in origins(light) if o.startswith(LIGHTNING)]
            biggest = sorted(own, key=lambda o: (-light[o], o))[:LIGHTNING_SHOWN]
            lightning_rows += [[stage, window, name, number(light[name], 1)] for name in biggest]
    test = calls["test"]
    plain = sum(total(test["plain"][w]) for w in WINDOWS)
    light_step, light_between, template_step, template_between = (
        total(test[side][w]) for side in ("lightning", "template") for w in WINDOWS
    )
    headline = (
        f"host_calls: a MobileNetV2 test batch makes {plain:.0f} Python calls in the plain loop, "
        f"{light_step + light_between - plain:+.0f} in Lightning's loop alone and "
        f"{template_step + template_between - light_step - light_between:+.0f} more in the template "
        f"({template_step - light_step:+.0f} in the step, {template_between - light_between:+.0f} between steps)"
    )
    notes = (
        f"{where}; {SETUP.label}, batch {SETUP.batch_size}, {SETUP.test_batches} batches a run, means over those "
        f"after the first {WARMUP_BATCHES}; one run per side in one process; the Lightning sides' counts hold "
        f"Lightning's dispatch of the counting callback's hooks; the second table: the {SHOWN} origins whose calls "
        f"differ most between Lightning's loop and the template; the third: the {LIGHTNING_SHOWN} biggest of "
        f"Lightning's own origins on the lightning side in each window; "
        f"{time.perf_counter() - started:.0f} s"
    )
    report = {"machine": where, "setup": SETUP.__dict__, "calls": calls}
    tables = ((differ_header, differ_rows), (lightning_header, lightning_rows))
    publish(args, "host_calls", report, header, rows, notes, headline, extras=tables)


if __name__ == "__main__":
    main()

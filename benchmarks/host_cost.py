"""The host's cost of a training step: the template against Lightning's bare loop and the plain loop, with a network
so small that a step is almost nothing but the loop's own Python (``make bench-host``).

On a GPU the step of the real job is host-bound: every millisecond of Python and every wait shows, while on a CPU
the convolutions hide it. A negligible network (:func:`tiny_linear` on 8 px images, batch 64, one thread) brings
that host cost to the fore on a CPU: the three sides of :mod:`benchmarks.paired` (plain, Lightning's bare loop,
the template through ``python -m project fit`` with its default options), each run twice there and back in one
process, the order rotated from session to session. The session runs in a pseudo-terminal, so the template's
progress bar draws as a person sees it. Between the template's two runs, one run per default callback with that
callback switched off: its cost is the template's ms per step less that run's.

The headline is the template's steady speed over Lightning's bare loop (``template/lightning``): the part of the
step that is the template's own. Figures are medians of step cycles over the epochs after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch import nn

from benchmarks._common import (
    REPO,
    Setup,
    balanced,
    common_arguments,
    environment,
    machine,
    on,
    parse,
    publish,
    steady_step_cycle,
    template_arguments,
    verdict,
)
from project.toolkit.callbacks import DEFAULT_CALLBACKS, OFF_BY_DEFAULT, left_out_of

GOAL = 0.90  # template / Lightning's bare loop, steady training steps
SETUP = Setup(arch="benchmarks.host_cost.tiny_linear", image_size=8, batch_size=64, train_batches=400, epochs=3)
SIDES = ("plain", "lightning", "template")
# The default callbacks a fit runs, each switched off once per session.
SWITCHED = tuple(name for name in DEFAULT_CALLBACKS if name not in left_out_of("fit") | OFF_BY_DEFAULT)
SESSION_TIMEOUT_S = 900


def tiny_linear(num_classes: int, in_channels: int = 3) -> nn.Module:
    """A network that costs next to nothing: one ``Linear`` on the flattened 8 x 8 image."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 8 * 8, num_classes))


def runs_of(rotation: int, switched: tuple[str, ...] = SWITCHED) -> list[tuple[str, str | None]]:
    """A session's runs as ``(side, callback switched off)``: each side there and back, the order rotated by
    ``rotation``; after the first template run, each callback off followed by the template again (a run's speed
    drifts within a session: each such run is compared with the template runs on either side of it).

    >>> runs_of(0, ("timing",))
    [('plain', None), ('lightning', None), ('template', None), ('template', 'timing'), ('template', None), \
('template', None), ('lightning', None), ('plain', None)]
    """
    start = rotation % len(SIDES)
    turned = [(side, None) for side in SIDES[start:] + SIDES[:start]]
    middle = turned.index(("template", None)) + 1
    offs = [run for name in switched for run in (("template", name), ("template", None))]
    return turned[:middle] + offs + turned[middle:] + list(reversed(turned))


def step_figures(clock: dict[str, Any]) -> dict[str, float]:
    """ms per steady step on the wall and the CPU clocks."""
    return {f"{c}_ms": 1e3 * steady_step_cycle(on(clock, c)) for c in ("wall", "cpu")}


def run_session(rotation: int, folder: Path) -> None:
    """One session in this process (started by :func:`session` in a pseudo-terminal): ``folder/session.json``."""
    from benchmarks.paired import run_side, settle_process
    from project.__main__ import main

    settle_process(SETUP)
    results = []
    for number, (side, off) in enumerate(runs_of(rotation)):
        where = folder / f"{number}-{side}{'-no-' + off if off else ''}"
        if off is None:
            clock = run_side(side, "fit", SETUP, where, None)["clock"]
        else:
            main([*template_arguments("fit", SETUP, where), f"--callbacks.{off}=false"])
            clock = json.loads((where / "clock.json").read_text())
        results.append({"side": side, "off": off, **step_figures(clock)})
    (folder / "session.json").write_text(json.dumps(results))


def session(rotation: int, folder: Path, threads: int) -> list[dict[str, Any]]:
    """:func:`run_session` in a fresh process whose terminal is a pseudo-terminal; its screen goes to
    ``folder/terminal.log``."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "benchmarks.host_cost", "--session", str(rotation), "--out", str(folder)]
    leader, follower = pty.openpty()
    env = {**environment(threads), "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    started = time.monotonic()
    with open(folder / "terminal.log", "wb") as screen:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            screen.write(chunk)
            if time.monotonic() - started > SESSION_TIMEOUT_S:
                process.kill()
    os.close(leader)
    if process.wait() != 0:
        tail = (folder / "terminal.log").read_bytes()[-3000:].decode(errors="replace")
        raise RuntimeError(f"host-cost session {rotation} failed ({process.returncode}):\n{tail}")
    return json.loads((folder / "session.json").read_text())


def summarise(session_runs: list[dict[str, Any]], clock: str) -> dict[str, Any]:
    """A session's figures on ``clock``: each side's mean ms per step, the ratios of speeds, and each callback's
    cost (the template's ms per step less that of the run with the callback off)."""
    key = f"{clock}_ms"
    ms = {
        side: statistics.fmean(r[key] for r in session_runs if r["side"] == side and r["off"] is None) for side in SIDES
    }
    costs = {  # each run with a callback off against the template runs just before and after it
        run["off"]: (session_runs[i - 1][key] + session_runs[i + 1][key]) / 2 - run[key]
        for i, run in enumerate(session_runs)
        if run["off"] is not None
    }
    return {
        "ms_per_step": ms,
        "template/lightning": ms["lightning"] / ms["template"],
        "template/plain": ms["plain"] / ms["template"],
        "lightning/plain": ms["plain"] / ms["lightning"],
        "callback_ms": costs,
    }


def report(sessions: list[list[dict[str, Any]]], clock: str) -> tuple[dict[str, Any], list[list[str]], list[list[str]]]:
    """The balanced ratios over the sessions, the median ms per step and callback costs, and their two tables."""
    each = [summarise(s, clock) for s in sessions]
    ratios = {
        name: balanced([e[name] for e in each]) for name in ("template/lightning", "template/plain", "lightning/plain")
    }
    ms = {side: statistics.median(e["ms_per_step"][side] for e in each) for side in SIDES}
    costs = {name: statistics.median(e["callback_ms"][name] for e in each) for name in each[0]["callback_ms"]}
    batch = SETUP.batch_size
    rows = [[side, f"{ms[side]:.3f}", f"{1e3 * batch / ms[side]:,.0f}"] for side in SIDES]
    rows += [[name, f"{value:.3f}", ""] for name, value in ratios.items()]
    cost_rows = [[name, f"{value:+.3f}", f"{100 * value / ms['template']:+.1f} %"] for name, value in costs.items()]
    figures = {"ms_per_step": ms, "ratios": ratios, "callback_ms": costs, "sessions": each}
    return figures, rows, cost_rows


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.host_cost", __doc__.split("\n\n")[0], default_repeats=3)
    parser.add_argument("--session", type=int, default=None, help=argparse.SUPPRESS)  # one session, in this process
    args = parse(parser, argv)
    if args.session is not None:
        sys.argv = sys.argv[:1]  # LightningCLI, called with its own arguments, warns otherwise
        run_session(args.session, args.out)
        return
    started, sessions = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as scratch:
        for rotation in range(args.repeats):
            sessions.append(session(rotation, Path(scratch) / f"session-{rotation}", args.threads))
            said = summarise(sessions[-1], args.clock)
            print(
                f"  session {rotation}: template/lightning {said['template/lightning']:.3f} ({args.clock})", flush=True
            )
    figures, rows, cost_rows = report(sessions, args.clock)
    per_session = [e["template/lightning"] for e in figures["sessions"]]
    headline = (
        f"host_cost: template/lightning {figures['ratios']['template/lightning']:.3f} on the {args.clock} clock, "
        f"default options with the progress bar in a terminal ({len(per_session)} sessions: "
        f"{min(per_session):.3f} to {max(per_session):.3f}); {verdict(per_session, GOAL)}"
    )
    seconds = time.perf_counter() - started
    setup = f"{SETUP.arch} at {SETUP.image_size} px, batch {SETUP.batch_size}, "
    setup += f"{SETUP.train_batches} steps x {SETUP.epochs} epochs"
    notes = f"{machine(args.threads)}; {setup}; {args.repeats} sessions in a pseudo-terminal; {seconds:.0f} s"
    result = {"machine": machine(args.threads), "setup": asdict(SETUP), "clock": args.clock, "seconds": seconds}
    header = ["side or ratio", f"ms per step ({args.clock})", "images/s"]
    extra = (["callback switched off", "its cost, ms per step", "of the template's step"], cost_rows)
    publish(args, "host_cost", {**result, **figures}, header, rows, notes, headline, (extra,))


if __name__ == "__main__":
    main()

"""Running the cells, each ``fit`` then ``test --ckpt_path=last`` in fresh processes, once, and reading back results."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

from project.tools.bench.config import LIMITS, BenchConfig, Cell, strategy_options

MARKER = "bench-cell.json"  # a cell's outcome, in its run folder


def cell_args(config: BenchConfig, cell: Cell, runs: Path) -> list[str]:
    """The options ``fit`` and ``test`` share: the cell's settings, the preset's and variant's args, and its own
    folder, whose ``lightning_logs/version_0`` is the one TensorBoard run (``--ckpt_path=last`` finds the fit's)."""
    args = [*strategy_options(cell.strategy), f"--trainer.devices={cell.devices}"]
    args += [f"--trainer.accelerator={config.accelerator}", f"--trainer.precision={cell.precision}"]
    args += [f"--trainer.max_epochs={config.epochs}", f"--model.arch={cell.arch}"]
    args += [f"--data.batch_size={cell.batch_size}", f"--data.image_size={config.image_size}"]
    args += ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={runs / cell.name}"]
    args += ["--trainer.logger.class_path=project.toolkit.callbacks.views.TensorBoardLogger"]  # no placeholder cards
    args += [f"--trainer.logger.init_args.save_dir={runs / cell.name}", "--trainer.logger.init_args.version=0"]
    for key in LIMITS:
        if getattr(config, key) is not None:
            args.append(f"--trainer.{key}={getattr(config, key)}")
    if config.target_acc is not None:
        args.append(f"--timing.target_acc=[{config.target_acc}]")
    return args + config.args + config.variant_args(cell.variant)


def run_folder(runs: Path, cell: Cell) -> Path:
    """Where a cell's fit and test log (the layout of Lightning's default TensorBoard logger)."""
    return runs / cell.name / "lightning_logs" / "version_0"


def project_command(subcommand: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "project", subcommand, *args]


# The sessions being waited on (process groups); whether this process is ending (no session starts then); the
# threads between starting a session and registering it, where SIGTERM's handler must not raise.
_LIVE_SESSIONS: set[int] = set()
_ENDING = threading.Event()
_STARTING: set[int] = set()
SIGTERM_STATUS = 128 + signal.SIGTERM  # as a shell reports a process SIGTERM ended


def run_in_own_session(
    command: list[str],
    stdout: IO | int | None,
    stderr: IO | int | None,
    timeout_s: float,
    cwd: Path | None = None,
    watch: Callable[[], None] | None = None,
    preexec_fn: Callable[[], Any] | None = None,
) -> int | None:
    """``command``'s exit status, or None past ``timeout_s``. In a session of its own, so a timeout, Ctrl-C or SIGTERM
    ends the launcher AND every rank it started; once the process is ending it raises ``SystemExit`` instead.
    ``watch``: called every second while it runs; what it raises ends the session and is raised. ``preexec_fn``:
    Popen's."""
    if _ENDING.is_set():
        raise SystemExit(SIGTERM_STATUS)
    _STARTING.add(threading.get_ident())
    try:
        session = dict(cwd=cwd, start_new_session=True, preexec_fn=preexec_fn)
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, **session)
        _LIVE_SESSIONS.add(process.pid)
    finally:
        _STARTING.discard(threading.get_ident())
    try:
        code = None if _ENDING.is_set() else _wait(process, timeout_s, watch)
        if _ENDING.is_set():  # SIGTERM came while it started, or ended it: no status to report
            raise SystemExit(SIGTERM_STATUS)
        return code
    except BaseException as err:  # a timeout, Ctrl-C or SIGTERM: leave no ranks behind
        with contextlib.suppress(ProcessLookupError):  # it ended just now
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if isinstance(err, subprocess.TimeoutExpired):
            return None
        raise
    finally:
        _LIVE_SESSIONS.discard(process.pid)


WATCH_EVERY_S = 1.0  # how often run_in_own_session calls its watch


def _wait(process: subprocess.Popen, timeout_s: float, watch: Callable[[], None] | None) -> int:
    """``process``'s exit status, calling ``watch`` every second meanwhile; ``TimeoutExpired`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while watch is not None and time.monotonic() + WATCH_EVERY_S < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return process.wait(timeout=WATCH_EVERY_S)
        watch()
    return process.wait(timeout=max(deadline - time.monotonic(), 0))


def end_all_sessions() -> None:
    """End every session waited on, in any thread, and start no more (Ctrl-C reaches only the main thread)."""
    _ENDING.set()
    for group in list(_LIVE_SESSIONS):
        with contextlib.suppress(ProcessLookupError, PermissionError):  # ended already
            os.killpg(group, signal.SIGKILL)


@contextlib.contextmanager
def ending_sessions_on_sigterm() -> Iterator[None]:
    """Inside it (entered in the main thread), SIGTERM ends every session waited on, then this process (status 143),
    as Ctrl-C does; by default the sessions, in process groups the signal does not reach, would run on."""

    def end_sessions(signum: int, frame: FrameType | None) -> None:
        end_all_sessions()
        if threading.get_ident() not in _STARTING:  # else run_in_own_session raises, once it can end the session
            raise SystemExit(SIGTERM_STATUS)

    previous = signal.signal(signal.SIGTERM, end_sessions)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _ENDING.clear()  # its sessions are over: a process may go on to run others (tests do)


def run_logged(command: list[str], log_stem: Path, timeout_s: float, **session: Any) -> str | None:
    """Run ``command`` into ``<log_stem>.out`` / ``.err``; None on success, else the last line of its stderr.
    ``session``: :func:`run_in_own_session`'s ``watch`` and ``preexec_fn``."""
    with open(f"{log_stem}.out", "w") as out, open(f"{log_stem}.err", "w") as err:
        code = run_in_own_session(command, out, err, timeout_s, **session)
    if code is None:
        return f"timed out after {timeout_s / 60:g} min"
    if code == 0:
        return None
    lines = [line.strip() for line in Path(f"{log_stem}.err").read_text(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), f"exit code {code}")


def _finished(cell_dir: Path, args: list[str]) -> bool:
    try:
        marker = json.loads((cell_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("status") == "ok" and marker.get("args") == args


def run_cell(config: BenchConfig, cell: Cell, runs: Path) -> dict[str, Any]:
    """Fit then test one cell in fresh processes, from an empty run folder; record the outcome."""
    cell_dir = runs / cell.name
    shutil.rmtree(cell_dir, ignore_errors=True)  # an interrupted earlier attempt leaves nothing behind
    cell_dir.mkdir(parents=True)
    args = cell_args(config, cell, runs)
    fit, test = project_command("fit", args), project_command("test", [*args, "--ckpt_path=last"])
    start, timeout_s = time.perf_counter(), config.timeout_minutes * 60
    error = run_logged(fit, cell_dir / "fit", timeout_s)
    if error is None:
        error = run_logged(test, cell_dir / "test", timeout_s)
        error = None if error is None else f"test: {error}"
    seconds, status = round(time.perf_counter() - start, 1), "ok" if error is None else "failed"
    outcome = dict(status=status, error=error, cell_seconds=seconds, args=args, fit_command=fit, test_command=test)
    (cell_dir / MARKER).write_text(json.dumps(outcome, indent=2) + "\n")
    return outcome


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def run_matrix(config: BenchConfig, cells: list[Cell], runs: Path) -> None:
    """Run every cell not finished yet, printing progress: cell i/N, elapsed, estimate left."""
    todo = [c for c in cells if not _finished(runs / c.name, cell_args(config, c, runs))]
    print(f"bench: {len(cells)} cells, {len(cells) - len(todo)} finished before, {len(todo)} to run", flush=True)
    start, ran = time.perf_counter(), 0
    for i, cell in enumerate(cells, 1):
        prefix = f"[{i}/{len(cells)}] {cell.name}"
        if cell not in todo:
            print(f"{prefix}: finished before, not run again", flush=True)
            continue
        print(f"{prefix}: running", flush=True)
        outcome = run_cell(config, cell, runs)
        ran += 1
        elapsed = time.perf_counter() - start
        left = elapsed / ran * (len(todo) - ran)
        ok = outcome["status"] == "ok"
        result = "ok" if ok else f"FAILED ({outcome['error']})"
        times = f"in {outcome['cell_seconds']:.0f} s | elapsed {_clock(elapsed)} | left ~{_clock(left)}"
        print(f"{prefix}: {result} {times}{accuracy_text(run_folder(runs, cell)) if ok else ''}", flush=True)


def accuracy_text(run: Path) -> str:
    """`` | val acc best 0.812, last 0.790, test 0.801 | 0.7 reached in 3.2 s``: a finished cell's accuracy, if any."""
    try:
        timing = json.loads((run / "timing.json").read_text())
    except (OSError, ValueError):
        return ""
    if timing.get("best_val_acc") is None:
        return ""
    text = f" | val acc best {timing['best_val_acc']:.3f}, last {timing['last_val_acc']:.3f}"
    text += f", test {timing['test_acc']:.3f}" if timing.get("test_acc") is not None else ""
    for target, seconds in (timing.get("seconds_to_target_acc") or {}).items():
        text += f" | {target} not reached" if seconds is None else f" | {target} reached in {seconds:.1f} s"
    return text


def collect(cells: list[Cell], runs: Path) -> list[dict[str, Any]]:
    """One row per cell: the cell (``variant`` only where there are several), its outcome, its ``timing.json``."""
    rows = []
    for cell in cells:
        cell_dir = runs / cell.name
        settings = {k: v for k, v in dataclasses.asdict(cell).items() if k != "strategy" and (v or k != "variant")}
        row = {"cell": cell.name, "status": "not run", "error": None, "bench_strategy": cell.strategy, **settings}
        if (cell_dir / MARKER).is_file():
            marker = json.loads((cell_dir / MARKER).read_text())
            row.update(status=marker["status"], error=marker["error"], cell_seconds=marker["cell_seconds"])
        timing = run_folder(runs, cell) / "timing.json"
        if row["status"] == "ok" and timing.is_file():
            row.update(json.loads(timing.read_text()))
        rows.append(row)
    return rows

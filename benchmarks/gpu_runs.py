"""``bash benchmarks/gpu_run.sh RESULTS_DIR``: the template against Lightning's bare loop and the plain loop on one
GPU, side by side, in at most 7 minutes; every finished pair in ``RESULTS_DIR/runs.json``.

Each mode is one session (:mod:`benchmarks.paired`, ``once``): one fresh process runs the template (its real entry
point with its default options, the progress bar off, :class:`~project.toolkit.timing.step_profile.StepProfile`
on steps 20-24 of its first epoch), then Lightning's bare loop (:mod:`benchmarks.lightning_loop`), then the plain
loop (:mod:`benchmarks.plain`), each for 3 epochs of :data:`STEPS` steps of 256 synthetic images at 112 px; a
figure is a side's images/s over its last two epochs, so the ratios are of the same device in the same minute. The
template goes first: its first epoch takes the process's one-off costs (cuDNN's autotuning, the compilation),
which no figure counts. In order: MobileNetV2 fp32 eager, bf16 CUDA graphs, bf16 eager; ResNet50 bf16 eager and
CUDA graphs; the folder path's input rate (:mod:`benchmarks.folder_input`: generated JPEGs decoded by one
DataLoader worker a core, beside the template's fastest training speed); then, if time is left, MobileNetV2 bf16
compiled (``default``). A mode whose estimate would end
after the deadline is skipped, a running one stopped at it or at twice its estimate (the sides it finished are
kept).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import gpu_common
from benchmarks._common import Setup
from benchmarks._figures import epoch_throughput
from project.tools.bench.matrix import ending_sessions_on_sigterm

DEADLINE_S = 420
STEPS = 50  # training steps an epoch: the steady window (every epoch after the first) holds 100 steps of 256
EPOCHS = 3
BATCH = 256
PROFILE = "project.toolkit.timing.step_profile.StepProfile"  # its default window: steps 20-24, first epoch
TEMPLATE_OPTIONS = ["--trainer.enable_progress_bar=false", f"--trainer.callbacks+={PROFILE}"]
ENVIRONMENT_S = 5  # nvidia-smi, lscpu, the versions
OVERRUN = 2.0  # a session is stopped at this many times its estimate, or at the deadline if sooner
FOLDER_INPUT_S = 30  # benchmarks.folder_input: 64 photos generated on 16 cores, 3 epochs of 1,024 files

# The last lease's real times (one H200, 2026-11-27, issue 43), each in one call on one machine: a template fit of
# 2 epochs of 45,000 training and 5,000 validation images took FIT_S seconds at TEMPLATE_IPS steady images/s;
# the plain loop ran the same job at PLAIN_IPS. The template under CUDA graphs was not reached: its fit and speed
# are taken as the compiled run's; ResNet50 was not compiled: its compiled fit is its eager fit plus what compiling
# added to MobileNetV2's.
LEASE_IMAGES = 2 * (45_000 + 5_000)
CUDA_START_S = 30.0  # a fresh machine's first fit (83 s) over the same fit later (53 s): once, in the first mode
COMPILE_S = 150.0 - 96.0  # MobileNetV2 bf16: compiled fit less eager fit (the 10.7 s recompile for validation in)
RECOMPILE_S = 10.7  # a later side compiles the same network again, its caches warm: the lease's recompile
LOOP_SETUP_S = 1.0  # a loop's network, its data split and one validation batch, in a process already running


@dataclass(frozen=True)
class Lease:
    """One mode's figures from the lease."""

    fit_s: float  # the template's eager fit (a compiled mode adds COMPILE_S)
    template_ips: float
    plain_ips: float


LEASE = {
    ("mobilenet_v2", "32-true", None): Lease(53, 8_021, 13_012),
    ("mobilenet_v2", "bf16-mixed", None): Lease(96, 6_593, 12_531),
    ("mobilenet_v2", "bf16-mixed", "default"): Lease(96, 9_043, 10_060),
    ("mobilenet_v2", "bf16-mixed", "reduce-overhead"): Lease(96, 9_043, 31_963),
    ("resnet50", "bf16-mixed", None): Lease(58, 7_428, 9_243),
    ("resnet50", "bf16-mixed", "reduce-overhead"): Lease(58, 7_428, 9_243),
}


@dataclass(frozen=True)
class Mode:
    """One pair of the script: the three sides on one network, precision and compile mode (None: eager)."""

    name: str
    arch: str = "mobilenet_v2"
    precision: str = "bf16-mixed"
    compile_mode: str | None = None
    if_time_left: bool = False

    def setup(self, steps: int = STEPS) -> Setup:
        """The job every side runs: 112 px, batch 256, 3 epochs of ``steps`` steps, one validation batch."""
        compiled = {"compile": True, "compile_mode": self.compile_mode} if self.compile_mode else {}
        options = {"image_size": 112, "batch_size": BATCH, "train_batches": steps, "epochs": EPOCHS, **compiled}
        return Setup(self.arch, precision=self.precision, **options)

    def estimate_s(self, steps: int = STEPS, first: bool = False) -> float:
        """Seconds for the session, from the lease: the template's fit scaled to this fit's images (plus the
        compilation); each loop's images at its speed (Lightning's bare loop between the template's and the plain
        loop's), its setup and, compiled, its recompile; CUDA's start in the first mode."""
        lease = LEASE[(self.arch, self.precision, self.compile_mode)]
        images = EPOCHS * steps * BATCH
        template = lease.fit_s * (images + (EPOCHS + 1) * BATCH) / LEASE_IMAGES  # and a validation batch an epoch
        compiled = self.compile_mode is not None
        lightning_ips = (lease.template_ips * lease.plain_ips) ** 0.5
        loops = sum(images / ips + LOOP_SETUP_S + RECOMPILE_S * compiled for ips in (lightning_ips, lease.plain_ips))
        return template + COMPILE_S * compiled + loops + CUDA_START_S * first


MODES = [
    Mode("mobilenet_v2 fp32 eager", precision="32-true"),
    Mode("mobilenet_v2 bf16 CUDA graphs", compile_mode="reduce-overhead"),
    Mode("mobilenet_v2 bf16 eager"),
    Mode("resnet50 bf16 eager", arch="resnet50"),
    Mode("resnet50 bf16 CUDA graphs", arch="resnet50", compile_mode="reduce-overhead"),
    Mode("mobilenet_v2 bf16 compiled", compile_mode="default", if_time_left=True),
]


def estimates(modes: list[Mode], steps: int = STEPS) -> list[int]:
    """Each mode's estimate in whole seconds, rounded up; CUDA's start in the first."""
    return [int(-(-mode.estimate_s(steps, first=i == 0) // 1)) for i, mode in enumerate(modes)]


def plan_lines(modes: list[Mode], deadline_s: float = DEADLINE_S, steps: int = STEPS) -> list[str]:
    """Each step with its estimate, and the total of those that always run (at most ``deadline_s``)."""
    seconds = estimates(modes, steps)
    lines = [f"{ENVIRONMENT_S:>5} s  environment: nvidia-smi, lscpu, versions"]
    lines += [f"{s:>5} s  {m.name}" for m, s in zip(modes, seconds, strict=True) if not m.if_time_left]
    total = ENVIRONMENT_S + sum(s for m, s in zip(modes, seconds, strict=True) if not m.if_time_left)
    lines.append(f"{FOLDER_INPUT_S:>5} s  folder input: JPEGs decoded by one DataLoader worker a core (CPU only)")
    total += FOLDER_INPUT_S
    lines.append(f"{total:>5} s  in all (deadline {deadline_s:.0f} s); then, if time is left:")
    lines += [f"{s:>5} s  {m.name}" for m, s in zip(modes, seconds, strict=True) if m.if_time_left]
    each = f"each: template, Lightning's bare loop, plain loop in one process, {EPOCHS} epochs of {steps} steps"
    return [*lines, f"{'':>5}    ({each}; estimates from the last lease's times, benchmarks/gpu_runs.py)"]


def session_command(
    mode: Mode, folder: Path, steps: int = STEPS, setup: Setup | None = None, template_options: list[str] | None = None
) -> list[str]:
    """The session of ``mode`` (or of ``setup``): ``python -m benchmarks.paired`` running each side once, writing
    under ``folder``; ``template_options`` (default :data:`TEMPLATE_OPTIONS`) added to the template's command."""
    setup = setup or mode.setup(steps)
    spec = {"stage": "fit", "setup": asdict(setup), "batch_size": None, "rotation": 0, "once": True}
    spec["template_options"] = TEMPLATE_OPTIONS if template_options is None else template_options
    return [sys.executable, "-m", "benchmarks.paired", json.dumps(spec), str(folder)]


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None where either is missing.

    >>> ratio(9_000.0, 10_000.0), ratio(None, 10_000.0), ratio(9_000.0, 0.0)
    (0.9, None, None)
    """
    return numerator / denominator if numerator and denominator else None


def side_figures(side: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A side's steady images/s (its epochs after the first; the template's from its ``timing.json``) and its
    error."""
    if not runs:
        return {"images_per_second": None, "error": "did not run"}
    run = runs[0]
    if "error" in run:
        return {"images_per_second": None, "error": run["error"]}
    if side == "template":
        return {"images_per_second": run.get("train_samples_per_second"), "error": None}
    return {"images_per_second": epoch_throughput(run["epochs"]), "error": None}


def pair_record(mode: Mode, session: dict[str, list[dict[str, Any]]], profile: dict[str, Any] | None) -> dict[str, Any]:
    """A mode's record in ``runs.json``: each side's steady images/s, the template's over each loop's, its host
    syncs per profiled step, and what its ``timing.json`` says of the run."""
    sides = {side: side_figures(side, session.get(side, [])) for side in ("template", "lightning", "plain")}
    ips = {side: figures["images_per_second"] for side, figures in sides.items()}
    timing = (session.get("template") or [{}])[0]
    peaks = [mb for mb in timing.get("peak_memory_mb") or [] if mb is not None]
    return {
        "name": mode.name,
        "arch": mode.arch,
        "precision": mode.precision,
        "compile_mode": mode.compile_mode,
        "images_per_second": ips,
        "ratio_to_plain": ratio(ips["template"], ips["plain"]),
        "ratio_to_lightning": ratio(ips["template"], ips["lightning"]),
        "host_syncs": profile.get("host_syncs") if profile else None,
        "errors": {side: figures["error"] for side, figures in sides.items() if figures["error"]},
        "first_epoch_seconds": timing.get("first_epoch_seconds"),
        "mfu": timing.get("mfu"),
        "bandwidth_fraction": timing.get("bandwidth_fraction"),
        "data_wait_fraction": timing.get("data_wait_fraction"),
        "peak_memory_mib": max(peaks) if peaks else None,
        "step_anatomy": ((timing.get("step_anatomy") or {}).get("ranks") or [None])[0],
        "step_profile": profile,
        "git_commit": (timing.get("environment") or {}).get("git_commit"),
    }


def status(code: int | None, errors: dict[str, str]) -> str:
    """A session's outcome from its exit status (None: stopped at its time limit) and its sides' errors.

    >>> status(0, {}), status(None, {}), status(0, {"plain": "did not run"}), status(1, {})
    ('pass', 'stopped at its time limit', 'failed: plain', 'exit 1')
    """
    if code is None:
        return "stopped at its time limit"
    if code != 0:
        return f"exit {code}"
    return f"failed: {', '.join(errors)}" if errors else "pass"


def summary_line(record: dict[str, Any]) -> str:
    """``<mode>: pass in 58 s; images/s template 9000, ...; template/plain 0.703; template/lightning 0.844``."""
    speeds = ", ".join(f"{side} {ips:.0f}" for side, ips in record["images_per_second"].items() if ips)
    ratios = [(side, record[f"ratio_to_{side}"]) for side in ("plain", "lightning")]
    said = [f"template/{side} {value:.3f}" for side, value in ratios if value is not None]
    head = f"{record['name']}: {record['status']} in {record['seconds']:.0f} s"
    return "; ".join([head, f"images/s {speeds or 'none'}", *said])


def loader_line(record: dict[str, Any]) -> str:
    """The folder path's images/s beside the template's fastest training speed of the call.

    >>> fast = {"template_fastest_images_per_second": 12000.0, "ratio_to_template": 0.2}
    >>> loader_line({"images_per_second": 2400.0, "workers": 16, **fast})
    "images/s 2400 with 16 workers, 0.20 of the template's fastest training (12000)"
    >>> loader_line({})
    'no figure'
    """
    if not record.get("images_per_second"):
        return "no figure"
    line = f"images/s {record['images_per_second']:.0f} with {record['workers']} workers"
    if record.get("ratio_to_template") is not None:
        fastest = record["template_fastest_images_per_second"]
        line += f", {record['ratio_to_template']:.2f} of the template's fastest training ({fastest:.0f})"
    return line


def write_runs(
    path: Path,
    environment: dict[str, Any],
    runs: list[dict[str, Any]],
    command: str,
    folder_input: dict[str, Any] | None = None,
) -> None:
    """``runs.json``: the command, the environment, the pairs so far (rewritten whole after each) and the folder
    path's input rate."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    record = {"command": command, "environment": environment, "runs": runs, "folder_input": folder_input}
    temporary.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(temporary, path)


def read_session(folder: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any] | None]:
    """What a session left: its ``session.json`` ({} if none) and the template's ``step_profile.json``."""
    path = folder / "session.json"
    session = json.loads(path.read_text()) if path.is_file() else {}
    profiles = sorted(folder.glob("0-template/**/step_profile.json"))
    return session, json.loads(profiles[-1].read_text()) if profiles else None


def environment_record(out: Path) -> dict[str, Any]:
    """``environment.txt`` (nvidia-smi, lscpu) and the template's own record of the machine."""
    from project.toolkit.timing.environment import run_environment

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "environment.txt", "w") as text:
        for command in (["nvidia-smi"], ["lscpu"]):
            try:
                subprocess.run(command, stdout=text, stderr=subprocess.STDOUT, check=False, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as err:
                print(f"{command[0]}: {err}", file=text)
    return run_environment()


def folder_input(work: Path, out: Path, timeout_s: float, fastest: float | None) -> dict[str, Any]:
    """``python -m benchmarks.folder_input`` in a process of its own: its figures (or its error), with the
    template's fastest images/s so far beside them."""
    figures = work / "folder-input.json"
    command = [sys.executable, "-m", "benchmarks.folder_input", "--out", str(figures)]
    code, output, seconds = gpu_common.run_logged(command, work / "folder-input.log", timeout_s)
    with open(out / "gpu-run.log", "a") as joined:
        joined.write(f"===== folder input: exit {code}, {seconds:.0f} s\n{output}\n")
    record: dict[str, Any] = json.loads(figures.read_text()) if code == 0 and figures.is_file() else {}
    record.update(status=status(code, {}), seconds=round(seconds, 1), template_fastest_images_per_second=fastest)
    record["ratio_to_template"] = ratio(record.get("images_per_second"), fastest)
    return record


def run_all(
    modes: list[Mode], out: Path, work: Path, deadline_s: float, command: str, steps: int = STEPS
) -> list[dict[str, Any]]:
    """Every mode that fits before the deadline, each a session in a fresh process; ``runs.json`` and the log
    (``gpu-run.log``, every session's output) after each."""
    start = time.monotonic()
    environment = environment_record(out)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor-cache"))
    records: list[dict[str, Any]] = []
    loader: dict[str, Any] | None = None
    for index, (mode, estimate) in enumerate(zip(modes, estimates(modes, steps), strict=True)):
        left = deadline_s - (time.monotonic() - start)
        if loader is None and mode.if_time_left:  # after the modes that always run
            loader = run_folder_input(records, work, out, left)
            write_runs(out / "runs.json", environment, records, command, loader)
            left = deadline_s - (time.monotonic() - start)
        if estimate > left:
            print(f"gpu_run: {mode.name}: skipped, {left:.0f} s left for an estimated {estimate} s", flush=True)
            continue
        folder = work / f"mode-{index}"
        log = work / f"mode-{index}.log"
        timeout = min(left, OVERRUN * estimate)  # a hung session leaves the later modes their time
        code, output, seconds = gpu_common.run_logged(session_command(mode, folder, steps), log, timeout)
        with open(out / "gpu-run.log", "a") as joined:
            joined.write(f"===== {mode.name}: exit {code}, {seconds:.0f} s\n{output}\n")
        record = pair_record(mode, *read_session(folder))
        record.update(status=status(code, record["errors"]), seconds=round(seconds, 1), estimate_s=estimate)
        records.append(record)
        print(f"gpu_run: {summary_line(record)}", flush=True)
        write_runs(out / "runs.json", environment, records, command, loader)
    if loader is None:
        loader = run_folder_input(records, work, out, deadline_s - (time.monotonic() - start))
        write_runs(out / "runs.json", environment, records, command, loader)
    return records


def run_folder_input(records: list[dict[str, Any]], work: Path, out: Path, left: float) -> dict[str, Any]:
    """The folder input's record where its estimate fits in the ``left`` seconds; else why it was skipped."""
    if FOLDER_INPUT_S > left:
        print(f"gpu_run: folder input: skipped, {left:.0f} s left for an estimated {FOLDER_INPUT_S} s", flush=True)
        return {"status": "skipped", "reason": f"{left:.0f} s left for an estimated {FOLDER_INPUT_S} s"}
    fastest = max((r["images_per_second"]["template"] or 0 for r in records), default=0) or None
    record = folder_input(work, out, min(left, OVERRUN * FOLDER_INPUT_S), fastest)
    print(f"gpu_run: folder input: {record['status']}; {loader_line(record)}", flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bash benchmarks/gpu_run.sh", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, help="the folder runs.json and the log go into")
    parser.add_argument("--plan", action="store_true", help="print each step, its estimate and the total; run none")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help=f"seconds in all (default {DEADLINE_S})")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps an epoch (default {STEPS})")
    parser.add_argument("--work", type=Path, help="the sessions' run folders (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.plan:
        print("\n".join(plan_lines(MODES, args.deadline, args.steps)))
        return 0
    if args.results is None:
        parser.error("give RESULTS_DIR, or --plan")
    line = gpu_common.no_gpu_line("gpu_run")
    if line is not None:
        print(f"{line.removesuffix('nothing to check')}nothing to measure", flush=True)
        return 0
    command = shlex.join(["bash", "benchmarks/gpu_run.sh", *(argv if argv is not None else sys.argv[1:])])
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-run-"))
    with ending_sessions_on_sigterm():  # a time limit's SIGTERM ends the running session too
        records = run_all(MODES, args.results, work, args.deadline, command, args.steps)
    return 0 if records and all(r["status"] == "pass" for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())

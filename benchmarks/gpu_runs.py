"""``python -m benchmarks.gpu_runs RESULTS_DIR`` (what ``bash benchmarks/gpu_run.sh`` runs): the default job's speed
on one GPU, in at most 8 minutes, every finished run in ``RESULTS_DIR/runs.json``.

Each run is ``python -m project fit --config configs/default.yaml`` for 2 epochs (the first holds cuDNN's
autotuning and the compilation) on synthetic data of CIFAR-10's size, in a fresh process; its figures come from
its ``timing.json``. In order: the environment; MobileNetV2 fp32 and bf16 and ResNet50 bf16 eager, each with 5
steps under the profiler (busy/idle, launches, syncs); MobileNetV2 and ResNet50 bf16 compiled; MobileNetV2 bf16
with CUDA graphs (``reduce-overhead``); then, if time is left, ddp and fsdp on one rank and the template against
the plain loop, both compiled. A run that would end after the deadline is skipped, a running one stopped at it.
``--plan`` prints the steps with their estimates and exits 0 anywhere; without a GPU the runs say so and exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 480
PROFILE = "project.toolkit.measure.step_profile.StepProfile"


@dataclass(frozen=True)
class Run:
    """One step of the script: a fit (``options`` on top of the job's), or a command of its own."""

    name: str
    arch: str = "mobilenet_v2"
    precision: str = "32-true"
    compile_mode: str | None = None  # None: eager
    strategy: str = "auto"
    estimate_s: int = 45  # on one H100: the process's start, 2 epochs, validation, the blocks' timing
    profile: bool = False
    if_time_left: bool = False
    command: tuple[str, ...] = field(default=())  # instead of a fit

    def fit_options(self) -> list[str]:
        options = [f"--model.arch={self.arch}", f"--trainer.precision={self.precision}"]
        if self.compile_mode is not None:
            options += ["--model.compile=true", f"--model.compile_mode={self.compile_mode}"]
        if self.strategy != "auto":
            options += [f"--trainer.strategy={self.strategy}", "--trainer.devices=1"]
        return options + ([f"--trainer.callbacks+={PROFILE}"] if self.profile else [])


BF16 = "bf16-mixed"
RUNS = [
    Run("mobilenet_v2 fp32 eager, profiled", profile=True),
    Run("mobilenet_v2 bf16 eager, profiled", precision=BF16, profile=True),
    Run("resnet50 bf16 eager, profiled", arch="resnet50", precision=BF16, profile=True),
    Run("mobilenet_v2 bf16 compiled", precision=BF16, compile_mode="default", estimate_s=110),
    Run("resnet50 bf16 compiled", arch="resnet50", precision=BF16, compile_mode="default", estimate_s=110),
    Run("mobilenet_v2 bf16 CUDA graphs", precision=BF16, compile_mode="reduce-overhead", estimate_s=120),
    Run("mobilenet_v2 bf16 ddp, one rank", precision=BF16, strategy="ddp", if_time_left=True),
    Run("mobilenet_v2 bf16 fsdp, one rank", precision=BF16, strategy="fsdp", if_time_left=True),
    Run(
        "template vs plain loop, compiled",
        compile_mode="default",
        estimate_s=400,
        if_time_left=True,
        command=("python3", "-m", "benchmarks.overhead", "--repeats", "1", "--compile"),
    ),
]
ENVIRONMENT_S = 5


def plan_lines(runs: list[Run], deadline_s: float = DEADLINE_S) -> list[str]:
    """Each step with its estimate, and the total of those that always run (at most ``deadline_s``)."""
    lines = [f"{ENVIRONMENT_S:>5} s  environment: nvidia-smi, lscpu, versions"]
    lines += [f"{run.estimate_s:>5} s  {run.name}" for run in runs if not run.if_time_left]
    total = ENVIRONMENT_S + sum(run.estimate_s for run in runs if not run.if_time_left)
    lines.append(f"{total:>5} s  in all (deadline {deadline_s:.0f} s); then, if time is left:")
    lines += [f"{run.estimate_s:>5} s  {run.name}" for run in runs if run.if_time_left]
    return lines


def fit_command(run: Run, root: Path) -> list[str]:
    """The fit of ``run``, writing its run folder under ``root``."""
    job = ["--config", "configs/default.yaml", "--data.synthetic=true", "--data.synthetic_size=50000"]
    job += ["--trainer.max_epochs=2", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={root}"]
    return ["python3", "-m", "project", "fit", *job, *run.fit_options()]


def entry(run: Run, timing: dict[str, Any], profile: dict[str, Any] | None, status: str, seconds: float) -> dict:
    """A run's record in ``runs.json``: what ran, and the figures of its ``timing.json`` (None where absent)."""
    environment = timing.get("environment") or {}
    peaks = [mb for mb in timing.get("peak_memory_mb") or [] if mb is not None]
    return {
        "name": run.name,
        "status": status,
        "seconds": round(seconds, 1),
        "arch": run.arch,
        "precision": run.precision,
        "compile_mode": run.compile_mode,
        "strategy": run.strategy,
        "images_per_second": timing.get("train_samples_per_second"),
        "first_epoch_seconds": timing.get("first_epoch_seconds"),
        "mfu": timing.get("mfu"),
        "bandwidth_fraction": timing.get("bandwidth_fraction"),
        "data_wait_fraction": timing.get("data_wait_fraction"),
        "peak_memory_mib": max(peaks) if peaks else None,
        "step_anatomy": ((timing.get("step_anatomy") or {}).get("ranks") or [None])[0],
        "step_profile": profile,
        "git_commit": environment.get("git_commit"),
        "device": environment.get("device_name"),
    }


def write_runs(path: Path, environment: dict[str, Any], runs: list[dict[str, Any]], command: str) -> None:
    """``runs.json``: the command, the environment and the runs so far (rewritten after each run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"command": command, "environment": environment, "runs": runs}, indent=2) + "\n")
    os.replace(temporary, path)


def newest(root: Path, name: str) -> dict[str, Any] | None:
    """The newest run folder's ``name`` (a JSON file) under ``root``, or None."""
    found = sorted(root.rglob(name), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text()) if found else None


def environment_record(out: Path) -> dict[str, Any]:
    """``environment.txt`` (nvidia-smi, lscpu) and the template's own record of the machine."""
    from project.toolkit.measure.environment import run_environment

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "environment.txt", "w") as text:
        for command in (["nvidia-smi"], ["lscpu"]):
            try:
                subprocess.run(command, stdout=text, stderr=subprocess.STDOUT, check=False, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as err:
                print(f"{command[0]}: {err}", file=text)
    return run_environment()


def run_all(runs: list[Run], out: Path, work: Path, deadline_s: float, command: str) -> list[dict[str, Any]]:
    """Every run that fits before the deadline, each in a fresh process; ``runs.json`` after each."""
    from benchmarks.gpu_check import run_logged

    start = time.monotonic()
    environment = environment_record(out)
    records: list[dict[str, Any]] = []
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor-cache"))
    for index, run in enumerate(runs):
        left = deadline_s - (time.monotonic() - start)
        if run.estimate_s > left:
            print(f"gpu_runs: {run.name}: skipped, {left:.0f} s left for an estimated {run.estimate_s} s", flush=True)
            continue
        root = work / f"run-{index}"
        argv = list(run.command) if run.command else fit_command(run, root)
        if run.command:
            argv += ["--out", str(root)]
        code, output, seconds = run_logged(argv, out / f"run-{index}.log", left)
        status = "pass" if code == 0 else ("stopped at the deadline" if code is None else f"exit {code}")
        timing = newest(root, "timing.json") or {}
        records.append(entry(run, timing, newest(root, "step_profile.json"), status, seconds))
        print(f"gpu_runs: {run.name}: {status} in {seconds:.0f} s, {records[-1]['images_per_second']} images/s")
        write_runs(out / "runs.json", environment, records, command)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bash benchmarks/gpu_run.sh", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, help="the folder runs.json and the logs go into")
    parser.add_argument("--plan", action="store_true", help="print each step, its estimate and the total; run none")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help=f"seconds in all (default {DEADLINE_S})")
    parser.add_argument("--work", type=Path, default=None, help="run folders and the inductor cache (RESULTS/work)")
    args = parser.parse_args(argv)
    if args.plan:
        print("\n".join(plan_lines(RUNS, args.deadline)))
        return 0
    if args.results is None:
        parser.error("give RESULTS_DIR, or --plan")
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_runs: no CUDA GPU here (torch {torch.__version__}); nothing to measure", flush=True)
        return 0
    command = shlex.join(["bash", "benchmarks/gpu_run.sh", *(argv if argv is not None else sys.argv[1:])])
    records = run_all(RUNS, args.results, args.work or args.results / "work", args.deadline, command)
    return 0 if records and all(r["status"] == "pass" for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())

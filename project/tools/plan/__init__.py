"""``python -m project plan RUN_DIR --devices N [--nodes M] [--link-gbps B]``: from one fit's ``timing.json`` (and its
``block_times.json``, if its blocks were timed) and a link (given, or measured here), each strategy's step, throughput,
scaling and memory per device on devices you do not have (the formulas and what they leave out: ``docs/plan.md``).
Only what is measured here imports torch."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from project.toolkit.errors import OneLineParser, ProjectError, exit_on_project_error
from project.toolkit.timing.tables import number, text_table
from project.tools.plan.formulas import *  # noqa: F403  (the formulas, for tests and benchmarks)
from project.tools.plan.inputs import Link, Measured, Target, core_slowdown, link_from, read_run, threads_per_process
from project.tools.plan.predict import (
    Prediction,
    plan,
    predict_ddp,
    predict_fsdp,
    predict_pipeline,
    scaling_efficiency,
    share_seconds,
    timed_blocks,
)

__all__ = ["Link", "Measured", "Prediction", "Target", "core_slowdown", "link_from", "main", "plan", "predict_ddp"]
__all__ += ["predict_fsdp", "predict_pipeline", "read_run", "scaling_efficiency", "share_seconds"]
__all__ += ["threads_per_process"]

PLAN_HELP = "Predict step time, throughput, scaling and memory per device of each strategy on N devices from one run."
HEADER = ["strategy", "devices", "step s", "data / compute / comm / optim / bubble / rest s", "samples/s", "scaling"]
HEADER += ["peak MiB per device", "note"]


def table_rows(predictions: list[Prediction], run: Measured) -> list[list[str]]:
    parts = ("data_wait", "compute", "communication", "optimizer", "bubble", "rest")
    return [
        [p.strategy, str(p.world), number(p.step, 3), " / ".join(number(p.parts[k], 3) for k in parts)]
        + [number(p.samples_per_second, 1), number(100 * scaling_efficiency(p, run), 0, " %")]
        + [", ".join(number(mb, 0) for mb in p.memory_mb), p.note]
        for p in predictions
    ]


LINK_HELP = "link bandwidth in Gbit/s (default: measured here with gloo)"
BATCH_HELP = "global: the run's batch split across the devices (default); per-device: each keeps it"
CORES_HELP = "the devices are processes sharing the machine's CPU cores (auto: for a CPU run on 1 node, from the run's "
CORES_HELP += "threads and its machine's cores; yes: N times slower than the run; no: as fast as the run)"
TIME_BLOCKS = "The pipeline's stages take their FLOPs' share of the run's compute; to time them by block, fit on one "
TIME_BLOCKS += "device with --trainer.callbacks+=project.tools.plan.block_times.BlockTimes."


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m project plan", description=f"{PLAN_HELP} Trains nothing.")
    add = parser.add_argument
    add("run_dir", metavar="RUN_DIR", type=Path, help="a fit's run folder (or its timing.json)")
    add("--devices", type=int, required=True, help="devices per node (processes on a CPU)")
    add("--nodes", type=int, default=1, help="nodes (default 1)")
    add("--link-gbps", type=float, default=None, help=LINK_HELP)
    add("--link-latency-us", type=float, default=10.0, help="with --link-gbps: latency (default 10)")
    add("--batch", choices=("global", "per-device"), default="global", help=BATCH_HELP)
    add("--micro-batches", type=int, default=4, help="pipeline micro-batches (default 4)")
    add("--shared-cores", choices=("auto", "yes", "no"), default="auto", help=CORES_HELP)
    add("--out", type=Path, default=None, help="also write plan.md and plan.json into this folder")
    return parser.parse_args(argv)


def make_plan(args: argparse.Namespace, command: str) -> tuple[str, dict[str, Any]]:
    """The table (text) and the JSON record of ``python -m project plan``."""
    for name in ("devices", "nodes", "micro_batches"):
        if getattr(args, name) < 1:
            raise ProjectError(f"plan --{name.replace('_', '-')}={getattr(args, name)} is not allowed: it must be >= 1")
    if args.link_gbps is not None and not args.link_gbps > 0:
        raise ProjectError(f"plan --link-gbps={args.link_gbps} is not allowed: it must be a number > 0")
    run = read_run(args.run_dir)
    slowdown = core_slowdown(run, args.shared_cores, args.devices, args.nodes)
    target = Target(args.devices, args.nodes, args.batch, args.micro_batches, slowdown)
    link = link_from(args.link_gbps, args.link_latency_us)
    predictions = plan(run, target, link)
    lines = [
        f"Plan from {run.name}: {run.accelerator}, global batch {run.batch_size}, measured step {run.step:.3f} s",
        f"  ({run.samples_per_second:.1f} samples/s); target {target.devices} device(s) x {target.nodes} node(s),",
        f"  batch {target.batch}, link {link.bandwidth * 8 / 1e9:.2f} Gbit/s + {link.latency * 1e6:.0f} us per message "
        f"({link.source}); each device computes {target.slowdown:.2f}x slower than the run (shared cores).",
        "",
        text_table(HEADER, table_rows(predictions, run)),
        "",
        "Formulas and what they leave out: docs/plan.md.",
    ]
    if timed_blocks(run) is None:
        lines.append(TIME_BLOCKS)
    if run.world_size > 1:  # rank 0's step stands for the run: right for ddp's share, not for a pipeline
        lines.append(
            f"The run had {run.world_size} processes: the plan reads rank 0's step as the run's; "
            "a single-device run is the plan's intended input."
        )
    rows = [
        {"strategy": p.strategy, "devices": p.world, "step_seconds": p.step, "parts": p.parts}
        | {"samples_per_second": p.samples_per_second, "scaling_efficiency": scaling_efficiency(p, run)}
        | {"peak_memory_mb": p.memory_mb, "note": p.note}
        for p in predictions
    ]
    record = {
        "command": command,
        "run": run.name,
        "target": target.__dict__,
        "link": link.__dict__,
        "predictions": rows,
    }
    return "\n".join(lines), record


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m project plan``; ``argv`` replaces ``sys.argv[2:]`` (for tests)."""
    argv = sys.argv[2:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "project", "plan", *argv])
    with exit_on_project_error():
        text, record = make_plan(args, command)
        print(text, flush=True)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "plan.json").write_text(json.dumps(record, indent=2) + "\n")
            (args.out / "plan.md").write_text(f"# Plan\n\nProduced by `{command}`.\n\n```\n{text}\n```\n")

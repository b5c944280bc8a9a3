"""How good is ``python -m project plan``? Its predictions beside measurements.

``python -m benchmarks.plan_check cpu BENCH_OUT [--singles BENCH_OUT2] --out benchmarks/results/plan``: the plan
made from each single-device cell of a finished ``python -m project bench`` run (of ``BENCH_OUT2``, by default
``BENCH_OUT``; the CPU smoke preset's cells), for 2 devices with the link measured here (unless ``--link-gbps``),
beside the 2-process ddp, fsdp and pipeline cells of the same arch: step time (the slowest rank's step anatomy
window), training samples/s (steady epochs) and peak memory per rank, each with its error. The pipeline's stages
are timed by block where the single cells ran with ``project.tools.plan.block_times.BlockTimes`` among their
callbacks (``block_times.json`` beside their ``timing.json``), else split by FLOPs.

``python -m benchmarks.plan_check published --out benchmarks/results/plan``: what the plan predicts for NVIDIA's
published ResNet50 v1.5 figures on 8 A100s (DeepLearningExamples, PyTorch/Classification/ConvNets/
resnet50v1.5/README.md, DGX A100 80GB table), from their 1-GPU throughput, beside their 8-GPU throughput.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from project.toolkit.timing.tables import markdown_table
from project.tools.plan import Link, Target, core_slowdown, link_from, plan, read_run, scaling_efficiency

PLANNED = {"ddp": "ddp", "fsdp": "fsdp", "pipeline-mb4": "pipeline"}


def _error(predicted: float | None, measured: float | None) -> str:
    if not predicted or not measured:
        return "–"
    return f"{100 * (predicted - measured) / measured:+.0f} %"


def _slowest_step(timing: dict[str, Any]) -> float | None:
    ranks = (timing.get("step_anatomy") or {}).get("ranks") or []
    steps = [r["step_seconds"] for r in ranks if r.get("step_seconds")]
    return max(steps) if steps else None


def check_cpu(bench_out: Path, singles: Path, out: Path, command: str, shared_cores: str, link: Link) -> str:
    """Predicted vs measured for the 2-process cells of a bench run, from its single-device cells."""
    runs = bench_out / "runs"
    rows, record = [], {"command": command, "link": link.__dict__, "cells": []}
    singles_runs = {
        single: read_run(single / "lightning_logs" / "version_0")
        for single in sorted((singles / "runs").glob("single-*"))
    }
    notes = []
    for single, run in singles_runs.items():
        arch = single.name.split("-")[1]
        target = Target(2, slowdown=core_slowdown(run, shared_cores, devices=2))  # as `python -m project plan`
        predictions = {p.strategy: p for p in plan(run, target, link)}
        notes.append(f"{arch}: each process {target.slowdown:.2f}x slower; pipeline: {predictions['pipeline'].note}")
        for cell_prefix, strategy in PLANNED.items():
            for cell in sorted(runs.glob(f"{cell_prefix}-{arch}-*")):
                timing = json.loads((cell / "lightning_logs" / "version_0" / "timing.json").read_text())
                p = predictions[strategy]
                step = _slowest_step(timing)
                rate = timing.get("train_samples_per_second")
                memory = timing.get("peak_memory_mb") or []
                rows.append(
                    [
                        f"`{cell.name}`",
                        f"{p.step:.3f} / {step:.3f}" if step else "–",
                        _error(p.step, step),
                        f"{p.samples_per_second:.1f} / {rate:.1f}" if rate else "–",
                        _error(p.samples_per_second, rate),
                        " / ".join(f"{m:.0f}" for m in p.memory_mb if m is not None)
                        + " vs "
                        + " / ".join(f"{m:.0f}" for m in memory),
                        _error(max(m or 0 for m in p.memory_mb), max(memory or [0])),
                    ]
                )
                record["cells"].append(
                    {
                        "cell": cell.name,
                        "from": single.name,
                        "predicted": {
                            "step_seconds": p.step,
                            "parts": p.parts,
                            "samples_per_second": p.samples_per_second,
                        }
                        | {"peak_memory_mb": p.memory_mb, "scaling_efficiency": scaling_efficiency(p, run)}
                        | {"note": p.note},
                        "measured": {"step_seconds": step, "samples_per_second": rate, "peak_memory_mb": memory}
                        | {"step_anatomy": timing.get("step_anatomy")},
                    }
                )
    header = ["cell", "step s: plan / measured", "error", "samples/s: plan / measured", "error"]
    header += ["peak MiB per rank: plan vs measured", "error (largest)"]
    intro = [
        f"Produced by `{command}`. Each 2-process cell of the bench run in `{bench_out}` is predicted by",
        f"`python -m project plan` from the single-device cell of the same arch in `{singles}`",
        f"(`--devices 2 --shared-cores {shared_cores}`; the link {link.source}:",
        f"{link.bandwidth * 8 / 1e9:.2f} Gbit/s, {link.latency * 1e6:.0f} us per message). Step: the slowest",
        "rank's step over the anatomy's window; samples/s: the steady epochs'; memory: peak resident set.",
        "",
        *[f"- {note}" for note in notes],
    ]
    return _write_report(out, "cpu", "The plan against measurement: 2 CPU processes", intro, header, rows, record)


def _write_report(
    out: Path, stem: str, title: str, intro: list[str], header: list[str], rows: list[list[str]], record: dict
) -> str:
    """``<stem>.md`` (the title, the intro lines and the table) and ``<stem>.json`` (``record``) under ``out``;
    returns the markdown."""
    text = "\n".join([f"# {title}", "", *intro, "", markdown_table(header, rows), ""])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    return text


# NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, "Training performance: NVIDIA DGX A100 (8x A100 80GB)":
# images/s on 1 and 8 GPUs; main.py's batch is per GPU, 256 by default.
PUBLISHED = {"TF32": (938.0, 7248.0), "AMP": (2470.0, 16621.0)}
PER_GPU_BATCH = 256
# NVLink 3 of an A100: 600 GB/s in all, 300 GB/s each way; the ring's links run at about that less overheads.
# Assumed (not measured here): 200 GB/s for NCCL's all-reduce bus bandwidth, and 10 us per message.
NVLINK = Link(10e-6, 200e9, "assumed: 200 GB/s NVLink bus bandwidth, 10 us")


def published_run(images_per_second: float) -> dict[str, Any]:
    """A timing.json standing for NVIDIA's 1-GPU run: its step from the throughput, all compute (DALI feeds the
    GPU; forward : backward = 1 : 2 as their FLOPs), 1 ms of optimizer (SGD on 25.6 M parameters), the
    network (ResNet50, 1000 classes, 224 px) measured on the meta device."""
    from torchvision.models import resnet50

    from project.toolkit.timing.network import network_profile

    network = network_profile(resnet50(num_classes=1000), 224)
    network["optimizer_state_bytes"] = network["parameter_bytes"]  # SGD momentum
    step = PER_GPU_BATCH / images_per_second
    compute = step - 0.001
    anatomy = {"data_wait": 0.0, "forward": compute / 3, "backward": 2 * compute / 3, "compute": compute}
    anatomy |= {"communication": 0.0, "optimizer": 0.001, "bubble": None, "rest": 0.0, "step_seconds": step}
    return {
        "accelerator": "cuda",
        "world_size": 1,
        "batch_size": PER_GPU_BATCH,
        "image_size": 224,
        "peak_memory_mb": [None],
        "step_anatomy": {"steps": 0, "ranks": [anatomy]},
        "network": network,
    }


def check_published(out: Path, command: str) -> str:
    rows, record = [], {"command": command, "link": NVLINK.__dict__, "settings": []}
    out.mkdir(parents=True, exist_ok=True)
    for precision, (one, eight) in PUBLISHED.items():
        path = out / f"published-{precision}.json"
        path.write_text(json.dumps(published_run(one)) + "\n")
        run = read_run(path)
        predictions = {p.strategy: p for p in plan(run, Target(8, batch="per-device"), NVLINK)}
        ddp = predictions["ddp"]
        rows.append(
            [
                precision,
                f"{one:.0f}",
                f"{eight:.0f} ({100 * eight / (8 * one):.0f} %)",
                f"{ddp.samples_per_second:.0f} ({100 * scaling_efficiency(ddp, run):.0f} %)",
                _error(ddp.samples_per_second, eight),
                f"{ddp.parts['communication'] * 1000:.2f} ms of {ddp.step * 1000:.1f} ms",
                f"{predictions['fsdp'].samples_per_second:.0f}",
            ]
        )
        record["settings"].append(
            {
                "precision": precision,
                "published": {"1": one, "8": eight},
                "predicted": {
                    s: {"samples_per_second": p.samples_per_second, "parts": p.parts} for s, p in predictions.items()
                },
            }
        )
    header = ["precision", "1 GPU img/s", "8 GPUs img/s (scaling)", "plan ddp x8 (scaling)", "error"]
    header += ["plan: exposed all-reduce per step", "plan fsdp x8"]
    intro = [
        f"Produced by `{command}`. Published: NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, DGX A100",
        "(8x A100 80GB), 224 px, batch 256 per GPU. The plan starts from the 1-GPU throughput (the whole step",
        "taken as compute) and NVLink at 200 GB/s with 10 us per message (assumed).",
    ]
    title = "The plan against published figures: ResNet50 v1.5 on 8 A100s"
    return _write_report(out, "published", title, intro, header, rows, record)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan_check", description=__doc__)
    parser.add_argument("what", choices=("cpu", "published"))
    parser.add_argument("bench_out", nargs="?", type=Path, help="cpu: the folder of a finished bench run")
    parser.add_argument("--singles", type=Path, default=None, help="cpu: the bench run of the single cells")
    parser.add_argument("--shared-cores", choices=("auto", "yes", "no"), default="auto", help="cpu: as plan's")
    parser.add_argument("--link-gbps", type=float, default=None, help="cpu: as plan's (default: measured here)")
    parser.add_argument("--link-latency-us", type=float, default=10.0, help="cpu: as plan's")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.plan_check", *argv])
    if args.what == "cpu":
        link = link_from(args.link_gbps, args.link_latency_us)
        singles = args.singles or args.bench_out
        print(check_cpu(args.bench_out, singles, args.out, command, args.shared_cores, link))
    else:
        print(check_published(args.out, command))


if __name__ == "__main__":
    main()

"""``python -m benchmarks.gpu_job``: the material's job on one GPU, with what each run's ``timing.json`` says.

``configs/default.yaml`` -- MobileNetV2, 112 px, global batch 256, 10 epochs -- on synthetic data of
CIFAR-10's size (45,000 training and 5,000 validation images; the pixels do not change the speed), each
run a real ``python -m project fit`` in a fresh process:

- the default input path (``on_device: auto``, which keeps a CIFAR-sized set on the GPU) and the
  DataLoader workers (``--data.on_device=false``), each in fp32 (``32-true``, convolutions in TF32) and
  ``bf16-mixed``;
- ResNet50 at 112 px, bf16-mixed and fp32, for ``--resnet-epochs`` epochs (its steady epochs are what
  count; fewer of them keep the run short); and bf16-mixed with ``--model.compile=true``: the first lease's
  eager bf16 run gave 10,560 images/s against the goal's 15,000 with 95 % of a steady step in the forward and
  backward kernels; at 112 px part of that may be the separate batch-norm and activation kernels, which
  compiling fuses -- the run tells how much (its compilation falls in the first epoch, which the steady figures
  leave out).

``--only`` runs some of them; the runs already in ``--out``'s ``gpu-job.json`` are kept (the GPU machine's
calls are limited in time, so the runs may take several).

It writes ``gpu-job.md`` (one row per run: steady epoch seconds, the fit's training time -- the sum of its
epochs' training seconds, validation excluded -- images/s, MFU, data wait, peak memory, where a steady
step's time went, and with ``--profile`` what the device did in 5 profiled steps of the first epoch:
:class:`~project.toolkit.measure.step_profile.StepProfile`) and the raw ``gpu-job.json`` into ``--out``.
Without a CUDA GPU it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks import gpu_check
from benchmarks.gpu_check import RESULTS, last_lines, newest_json, newest_timing, no_gpu_line, run_logged, slug
from project.toolkit.bench.matrix import ending_sessions_on_sigterm, project_command

PROFILE = "project.toolkit.measure.step_profile.StepProfile"  # its default window: steps 21-25, in the first epoch
CIFAR_TRAIN = 50_000  # CIFAR-10's training set, of which val_size is held out; its test set is a fifth of it
VAL_SIZE = 5_000


def runs(resnet_epochs: int) -> list[tuple[str, list[str]]]:
    """(name, the options on top of ``configs/default.yaml``) of every run, in running order."""
    bf16, loader = "--trainer.precision=bf16-mixed", "--data.on_device=false"
    resnet = ["--model.arch=resnet50", f"--trainer.max_epochs={resnet_epochs}"]
    return [
        ("mobilenet_v2 bf16-mixed, default input", [bf16]),
        ("resnet50 bf16-mixed, default input", [*resnet, bf16]),
        ("mobilenet_v2 bf16-mixed, loader", [bf16, loader]),
        ("mobilenet_v2 32-true, default input", []),
        ("mobilenet_v2 32-true, loader", [loader]),
        ("resnet50 32-true, default input", resnet),
        ("resnet50 bf16-mixed, compiled", [*resnet, bf16, "--model.compile=true"]),
    ]


def figures(timing: dict[str, Any], profile: dict[str, Any] | None) -> dict[str, Any]:
    """What the report shows of a fit's ``timing.json`` (the GPU check's figures, and more) and
    ``step_profile.json``."""
    epochs = timing.get("epochs") or []
    anatomy = (timing.get("step_anatomy") or {}).get("ranks") or [{}]
    return {
        **gpu_check.figures(timing),
        "input_path": timing.get("input_path"),
        "num_workers": timing.get("num_workers"),
        "first_epoch_seconds": timing.get("first_epoch_seconds"),
        "training_seconds": sum(e.get("seconds") or 0.0 for e in epochs),
        "fit_seconds": timing.get("fit_seconds"),
        "data_wait_fraction": timing.get("data_wait_fraction"),
        "iteration_seconds_p50": timing.get("iteration_seconds_p50"),
        "step_anatomy": anatomy[0],
        "step_profile": profile,
    }


def anatomy_cell(parts: dict[str, Any]) -> str:
    """``data 1% · compute 90% · ...`` of a step's parts, over the step's time."""
    step = parts.get("step_seconds")
    if not step:
        return "–"
    named = ("data_wait", "compute", "communication", "optimizer", "rest")
    return " · ".join(f"{k.replace('_wait', '')} {100 * parts[k] / step:.0f}%" for k in named if parts.get(k))


def write_report(results: list[dict[str, Any]], environment: dict[str, Any], out: Path, command: str) -> Path:
    """``gpu-job.md`` (the environment, one row per run, the last lines of each failed run) and ``gpu-job.json``
    in ``out``; returns the markdown's path."""
    from project.toolkit.measure.step_profile import one_line  # imports Lightning: only when reporting
    from project.toolkit.measure.tables import markdown_table, number

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in results:
        f = r.get("figures") or {}
        rows.append(
            [
                r["name"],
                "pass" if r["code"] == 0 else f"**FAIL** ({r['code']})",
                f"{f.get('input_path')} ({f.get('num_workers')} workers)" if f.get("input_path") else "–",
                number(f.get("first_epoch_seconds"), 2, missing="–"),
                number(f.get("epoch_seconds_mean"), 2, missing="–"),
                number(f.get("training_seconds"), 1, missing="–"),
                number(f.get("train_samples_per_second"), 0, missing="–"),
                number(f.get("mfu"), 1, missing="–", scale=100),
                number(f.get("data_wait_fraction"), 1, missing="–", scale=100),
                number(f.get("peak_memory_mb"), 0, missing="–"),
                anatomy_cell(f.get("step_anatomy") or {}),
                one_line(f["step_profile"]) if f.get("step_profile") else "–",
            ]
        )
    header = ["run", "result", "input", "epoch 1 s", "steady s/epoch", "training s", "img/s", "MFU %"]
    header += ["data wait %", "peak MiB", "a steady step", "profiled steps 21-25"]
    text = [
        "# The material's job on one GPU",
        "",
        f"Produced by `{command}`. Every run: `python -m project fit --config configs/default.yaml` on synthetic",
        f"data of CIFAR-10's size ({CIFAR_TRAIN - VAL_SIZE:,} training, {VAL_SIZE:,} validation images), one GPU.",
        "Figures from each run's `timing.json`: steady = the epochs after the first; training s = all epochs'",
        "training time (validation and checkpoints excluded); img/s and data wait over the steady epochs;",
        "a steady step = `step_anatomy` (rank 0, 5 steady steps timed with device events); profiled steps (runs",
        "with `--profile`) = 5 steps of the first epoch under torch.profiler (`StepProfile`): the device's busy",
        "share of their wall time, kernel launches and host syncs per step, the profiler's overhead included.",
        "Runs kept from an earlier call of the command keep their own commit in `gpu-job.json` (`git_commit`).",
        "",
        markdown_table(["", "value"], [[k, f"`{v}`"] for k, v in environment.items()]),
        "",
        markdown_table(header, rows),
        "",
    ]
    for r in results:
        if r["code"] != 0:
            text += [f"### {r['name']}: exit {r['code']}", "", "```", *r["error_lines"], "```", ""]
    (out / "gpu-job.json").write_text(json.dumps({"command": command, "environment": environment, "runs": results}))
    markdown = out / "gpu-job.md"
    markdown.write_text("\n".join(text))
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_job", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="report folder (default: benchmarks/results/gpu-<device>)")
    parser.add_argument("--runs", type=Path, required=True, help="the runs' folders (checkpoints, logs) go here")
    parser.add_argument("--resnet-epochs", type=int, default=3, help="ResNet50's epochs (3)")
    numbered = "; ".join(f"{i}: {name}" for i, (name, _) in enumerate(runs(3)))
    parser.add_argument("--only", help=f"comma-separated run numbers to run ({numbered}); default all")
    parser.add_argument("--timeout-minutes", type=float, default=8.0, help="per run (default 8)")
    parser.add_argument("--max-epochs", type=int, help="every run's epochs instead of its own (default: its own)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile steps 21-25 of each run (StepProfile): what the device did, at the price of the first "
        "epoch's time, which then holds the profiler's",
    )
    args = parser.parse_args(argv)
    chosen = runs(args.resnet_epochs)
    if args.only:
        picked = args.only.split(",")
        if not all(i.isdigit() and int(i) < len(chosen) for i in picked):
            parser.error(f"--only={args.only}: comma-separated numbers from 0 to {len(chosen) - 1}")
        chosen = [chosen[int(i)] for i in picked]
    line = no_gpu_line("gpu-job")
    if line is not None:
        print(line)
        return 0
    from project.toolkit.measure.environment import run_environment

    environment = run_environment()
    out = args.out or RESULTS / f"gpu-{slug(environment['device_name'])}"
    command = shlex.join(["python", "-m", "benchmarks.gpu_job", *(sys.argv[1:] if argv is None else argv)])
    # An earlier call's runs in the same report are kept, unless run again: the runs can be split over calls.
    earlier = out / "gpu-job.json"
    kept = json.loads(earlier.read_text())["runs"] if earlier.is_file() else []
    again = {name for name, _ in chosen}
    results = [r for r in kept if r["name"] not in again]
    with ending_sessions_on_sigterm():  # a deadline's SIGTERM ends the running fit too
        for name, options in chosen:
            folder = args.runs / slug(name)
            folder.mkdir(parents=True, exist_ok=True)
            fit = [
                "--config=configs/default.yaml",
                "--data.synthetic=true",
                f"--data.synthetic_size={CIFAR_TRAIN}",
                f"--data.val_size={VAL_SIZE}",
                "--trainer.accelerator=gpu",
                "--trainer.devices=1",
                "--trainer.enable_progress_bar=false",
                f"--trainer.default_root_dir={folder}",
                *options,
                *([f"--trainer.max_epochs={args.max_epochs}"] if args.max_epochs else []),
                *([f"--trainer.callbacks+={PROFILE}"] if args.profile else []),
            ]
            cmd = project_command("fit", fit)
            print(f"gpu-job: {name}: {shlex.join(cmd)}", flush=True)
            code, output, wall = run_logged(cmd, folder / "fit.log", args.timeout_minutes * 60)
            result = {"name": name, "command": shlex.join(cmd), "code": code, "wall_seconds": wall}
            result["git_commit"] = environment.get("git_commit")  # runs kept from an earlier call keep their own
            if code == 0:
                profile = newest_json(folder, "step_profile.json")
                result.update(figures=figures(newest_timing(folder), profile), error_lines=[])
            else:
                result.update(figures={}, error_lines=last_lines(output))
            results.append(result)
            f = result["figures"]
            print(
                f"gpu-job: {name}: exit {code}, {wall:.0f} s wall, "
                f"{f.get('train_samples_per_second') or 0:.0f} img/s, training {f.get('training_seconds') or 0:.1f} s",
                flush=True,
            )
            markdown = write_report(results, environment, out, command)  # after each run: a cut-off call keeps it
    print(f"gpu-job: report {markdown}")
    return 1 if any(r["code"] != 0 for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

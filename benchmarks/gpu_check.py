"""``bash benchmarks/gpu_run.sh --check`` (``make gpu-check``): every CUDA path of the template, checked on the GPU
you have, in minutes.

The template's tests run on CPUs; what only a GPU exercises -- mixed precision, cuDNN, ``torch.compile`` with
Triton, data kept on the device, NCCL process groups, DeepSpeed, CUDA-event timing -- is checked here, each
path as a real ``python -m project ...`` in a fresh process, on synthetic data (112 px, a few batches per
epoch, 2 epochs) or a generated folder of JPEGs, in a temporary folder as ``--trainer.default_root_dir``. A path
passes when its commands exit as they should and leave what they should (``timing.json``, the checkpoint,
``predictions.csv``, an evaluation's tables, the exported file):

- ``single-fp32``, ``bf16-mixed``, ``channels-last-off``, ``compile``, ``on-device``: one device, fit;
- ``ddp-1``, ``fsdp-1``, ``dp-1``: the strategies on one device (``dp`` must say it runs as a single device);
- ``deepspeed-stage-2``: fit, then ``test --ckpt_path=last`` on a single device from its checkpoint folder
  (skipped, not failed, without the deepspeed package);
- ``test-last``, ``predict-last``, ``resume``: after ``single-fp32``, in its folder (``resume``:
  ``fit --ckpt_path=last --trainer.max_epochs=3`` goes on from the end of epoch 2);
- ``ema``: fit with an average of the weights, then test on it;
- ``mixup-cutmix``: batches mixed on the device, then in DataLoader workers;
- ``augmentation``: ``random_resized_crop``, then a user's transform (RandAugment), each image on the device;
- ``folder``: a generated folder of JPEGs (decoded at reduced scale in workers, precise BN, confusion matrices):
  fit, test, predict and ``export --format=pt2`` of its checkpoint;
- ``nan-guard``: ``--model.lr=1e30`` must stop at the first non-finite loss, exit non-zero, and say so.

What the timing callback costs is measured side by side in one process by ``python -m benchmarks.timing_cost``.

It writes ``gpu-check.md`` (the environment, a pass/fail/skip table with each fit's figures, and the
last lines of every failing command) and the raw ``gpu-check.json`` into ``--out``
(default ``benchmarks/results/gpu-<device>/``), and exits 1 if a path failed. On a machine without a
CUDA GPU it prints one line and exits 0, running nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.gpu_check_paths import CHECK_BATCHES, ROOT, CheckPath, check_paths, write_folder
from benchmarks.gpu_check_report import write_report
from benchmarks.gpu_common import REPO, last_lines, newest_timing, no_gpu_line, run_logged, slug
from project.tools.bench.matrix import end_all_sessions, ending_sessions_on_sigterm, project_command

__all__ = ["REPO", "main", "no_gpu_line", "run_all", "run_path", "select", "write_report"]

RESULTS = REPO / "benchmarks" / "results"
CHECK_BATCH_SIZE = 128


def path_names() -> list[str]:
    return [p.name for p in check_paths()]


def select(names: Sequence[str] | None) -> list[str]:
    """The paths to run, in running order: ``names`` (all when None) plus the paths they continue."""
    paths = {p.name: p for p in check_paths()}
    wanted = set(path_names() if names is None else names)
    unknown = sorted(wanted - set(path_names()))
    if unknown:
        raise SystemExit(f"gpu-check: unknown path(s) {', '.join(unknown)}; choose from {', '.join(path_names())}")
    wanted |= {paths[n].after for n in wanted if n in paths and paths[n].after}
    return [n for n in path_names() if n in wanted]


# --------------------------------------------------------------------------- running


def common_args(root: Path, batches: int = CHECK_BATCHES, batch_size: int = CHECK_BATCH_SIZE) -> list[str]:
    """The trainer's options every command of a path shares: one GPU, 2 short epochs, the path's folder."""
    return [
        "--trainer.accelerator=gpu",
        "--trainer.devices=1",
        "--trainer.max_epochs=2",
        f"--trainer.limit_train_batches={batches}",
        "--trainer.limit_val_batches=2",  # not 1: --trainer.limit_val_batches=1 parses as 100 %
        "--trainer.limit_test_batches=4",
        "--trainer.limit_predict_batches=4",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
    ]


def data_args(data: str, root: Path, batches: int = CHECK_BATCHES, batch_size: int = CHECK_BATCH_SIZE) -> list[str]:
    """The data's options: synthetic images of CIFAR-10's kind at 112 px, or the generated folder of JPEGs in
    ``root`` (its batch size the folder module's own choice)."""
    if data == "folder":
        return ["--data=project.data.ImageFolderDataModule", f"--data.data_dir={write_folder(root)}"]
    return [
        "--data.synthetic=true",
        f"--data.synthetic_size={max(4096, batches * batch_size)}",
        "--data.val_size=1024",
        "--data.image_size=112",
        f"--data.batch_size={batch_size}",
    ]


def figures(timing: dict[str, Any]) -> dict[str, Any]:
    """What the report shows of a command's ``timing.json``."""
    picked = {
        key: timing[key]
        for key in ("epoch_seconds_mean", "train_samples_per_second", "mfu", "test_samples_per_second")
        if timing.get(key) is not None
    }
    peaks = [mb for mb in timing.get("peak_memory_mb") or [] if mb is not None]
    if peaks:
        picked["peak_memory_mb"] = max(peaks)
    return picked


def run_path(path: CheckPath, root: Path, timeout_s: float) -> dict[str, Any]:
    """Run a path's commands in ``root`` (shared with the path it continues), one after the other, stopping
    at the first that does not do what it should."""
    root.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"name": path.name, "what": path.what, "commands": [], "figures": {}}
    if path.needs_deepspeed and importlib.util.find_spec("deepspeed") is None:
        return {
            **result,
            "status": "skip",
            "reason": "the deepspeed package is not installed (pip install -e '.[deepspeed]')",
        }
    start = time.perf_counter()
    for index, step in enumerate(path.steps):
        own = [arg.replace(ROOT, str(root)) for arg in step.args]
        shared = [*common_args(root), *data_args(path.data, root)] if step.shared else []
        command = project_command(step.subcommand, [*shared, *own])
        result["commands"].append(shlex.join(command))
        code, output, _ = run_logged(command, root / f"{path.name}-{index}-{step.subcommand}.log", timeout_s)
        if code is None:
            problem: str | None = f"timed out after {timeout_s / 60:g} min"
        elif step.succeeds and code != 0:
            problem = f"exit status {code}"
        elif not step.succeeds and code == 0:
            problem = "exit status 0, but this run must stop with an error"
        else:
            problem = next((p for p in (check(root, output) for check in step.checks) if p), None)
        if problem is not None:
            failed = f"{step.subcommand}: {problem}"
            return {
                **result,
                "status": "fail",
                "reason": failed,
                "error_lines": last_lines(output),
                "seconds": time.perf_counter() - start,
            }
        if step.succeeds and step.shared:
            result["figures"].update(figures(newest_timing(root)))
    return {**result, "status": "pass", "reason": None, "seconds": time.perf_counter() - start}


# --------------------------------------------------------------------------- the command


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bash benchmarks/gpu_run.sh --check",
        description="Check every CUDA path of the template on this machine's GPU (minutes, synthetic data).",
    )
    parser.add_argument("--out", type=Path, help="report folder (default: benchmarks/results/gpu-<device>)")
    parser.add_argument("--paths", help=f"comma-separated subset of: {', '.join(path_names())}")
    parser.add_argument("--runs", type=Path, help="keep the runs in this folder (default: a temporary one)")
    parser.add_argument("--timeout-minutes", type=float, default=10.0, help="per command (default 10)")
    # Most of a check is a process starting and finishing (imports, CUDA, cuDNN's autotuning, the timing
    # after the fit): a GPU runs several such processes at once without one slowing another much.
    parser.add_argument("--jobs", type=int, default=1, help="paths run at a time (default 1)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs}: it must be >= 1")
    return args


def run_chain(chain: list[str], runs: Path, timeout_s: float) -> list[dict[str, Any]]:
    """A path and the paths that continue it (``after``), one after the other; a continuing path is
    skipped when the one it continues did not pass."""
    paths = {p.name: p for p in check_paths()}
    results: list[dict[str, Any]] = []
    for name in chain:
        path = paths[name]
        base = next((r for r in results if r["name"] == path.after), None)
        if base is not None and base["status"] != "pass":
            result = {"name": name, "what": path.what, "commands": [], "figures": {}, "status": "skip"}
            result["reason"] = f"needs {path.after}, which did not pass"
        else:
            result = run_path(path, runs / (path.after or name), timeout_s)
        detail = f" ({result['reason']})" if result.get("reason") else ""
        print(f"{name}: {result['status']}{detail}", flush=True)
        results.append(result)
    return results


def run_all(names: list[str], runs: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every path in ``names``, ``--jobs`` chains (a path and those that continue it) at a time; the results in
    the order of ``names``."""
    paths = {p.name: p for p in check_paths()}
    timeout_s = args.timeout_minutes * 60
    chains = [[n] + [m for m in names if paths[m].after == n] for n in names if paths[n].after is None]
    print(f"gpu-check: {len(names)} paths, {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:  # each path is its own processes: threads only wait on them
        try:
            done = [r for rs in pool.map(lambda chain: run_chain(chain, runs, timeout_s), chains) for r in rs]
        except BaseException:  # Ctrl-C, SIGTERM or a failure: the pool's exit would wait for every worker's session
            end_all_sessions()
            raise
    by_name = {r["name"]: r for r in done}
    return [by_name[n] for n in names]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks and write the report; 0 when none failed. Without a CUDA GPU: one line, 0, nothing run."""
    args = parse_args(argv)
    line = no_gpu_line()
    if line is not None:
        print(line)
        return 0
    from project.toolkit.timing.environment import run_environment  # imports Lightning: not needed without a GPU

    environment = run_environment()
    names = select(args.paths.split(",") if args.paths else None)
    out = args.out or RESULTS / f"gpu-{slug(environment['device_name'])}"
    command = shlex.join(["bash", "benchmarks/gpu_run.sh", "--check", *(sys.argv[1:] if argv is None else argv)])
    with ending_sessions_on_sigterm():  # a deadline's SIGTERM ends the paths' runs too
        if args.runs is not None:
            results = run_all(names, args.runs, args)
        else:
            with tempfile.TemporaryDirectory(prefix="gpu-check-") as runs:
                results = run_all(names, Path(runs), args)
    markdown, _ = write_report(results, environment, out, command)
    counts = {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skip")}
    print(f"gpu-check: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped; report: {markdown}")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

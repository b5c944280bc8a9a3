"""The result files of a bench run: ``results.csv`` (every figure of every cell) and ``results.md`` (the tables a
reader compares), with each cell's speed-up over its single-device baseline; a figure a cell lacks shows as "–"."""

from __future__ import annotations

import csv
import json
import math
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from project.toolkit.timing.tables import markdown_table, mean_std, number
from project.tools.bench.config import SINGLE

# Where a cell's figures were taken, as the timing callback records it; shown once above the tables.
ENVIRONMENT_KEYS = ("device_name", "device_count", "cpu_model", "cpu_cores", "cuda", "cudnn", "nccl", "torch")
ENVIRONMENT_KEYS += ("lightning", "torchvision", "python", "hostname", "git_commit", "git_dirty", "date")
PER_CELL = ("date",)  # differs from cell to cell by nature: not a difference of environment
MISSING = "–"  # a figure a cell did not record
FULL_PRECISION = "32-true"  # the accuracy's reference: the single device at full precision, where it ran


def _baseline_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["arch"], row["batch_size"], row["precision"], row.get("variant", "")


def speedups(rows: list[dict[str, Any]]) -> list[float | None]:
    """Each cell's ``single seconds / cell seconds`` per steady epoch (2.0: twice as fast), against the first ``single``
    cell with a training time of the same arch, batch, precision and variant."""
    baseline: dict[tuple[Any, ...], float] = {}
    for r in rows:
        seconds = r.get("epoch_seconds_mean")
        if r["bench_strategy"] == SINGLE and r["status"] == "ok" and _is_number(seconds) and seconds > 0:
            baseline.setdefault(_baseline_key(r), seconds)
    pairs = [(baseline.get(_baseline_key(r)), r.get("epoch_seconds_mean")) for r in rows]
    return [base / own if base and own else None for base, own in pairs]


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """CSV cells: ``{"a": {"p50": 1}}`` becomes ``a_p50``; lists become JSON text."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}_"))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else value
    return flat


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    flat = [_flatten(r) for r in rows]
    columns = list(dict.fromkeys(key for r in flat for key in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _num(value: Any, digits: int = 3, scale: float = 1.0) -> str:
    return number(value, digits, missing=MISSING, scale=scale)


def _pm(mean: Any, std: Any, digits: int = 3) -> str:
    return mean_std(mean if _is_number(mean) else None, std if _is_number(std) else None, digits, missing=MISSING)


def _significant(value: Any, digits: int = 3) -> str:
    """``0.00512``, ``1.23``, ``312``: TFLOP/s span orders of magnitude."""
    if not _is_number(value) or math.isnan(value):
        return MISSING
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


def _memory(row: dict[str, Any], prefix: str) -> str:
    """``rank0 812, rank1 790``: the peak MiB of every device."""
    pairs = zip(row.get(f"{prefix}_devices") or [], row.get(f"{prefix}_mb") or [], strict=False)
    return ", ".join(f"{label} {_num(mb, 0)}" for label, mb in pairs)


def anatomy_rows(row: dict[str, Any]) -> list[list[str]]:
    anatomy = row.get("step_anatomy")
    rows = []
    for rank, parts in enumerate(anatomy.get("ranks", []) if isinstance(anatomy, dict) else []):
        compute = _num(parts.get("compute"), 3)
        if _is_number(parts.get("forward")) and _is_number(parts.get("backward")):
            compute += f" ({_num(parts['forward'], 3)} + {_num(parts['backward'], 3)})"
        step, total = parts.get("step_seconds"), parts.get("parts_sum_seconds")
        others = [_num(parts.get(k), 3) for k in ("communication", "optimizer", "bubble", "rest")]
        share = _num(total / step if _is_number(total) and _is_number(step) and step else None, 2, 100) + " %"
        rows.append([f"`{row['cell']}`", str(rank), _num(step), _num(parts.get("data_wait")), compute, *others, share])
    return rows


def reached_text(row: dict[str, Any]) -> str:
    """``0.7: 3.2; 0.9: –``: seconds from the fit's start to each target validation accuracy ("–": not reached)."""
    reached = row.get("seconds_to_target_acc")
    return "; ".join(f"{t}: {_num(s, 1)}" for t, s in reached.items()) if isinstance(reached, dict) else MISSING


def accuracy_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Per strategy, devices, arch, batch and precision: the accuracy and the time to the target over its variants
    (seeds), mean ± std, and the difference of the mean best val accuracy from the single device's."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r["status"] == "ok" and _is_number(r.get("best_val_acc")):
            groups.setdefault((r["bench_strategy"], r["devices"], *_baseline_key(r)[:3]), []).append(r)

    def spread(values: list[Any], digits: int, scale: float = 1.0) -> str:
        present = [v * scale for v in values if _is_number(v)]
        if not present:
            return MISSING
        return _pm(statistics.fmean(present), statistics.stdev(present) if len(present) > 1 else None, digits)

    baseline = {key[2:]: group for key, group in groups.items() if key[0] == SINGLE}
    out = []
    for (strategy, devices, arch, batch, precision), group in groups.items():
        best = statistics.fmean(r["best_val_acc"] for r in group)
        single = baseline.get((arch, batch, FULL_PRECISION)) or baseline.get((arch, batch, precision))
        delta = 100 * (best - statistics.fmean(r["best_val_acc"] for r in single)) if single else None
        row = [strategy, str(devices), arch, str(batch), precision, str(len(group))]
        row += [spread([r["best_val_acc"] for r in group], 1, 100), _num(delta, 1)]
        row += [spread([r.get("test_acc") for r in group], 1, 100)]
        targets = [r.get("seconds_to_target_acc") for r in group]
        times = [next(iter(t.values()), None) if isinstance(t, dict) else None for t in targets]
        reached = f" ({sum(_is_number(t) for t in times)}/{len(group)})" if any(targets) else ""
        row += [spread(times, 1) + reached]
        out.append(row + [spread([r.get("train_samples_per_second") for r in group], 1)])
    return out


def accuracy_section(rows: list[dict[str, Any]]) -> list[str]:
    """The accuracy table, where a cell recorded one."""
    table = accuracy_rows(rows)
    if not table:
        return []
    header = ["strategy", "devices", "arch", "global batch", "precision", "runs", "best val acc %"]
    header += ["vs single (points)", "test acc %", "s to target (reached)", "samples/s"]
    text = ["## Accuracy per strategy, over its runs (mean ± std)", ""]
    text += ["Runs: the cells of the strategy (its variants, e.g. seeds); vs single: the difference of the mean best"]
    text += ["val accuracy from the single device's at 32-true (where it ran, else at the same precision), in"]
    text += ["percentage points; s to target: over the runs that reached the first target (how many did)."]
    return text + ["", markdown_table(header, table), ""]


def _text(value: Any) -> str:
    """A value for a markdown cell: "–" for a missing one, no column breaks."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("|", "\\|")


def environment_section(rows: list[dict[str, Any]]) -> list[str]:
    """The first finished cell's ``environment``, and the cells whose environment differs (``date`` aside)."""
    recorded = [(r["cell"], env) for r in rows if r["status"] == "ok" and isinstance(env := r.get("environment"), dict)]
    text = ["## Environment", ""]
    if not recorded:
        return [*text, "– (the cells' timing.json files do not record it)", ""]
    first = recorded[0][1]
    keys = [*ENVIRONMENT_KEYS, *(k for k in first if k not in ENVIRONMENT_KEYS)]
    text += [f"Recorded by the first finished cell, `{recorded[0][0]}`:", ""]
    text += [markdown_table(["key", "value"], [[key, _text(first.get(key))] for key in keys]), ""]
    every = dict.fromkeys(k for _, env in recorded for k in [*keys, *env])
    differing = [k for k in every if k not in PER_CELL and len({json.dumps(env.get(k)) for _, env in recorded}) > 1]
    if differing:
        cells = [[f"`{c}`", *(_text(env.get(k)) for k in differing)] for c, env in recorded]
        text += [f"**The cells did not all run in the same environment**: they differ in {', '.join(differing)}.", ""]
        text += [markdown_table(["cell", *differing], cells), ""]
    return text


BENCH_HOW = (
    "Each cell ran `python -m project fit` and then `python -m project test --ckpt_path=last` in fresh processes."
)


def write_markdown(
    rows: list[dict[str, Any]],
    path: Path,
    command: str,
    machine: str,
    title: str = "Strategy benchmark",
    how: str = BENCH_HOW,
) -> None:
    """``results.md``; ``title`` and ``how`` (how the cells ran) differ between bench and compare."""
    ok = [(r, s) for r, s in zip(rows, speedups(rows), strict=True) if r["status"] == "ok"]
    variants = any(r.get("variant") for r, _ in ok)
    training, inference = [], []
    for r, s in ok:
        get = r.get
        row = [f"`{r['cell']}`", r["bench_strategy"], r["arch"], str(r["batch_size"]), str(r["devices"])]
        row += [r["precision"], *([_text(get("variant"))] if variants else []), _num(get("fit_seconds"), 1)]
        row += [_pm(get("epoch_seconds_mean"), get("epoch_seconds_std"), 2), _num(get("first_epoch_seconds"), 2)]
        row += [_pm(get("iteration_seconds_mean"), get("iteration_seconds_std"), 3)]
        bubble = get("bubble_fraction")  # ``62 / 8``: a pipeline's bubble of each rank (stage), in %
        bubble = " / ".join(_num(v, 0, 100) for v in bubble) if isinstance(bubble, list) and bubble else MISSING
        row += [_num(get("data_wait_fraction"), 1, 100), bubble, _num(get("train_samples_per_second"), 1)]
        row += [_num(get("best_val_acc"), 1, 100), _num(get("test_acc"), 1, 100), reached_text(r)]
        row += [_significant(get("train_tflops_per_second")), _num(get("mfu"), 1, 100)]
        training.append([*row, MISSING if s is None else f"{s:.2f}x"])
        latency = r.get("test_batch_latency_ms") or {}
        row = [f"`{r['cell']}`", _pm(latency.get("mean"), latency.get("std"), 1)]
        row += [_num(latency.get(p), 1) for p in ("p50", "p90", "p99")]
        row += [_num(get("test_sample_latency_ms"), 2), _num(get("test_samples_per_second"), 1)]
        inference.append([*row, _significant(get("test_tflops_per_second")), _num(get("test_mfu"), 1, 100)])
    memory = [[f"`{r['cell']}`", _memory(r, "peak_memory"), _memory(r, "test_peak_memory")] for r, _ in ok]
    anatomy = [row for r, _ in ok for row in anatomy_rows(r)]
    failed = [
        [f"`{r['cell']}`", r["status"], (r["error"] or "").replace("|", "\\|")] for r in rows if r["status"] != "ok"
    ]
    header = ["cell", "strategy", "arch", "global batch", "devices", "precision", *(["variant"] if variants else [])]
    header += ["total s", "s/epoch", "first epoch s", "s/iteration", "data wait %", "bubble %", "samples/s"]
    header += ["best val acc %", "test acc %", "s to val acc"]
    header += ["TFLOP/s", "MFU %", "speed-up"]
    latency_header = ["cell", "ms/batch", "p50 ms", "p90 ms", "p99 ms", "ms/sample", "samples/s", "TFLOP/s", "MFU %"]
    anatomy_header = ["cell", "rank", "step s", "data", "compute (fwd + bwd)", "comm", "optim", "bubble", "rest", "sum"]
    text = [
        f"# {title}",
        "",
        f"Produced by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
        f"Machine: {machine}.",
        "",
        how,
        "Times are wall-clock seconds of the slowest rank with the device synchronised; the",
        "first epoch (warm-up) is shown apart and left out of the epoch mean ± std; the first iterations",
        "are left out of the iteration statistics. Throughput counts the samples of all ranks, each once (a",
        "pipeline's stages all see every sample). Bubble: each pipeline stage's share of its step time spent",
        "waiting on the other stages, per rank (`pipeline-mb<N>`: N micro-batches; mb1: model parallel). Speed-up:",
        "the single-device cell's steady epoch time over this cell's (same arch, batch, precision"
        + (", variant)." if variants else ")."),
        "TFLOP/s: the network's FLOPs per training (inference) sample times samples/s, all ranks; MFU: that",
        'over the peak of the cell\'s devices at its precision, "–" where the peak is unknown (a CPU).',
        "Accuracy: the fit's best validation accuracy and the test accuracy of its last checkpoint; s to val acc:",
        "seconds from the fit's start to the end of the first validation at or above each target (`docs/timing.md`).",
        "",
        *environment_section(rows),
        "## Training",
        "",
        markdown_table(header, training),
        "",
        *accuracy_section(rows),
        "## Inference (test)",
        "",
        markdown_table(latency_header, inference),
        "",
        "## Step anatomy (seconds per step, per rank)",
        "",
        "Each rank's training step over a window of steady steps, split into its parts (`docs/timing.md`);",
        "compute is forward + backward (each in brackets where known); sum: the parts' sum over the step time",
        "measured on its own (the window's wall time).",
        "",
        markdown_table(anatomy_header, anatomy),
        "",
        "## Peak memory per rank (MiB)",
        "",
        "CUDA: peak allocated per GPU; CPU: each process's peak resident memory.",
        "",
        markdown_table(["cell", "fit", "test"], memory),
        "",
    ]
    if failed:
        text += ["## Cells that did not finish", "", markdown_table(["cell", "status", "error"], failed), ""]
    path.write_text("\n".join(text))

"""The console table a run prints at the end of fit, test and predict: the stage's headline figures from its report."""

from __future__ import annotations

import math
from typing import Any

from project.toolkit.timing.anatomy import format_line as anatomy_line
from project.toolkit.timing.tables import mean_std, number

BANDWIDTH = ("bandwidth_tb_per_second", "bandwidth_fraction")


def work_text(tflops: float | None, mfu: float | None, tbps: float | None = None, share: float | None = None) -> str:
    """``12.3 TFLOP/s (MFU 41.0 %), 1.90 TB/s (57 % of peak)``; below one TFLOP/s (a CPU) in GFLOP/s or MFLOP/s."""
    if not isinstance(tflops, int | float) or isinstance(tflops, bool) or math.isnan(tflops):
        return "n/a"
    units = ((1.0, "TFLOP/s"), (1e-3, "GFLOP/s"))
    scale, unit = next(((s, u) for s, u in units if abs(tflops) >= s), (1e-6, "MFLOP/s"))
    text = f"{tflops / scale:.3g} {unit}" + ("" if mfu is None else f" (MFU {100 * mfu:.1f} %)")
    if isinstance(tbps, int | float) and tbps > 0:
        text += f", {tbps * 1000:.3g} GB/s moved" + ("" if share is None else f" ({100 * share:.0f} % of peak)")
    return text


def format_table(report: dict[str, Any], stage: str) -> str:
    """A few lines for the terminal: the stage's headline numbers."""
    where = f"{report['strategy']}, {report['world_size']} process(es), {report['devices']} x {report['accelerator']}"
    lines = [f"Timing of {stage} ({where}, {report['precision']}, global batch {report['batch_size']})"]
    if stage == "fit":
        p50, p90 = (number(report[f"iteration_seconds_{k}"], 3, " s") for k in ("p50", "p90"))
        detail = f"  (p50 {p50}, p90 {p90}; {report['warmup_iterations_skipped']} warm-up skipped)"
        epoch = mean_std(report["epoch_seconds_mean"], report["epoch_seconds_std"], 2, " s")
        iteration = mean_std(report["iteration_seconds_mean"], report["iteration_seconds_std"], 3, " s")
        wait, path = report["data_wait_fraction"], report.get("input_path")
        rows = [
            ("fit total", number(report["fit_seconds"], 2, " s")),
            ("first epoch", number(report["first_epoch_seconds"], 2, " s")),
            (f"epoch (steady, n={report['steady_epochs']})", epoch),
            ("iteration", iteration + detail),
            ("data wait", "n/a" if wait is None else f"{100 * wait:.1f} % of epoch time"),
            ("input", "n/a" if path is None else f"{path}, {report['num_workers']} workers"),
            ("throughput", number(report["train_samples_per_second"], 1, " samples/s (all ranks)")),
            ("work", work_text(*(report.get(k) for k in ("train_tflops_per_second", "mfu", *BANDWIDTH)))),
            ("validation run", number(report["val_epoch_seconds_mean"], 2, " s")),
        ]
        if report.get("best_val_acc") is not None:
            best, epoch, last = (report[k] for k in ("best_val_acc", "best_val_acc_epoch", "last_val_acc"))
            rows.append(("val accuracy", f"best {best:.3f} (epoch {epoch}), last {number(last, 3)}"))
        if reached := report.get("seconds_to_target_acc"):
            times = (f"{target}: {number(s, 2, ' s', 'not reached')}" for target, s in reached.items())
            rows.append(("time to accuracy", ", ".join(times)))
        if report.get("bubble_fraction"):  # a pipeline
            bubble = (f"rank{r} {number(v, 1, ' %', scale=100)}" for r, v in enumerate(report["bubble_fraction"]))
            rows.append(("pipeline bubble", ", ".join(bubble)))
        if report.get("step_anatomy"):
            rows.append(("step anatomy", anatomy_line(report["step_anatomy"])))
    else:
        latency = report[f"{stage}_batch_latency_ms"]
        rows = [
            ("batch latency", mean_std(latency["mean"], latency["std"], 2, " ms")),
            ("  p50 / p90 / p99", " / ".join(number(latency[k], 2, " ms") for k in ("p50", "p90", "p99"))),
            ("sample latency", number(report[f"{stage}_sample_latency_ms"], 3, " ms")),
            ("throughput", number(report[f"{stage}_samples_per_second"], 1, " samples/s (all ranks)")),
            ("work", work_text(report.get(f"{stage}_tflops_per_second"), report.get(f"{stage}_mfu"))),
        ]
        if report.get(f"{stage}_acc") is not None:
            rows.append(("accuracy", number(report[f"{stage}_acc"], 3)))
    prefix = "" if stage == "fit" else f"{stage}_"
    memory = zip(report[f"{prefix}peak_memory_devices"], report[f"{prefix}peak_memory_mb"], strict=True)
    rows.append(("peak memory", ", ".join(f"{label} {number(mb, 0, ' MiB')}" for label, mb in memory)))
    width = max(len(name) for name, _ in rows)
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)

"""``results.png``: per arch, every cell's steady epoch time and speed-up, throughput and test latency, peak memory
per rank and step anatomy, each bar labelled with its value. matplotlib is imported only when the chart is drawn."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

from project.toolkit.errors import ProjectError
from project.tools.bench.report import speedups

INSTALL_MATPLOTLIB = "pip install -e '.[bench]'"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def label(row: dict[str, Any], work: bool = True, accuracy: bool = False) -> str:
    """A bar's label: strategy, devices, batch, precision (and variant), and (``work``) training TFLOP/s and MFU, or
    (``accuracy``) the best val accuracy and the seconds to the first target."""
    text = f"{row['bench_strategy']} x{row['devices']}" + (f" {row['variant']}" if row.get("variant") else "")
    text += f"\nb{row['batch_size']} {row['precision']}"
    tflops, mfu = _number(row.get("train_tflops_per_second")), _number(row.get("mfu"))
    if work and tflops is not None:
        text += f"\n{tflops:.3g} TFLOP/s" + ("" if mfu is None else f", MFU {100 * mfu:.1f} %")
    if accuracy and (best := _number(row.get("best_val_acc"))) is not None:
        text += f"\nval acc {100 * best:.1f} %"
        for target, seconds in list((row.get("seconds_to_target_acc") or {}).items())[:1]:
            text += f"\n{target}: " + ("not reached" if seconds is None else f"{seconds:.3g} s")
    return text


def _bars(axis: Any, positions: list[float], values: list[float | None], **kwargs: Any) -> None:
    """Bars labelled with their values: 3 significant digits, whole numbers from 1000 on (2250, not 2.25e+03)."""
    heights = [math.nan if v is None else v for v in values]
    texts = ["" if math.isnan(v) else f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}" for v in heights]
    axis.bar_label(axis.bar(positions, heights, **kwargs), labels=texts, fontsize=7, padding=2)


def _axes(
    axis: Any, cells: list[dict[str, Any]], title: str, ylabel: str, margin: float, work: bool = False,
    accuracy: bool = False,
) -> None:  # fmt: skip
    axis.set_title(title)
    axis.set_xticks(range(len(cells)), [label(r, work, accuracy) for r in cells], fontsize=8)
    axis.set_ylabel(ylabel)
    axis.margins(y=margin)  # room for the labels or the legend above the bars


def _epoch_panel(axis: Any, cells: list[dict[str, Any]], speedup: list[float | None], arch: str) -> None:
    """Steady seconds per epoch (mean ± std), each bar labelled with its value and speed-up."""
    positions = list(range(len(cells)))
    means = [_number(r.get("epoch_seconds_mean")) for r in cells]
    stds = [_number(r.get("epoch_seconds_std")) or 0.0 for r in cells]
    bars = axis.bar(positions, [math.nan if m is None else m for m in means], yerr=stds, capsize=4, color="tab:blue")
    pairs = zip(means, speedup, strict=True)
    texts = ["" if m is None else f"{m:.3g} s" + ("" if s is None else f"\n{s:.2f}x") for m, s in pairs]
    axis.bar_label(bars, labels=texts, fontsize=8, padding=2)
    _axes(axis, cells, f"{arch}: seconds per epoch (steady, mean ± std) and speed-up", "s / epoch", 0.25, work=True)


def _throughput_panel(axis: Any, cells: list[dict[str, Any]], arch: str) -> None:
    """Train and test samples per second (bars, left axis), test batch latency p50 to p90 (points, right axis)."""
    positions = list(range(len(cells)))
    width = 0.38
    train = [_number(r.get("train_samples_per_second")) for r in cells]
    test = [_number(r.get("test_samples_per_second")) for r in cells]
    _bars(axis, [p - width / 2 for p in positions], train, width=width, label="train samples/s", color="tab:green")
    _bars(axis, [p + width / 2 for p in positions], test, width=width, label="test samples/s", color="tab:olive")
    _axes(axis, cells, f"{arch}: throughput (bars) and test latency (points)", "samples / s", 0.35, accuracy=True)
    latency = axis.twinx()
    p50, p90 = ([_number((r.get("test_batch_latency_ms") or {}).get(p)) for r in cells] for p in ("p50", "p90"))
    centre = [math.nan if v is None else v for v in p50]
    above = [0.0 if a is None or b is None else max(b - a, 0.0) for a, b in zip(p50, p90, strict=True)]
    whiskers = [[0.0] * len(cells), above]
    latency.errorbar(positions, centre, yerr=whiskers, fmt="D", color="black", capsize=3, label="test ms/batch")
    for x, y in zip(positions, centre, strict=True):
        if not math.isnan(y):
            latency.annotate(f"{y:.3g} ms", (x, y), textcoords="offset points", xytext=(8, -3), fontsize=7)
    latency.set_ylabel("ms / batch (test p50, whisker to p90)")
    highest = max([a + b for a, b in zip(centre, above, strict=True) if not math.isnan(a)], default=0.0)
    latency.set_ylim(0, highest * 1.4 or 1.0)  # from 0, with room for the legend above the points
    handles = [*axis.get_legend_handles_labels()[0], *latency.get_legend_handles_labels()[0]]
    axis.legend(handles=handles, fontsize=7, loc="upper center", ncol=3)


def _memory_panel(axis: Any, cells: list[dict[str, Any]], arch: str) -> None:
    """Peak memory of every rank (per GPU when one process drives several), in MiB."""
    positions = list(range(len(cells)))
    names = max([r.get("peak_memory_devices") or [] for r in cells] + [["rank0"]], key=len)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [_number(v[0]) if (v := (r.get("peak_memory_mb") or [])[i:][:1]) else None for r in cells]
        _bars(axis, [p - 0.4 + width * (i + 0.5) for p in positions], values, width=width, label=name)
    _axes(axis, cells, f"{arch}: peak memory per rank (fit)", "MiB", 0.25)
    axis.legend(fontsize=8, loc="upper left")


ANATOMY_PARTS = [("data_wait", "data wait", "tab:gray"), ("compute", "compute", "tab:blue")]
ANATOMY_PARTS += [("communication", "communication", "tab:red"), ("optimizer", "optimizer", "tab:green")]
ANATOMY_PARTS += [("bubble", "pipeline bubble", "tab:orange"), ("rest", "rest", "tab:purple")]


def _anatomy_panel(axis: Any, cells: list[dict[str, Any]], arch: str) -> None:
    """Each cell's step anatomy: one stacked bar per rank (seconds per step), the step time above it."""
    positions = list(range(len(cells)))
    ranks = max([len((r.get("step_anatomy") or {}).get("ranks") or []) for r in cells] + [1])
    width = 0.8 / ranks
    for rank in range(ranks):
        x = [p - 0.4 + width * (rank + 0.5) for p in positions]
        parts = [e[0] if (e := ((r.get("step_anatomy") or {}).get("ranks") or [])[rank:][:1]) else {} for r in cells]
        bottom = [0.0] * len(cells)
        for key, name, colour in ANATOMY_PARTS:
            heights = [_number(p.get(key)) or 0.0 for p in parts]
            axis.bar(x, heights, width=width * 0.9, bottom=bottom, color=colour, label=name if rank == 0 else None)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        for xi, top, part in zip(x, bottom, parts, strict=True):
            if part:
                axis.annotate(f"r{rank}\n{top:.3g} s", (xi, top), ha="center", va="bottom", fontsize=7)
    _axes(axis, cells, f"{arch}: where a training step's time goes, per rank (step anatomy)", "s / step", 0.3)
    axis.legend(fontsize=7, loc="upper left", ncol=3)


def write_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    fig = chart_figure(rows, title)
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)


def write_chart_if_possible(rows: list[dict[str, Any]], path: Path, title: str) -> str:
    """Draw the chart where matplotlib is installed, else say why not in a line; the files written: ``csv,md[,png]``."""
    if importlib.util.find_spec("matplotlib") is None:
        why = f"the chart needs matplotlib, which is not installed ({INSTALL_MATPLOTLIB}); the tables are written"
        print(f"{path.name} skipped: {why}", file=sys.stderr, flush=True)
        return "csv,md"
    write_chart(rows, path, title)
    return "csv,md,png"


def chart_figure(rows: list[dict[str, Any]], title: str) -> Any:
    """The matplotlib Figure of ``results.png``: a column of four panels per arch."""
    try:
        import matplotlib
    except ImportError:
        raise ProjectError(f"the chart needs matplotlib: {INSTALL_MATPLOTLIB}") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    speedup_of = {id(r): s for r, s in zip(rows, speedups(rows), strict=True)}
    ok = [r for r in rows if r["status"] == "ok"]
    archs = list(dict.fromkeys(r["arch"] for r in ok)) or ["(no finished cell)"]
    widest = max([sum(r["arch"] == a for r in ok) for a in archs] + [1])
    fig, axes = plt.subplots(4, len(archs), figsize=(max(5.0, 1.5 * widest + 2) * len(archs), 16), squeeze=False)
    for column, arch in enumerate(archs):
        cells = [r for r in ok if r["arch"] == arch]
        _epoch_panel(axes[0][column], cells, [speedup_of[id(r)] for r in cells], arch)
        _throughput_panel(axes[1][column], cells, arch)
        _memory_panel(axes[2][column], cells, arch)
        _anatomy_panel(axes[3][column], cells, arch)
    fig.suptitle(title)
    fig.tight_layout()
    return fig

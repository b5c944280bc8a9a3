"""``results.png``: per arch, the steady epoch time of every cell (with the TFLOP/s and MFU it
achieved under its label, its value and its speed-up over the single-device cell above the bar), its
training and test throughput with the test batch latency, its peak memory per rank, every bar
labelled with its value, and its step anatomy (a stacked bar per rank: data wait, compute,
communication, optimizer, pipeline bubble, rest). matplotlib is imported only here, when the chart is drawn."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

from project.toolkit.bench.report import speedups
from project.toolkit.errors import ProjectError

INSTALL_MATPLOTLIB = "pip install -e '.[bench]'"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def label(row: dict[str, Any], work: bool = True) -> str:
    """A bar's label: strategy and devices, batch and precision (and variant), and (``work``) the
    TFLOP/s and MFU of its training, where recorded.

    >>> label({"bench_strategy": "ddp", "devices": 2, "batch_size": 32, "precision": "32-true"})
    'ddp x2\\nb32 32-true'
    >>> label({"bench_strategy": "ddp", "devices": 2, "batch_size": 32, "precision": "bf16-mixed",
    ...        "variant": "on_device", "train_tflops_per_second": 51.234, "mfu": 0.2571})
    'ddp x2 on_device\\nb32 bf16-mixed\\n51.2 TFLOP/s, MFU 25.7 %'
    """
    text = f"{row['bench_strategy']} x{row['devices']}" + (f" {row['variant']}" if row.get("variant") else "")
    text += f"\nb{row['batch_size']} {row['precision']}"
    tflops, mfu = _number(row.get("train_tflops_per_second")), _number(row.get("mfu"))
    if work and tflops is not None:
        text += f"\n{tflops:.3g} TFLOP/s" + ("" if mfu is None else f", MFU {100 * mfu:.1f} %")
    return text


def _value_labels(values: list[float], digits: int = 3) -> list[str]:
    """Bar labels: each value in ``digits`` significant digits (whole numbers from 10**digits on: 2250,
    not 2.25e+03), none for a missing one."""
    return ["" if math.isnan(v) else f"{v:.{digits}g}" if abs(v) < 10**digits else f"{v:.0f}" for v in values]


def _bars(axis: Any, positions: list[float], values: list[float | None], **kwargs: Any) -> Any:
    """Bars with their values written above them; a missing value is no bar."""
    heights = [math.nan if v is None else v for v in values]
    bars = axis.bar(positions, heights, **kwargs)
    axis.bar_label(bars, labels=_value_labels(heights), fontsize=7, padding=2)
    return bars


def _epoch_panel(axis: Any, cells: list[dict[str, Any]], speedup: list[float | None], arch: str) -> None:
    """Steady seconds per epoch (mean ± std), each bar labelled with its value and its speed-up over
    the single-device cell of the same arch, batch and precision."""
    positions = list(range(len(cells)))
    means = [_number(r.get("epoch_seconds_mean")) for r in cells]
    stds = [_number(r.get("epoch_seconds_std")) or 0.0 for r in cells]
    bars = axis.bar(positions, [math.nan if m is None else m for m in means], yerr=stds, capsize=4, color="tab:blue")
    texts = [
        "" if m is None else f"{m:.3g} s" + ("" if s is None else f"\n{s:.2f}x")
        for m, s in zip(means, speedup, strict=True)
    ]
    axis.bar_label(bars, labels=texts, fontsize=8, padding=2)
    axis.set_title(f"{arch}: seconds per epoch (steady, mean ± std) and speed-up")
    axis.set_xticks(positions, [label(r) for r in cells], fontsize=8)
    axis.set_ylabel("s / epoch")
    axis.margins(y=0.25)  # room for the two-line labels


def _throughput_panel(axis: Any, cells: list[dict[str, Any]], arch: str) -> None:
    """Samples per second of training and of test (bars, left axis) and the test batch latency p50
    with its p90 above (points, right axis)."""
    positions = list(range(len(cells)))
    width = 0.38
    train = [_number(r.get("train_samples_per_second")) for r in cells]
    test = [_number(r.get("test_samples_per_second")) for r in cells]
    _bars(axis, [p - width / 2 for p in positions], train, width=width, label="train samples/s", color="tab:green")
    _bars(axis, [p + width / 2 for p in positions], test, width=width, label="test samples/s", color="tab:olive")
    axis.set_ylabel("samples / s")
    axis.set_xticks(positions, [label(r, work=False) for r in cells], fontsize=8)
    axis.margins(y=0.35)  # room for the legend above the bars
    latency = axis.twinx()
    p50 = [_number((r.get("test_batch_latency_ms") or {}).get("p50")) for r in cells]
    p90 = [_number((r.get("test_batch_latency_ms") or {}).get("p90")) for r in cells]
    centre = [math.nan if v is None else v for v in p50]
    above = [0.0 if a is None or b is None else max(b - a, 0.0) for a, b in zip(p50, p90, strict=True)]
    latency.errorbar(
        positions, centre, yerr=[[0.0] * len(cells), above], fmt="D", color="black", capsize=3, label="test ms/batch"
    )
    for x, y in zip(positions, centre, strict=True):
        if not math.isnan(y):
            latency.annotate(f"{y:.3g} ms", (x, y), textcoords="offset points", xytext=(8, -3), fontsize=7)
    latency.set_ylabel("ms / batch (test p50, whisker to p90)")
    highest = max([a + b for a, b in zip(centre, above, strict=True) if not math.isnan(a)], default=0.0)
    latency.set_ylim(0, highest * 1.4 or 1.0)  # from 0, with room for the legend above the points
    handles = [*axis.get_legend_handles_labels()[0], *latency.get_legend_handles_labels()[0]]
    axis.legend(handles=handles, fontsize=7, loc="upper center", ncol=3)
    axis.set_title(f"{arch}: throughput (bars) and test latency (points)")


def _memory_panel(axis: Any, cells: list[dict[str, Any]], arch: str) -> None:
    """Peak memory of every rank (per GPU when one process drives several), labelled in MiB."""
    positions = list(range(len(cells)))
    names = max([r.get("peak_memory_devices") or [] for r in cells] + [["rank0"]], key=len)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [(r.get("peak_memory_mb") or [])[i:][:1] for r in cells]
        _bars(
            axis,
            [p - 0.4 + width * (i + 0.5) for p in positions],
            [_number(v[0]) if v else None for v in values],
            width=width,
            label=name,
        )
    axis.set_title(f"{arch}: peak memory per rank (fit)")
    axis.set_xticks(positions, [label(r, work=False) for r in cells], fontsize=8)
    axis.set_ylabel("MiB")
    axis.margins(y=0.25)  # room for the legend above the bars
    axis.legend(fontsize=8, loc="upper left")


# The parts of a step, bottom to top, and their colours in the anatomy panel.
ANATOMY_PARTS = (
    ("data_wait", "data wait", "tab:gray"),
    ("compute", "compute", "tab:blue"),
    ("communication", "communication", "tab:red"),
    ("optimizer", "optimizer", "tab:green"),
    ("bubble", "pipeline bubble", "tab:orange"),
    ("rest", "rest", "tab:purple"),
)


def _anatomy_panel(axis: Any, cells: list[dict[str, Any]], arch: str) -> None:
    """Each cell's step anatomy: one stacked bar per rank (seconds per step), the step time above it."""
    positions = list(range(len(cells)))
    ranks = max([len((r.get("step_anatomy") or {}).get("ranks") or []) for r in cells] + [1])
    width = 0.8 / ranks
    for rank in range(ranks):
        x = [p - 0.4 + width * (rank + 0.5) for p in positions]
        entries = [((r.get("step_anatomy") or {}).get("ranks") or [])[rank:][:1] for r in cells]
        parts = [e[0] if e else {} for e in entries]
        bottom = [0.0] * len(cells)
        for key, name, colour in ANATOMY_PARTS:
            heights = [_number(p.get(key)) or 0.0 for p in parts]
            axis.bar(x, heights, width=width * 0.9, bottom=bottom, color=colour, label=name if rank == 0 else None)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        for xi, top, part in zip(x, bottom, parts, strict=True):
            if part:
                axis.annotate(f"r{rank}\n{top:.3g} s", (xi, top), ha="center", va="bottom", fontsize=7)
    axis.set_title(f"{arch}: where a training step's time goes, per rank (step anatomy)")
    axis.set_xticks(positions, [label(r, work=False) for r in cells], fontsize=8)
    axis.set_ylabel("s / step")
    axis.margins(y=0.3)
    axis.legend(fontsize=7, loc="upper left", ncol=3)


def write_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Draw :func:`chart_figure` into ``path`` (a PNG)."""
    fig = chart_figure(rows, title)
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)


def write_chart_if_possible(rows: list[dict[str, Any]], path: Path, title: str) -> str:
    """Draw the chart where matplotlib is installed (the ``bench`` extra; ``make fit`` installs it); else
    say in one line that it was skipped and why: the tables are the results, the chart only shows them.
    Returns the result files written, as ``csv,md,png`` or ``csv,md``."""
    if importlib.util.find_spec("matplotlib") is None:
        print(
            f"{path.name} skipped: the chart needs matplotlib, which is not installed ({INSTALL_MATPLOTLIB}); "
            "the tables are written",
            file=sys.stderr,
            flush=True,
        )
        return "csv,md"
    write_chart(rows, path, title)
    return "csv,md,png"


def chart_figure(rows: list[dict[str, Any]], title: str) -> Any:
    """Per arch (a column): seconds per epoch with speed-ups, throughput and latency, peak memory and
    step anatomy per rank; every bar labelled with its value. A matplotlib Figure."""
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

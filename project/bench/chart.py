"""``results.png``: per arch, the steady epoch time of every cell (with the TFLOP/s and MFU it
achieved under its label) and its peak memory per rank. matplotlib is imported only here, when the
chart is drawn."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from project.errors import ProjectError


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


def write_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Per arch: steady epoch time per cell (mean ± std) above, peak memory per rank below."""
    try:
        import matplotlib
    except ImportError:
        raise ProjectError("the chart needs matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    archs = list(dict.fromkeys(r["arch"] for r in ok)) or ["(no finished cell)"]
    widest = max([sum(r["arch"] == a for r in ok) for a in archs] + [1])
    fig, axes = plt.subplots(2, len(archs), figsize=(max(5.0, 1.3 * widest + 2) * len(archs), 8), squeeze=False)
    for column, arch in enumerate(archs):
        cells = [r for r in ok if r["arch"] == arch]
        labels = [label(r) for r in cells]
        positions = list(range(len(cells)))
        means = [_number(r.get("epoch_seconds_mean")) or math.nan for r in cells]
        stds = [_number(r.get("epoch_seconds_std")) or 0.0 for r in cells]
        top, bottom = axes[0][column], axes[1][column]
        top.bar(positions, means, yerr=stds, capsize=4, color="tab:blue")
        top.set_title(f"{arch}: seconds per epoch (steady, mean ± std)")
        top.set_xticks(positions, labels, fontsize=8)
        top.set_ylabel("s / epoch")
        # One bar per rank (per GPU when one process drives several), named after the widest cell.
        names = max([r.get("peak_memory_devices") or [] for r in cells] + [["rank0"]], key=len)
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = [(r.get("peak_memory_mb") or [])[i:][:1] for r in cells]
            bottom.bar(
                [p - 0.4 + width * (i + 0.5) for p in positions],
                [v[0] if v and v[0] is not None else math.nan for v in values],
                width=width,
                label=name,
            )
        bottom.set_title(f"{arch}: peak memory per rank (fit)")
        bottom.set_xticks(positions, [label(r, work=False) for r in cells], fontsize=8)
        bottom.set_ylabel("MiB")
        bottom.margins(y=0.2)  # room for the legend above the bars
        bottom.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

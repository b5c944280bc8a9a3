"""The figures of runs/main/: per fit, val/acc and val/loss per epoch; per checkpoint (last.ckpt), val/acc and
val/loss when the val folder is decoded by either clone, and the val images whose predicted class changes; the CPU
seconds of every command (``/usr/bin/time -v``). Prints markdown tables.

``/work/main/.venv/bin/python collect.py`` (from /work/decode_acc)
"""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

RUNS = Path(__file__).resolve().parent / "runs" / "main"
CLONES = ("draft", "whole")
SEEDS = (1, 2, 3)


def epochs(fit: str) -> list[tuple[int, float, float]]:
    """(epoch, val/acc, val/loss) of each validation of a finished fit (none while it runs)."""
    log = RUNS / fit / "fit.log"
    if not log.is_file() or "Exit status: 0" not in log.read_text():
        return []
    rows = csv.DictReader(open(RUNS / fit / "lightning_logs" / "version_0" / "metrics.csv"))
    return [(int(r["epoch"]), float(r["val/acc"]), float(r["val/loss"])) for r in rows if r.get("val/acc")]


def evaluated(fit: str, clone: str) -> tuple[float, float] | None:
    """val/acc, val/loss of ``validate`` of the fit's last.ckpt from ``clone``."""
    found = list((RUNS / "eval" / f"{fit}-on-{clone}" / "lightning_logs").glob("version_*/metrics.csv"))
    if not found:
        return None
    row = next(r for r in csv.DictReader(open(found[0])) if r.get("val/acc"))
    return float(row["val/acc"]), float(row["val/loss"])


def predictions(fit: str, clone: str) -> dict[str, str] | None:
    found = list((RUNS / "eval" / f"{fit}-on-{clone}" / "predict").rglob("predictions.csv"))
    return {r["file"]: r["predicted_name"] for r in csv.DictReader(open(found[0]))} if found else None


def flips(fit: str) -> str:
    """The val images whose predicted class differs between the two decodings of one checkpoint."""
    a, b = (predictions(fit, clone) for clone in CLONES)
    if a is None or b is None:
        return "-"
    changed = [f for f in a if a[f] != b[f]]
    return f"{len(changed)}/{len(a)}"


def cpu_seconds() -> float:
    """User + system seconds of every command logged under runs/main."""
    total = 0.0
    for log in RUNS.rglob("*.log"):
        for key in ("User time", "System time"):
            match = re.search(rf"{key} \(seconds\): ([\d.]+)", log.read_text())
            total += float(match.group(1)) if match else 0.0
    return total


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})" if values else "-"


def main() -> None:
    print("## Per epoch (val/acc / val/loss)\n")
    for seed in SEEDS:
        fits = {clone: f"{clone}-s{seed}" for clone in CLONES}
        if not all(epochs(f) for f in fits.values()):
            continue
        print(f"seed {seed}\n\n| epoch | draft acc | whole acc | draft loss | whole loss |")
        print("| --- | --- | --- | --- | --- |")
        per = {clone: epochs(fit) for clone, fit in fits.items()}
        for (e, acc_d, loss_d), (_, acc_w, loss_w) in zip(per["draft"], per["whole"], strict=True):
            print(f"| {e} | {acc_d:.3f} | {acc_w:.3f} | {loss_d:.4f} | {loss_w:.4f} |")
        print()
    print("## Final checkpoints (last.ckpt) evaluated on val by each decoding\n")
    print(
        "| seed | trained | fit's val/acc | eval draft: acc / loss | eval whole: acc / loss | cross - same acc | "
        "class changed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    columns: dict[str, list[float]] = {}
    for seed in SEEDS:
        for clone in CLONES:
            fit = f"{clone}-s{seed}"
            if not (RUNS / fit).is_dir() or not epochs(fit):
                continue
            final = epochs(fit)[-1][1]
            ev = {c: evaluated(fit, c) for c in CLONES}
            cells = [f"{v[0]:.3f} / {v[1]:.4f}" if v else "-" for v in ev.values()]
            other = "whole" if clone == "draft" else "draft"
            cross = f"{ev[other][0] - ev[clone][0]:+.3f}" if ev[other] and ev[clone] else "-"
            print(f"| {seed} | {clone} | {final:.3f} | {cells[0]} | {cells[1]} | {cross} | {flips(fit)} |")
            columns.setdefault(f"{clone} acc", []).append(final)
            if ev[other]:
                columns.setdefault(f"{clone}-trained, {other}-decoded acc", []).append(ev[other][0])
                columns.setdefault(f"{clone}-trained, same loss", []).append(ev[clone][1])
                columns.setdefault(f"{clone}-trained, {other}-decoded loss", []).append(ev[other][1])
    print("\n## Medians (min-max) over seeds\n")
    for name, values in columns.items():
        print(f"- {name}: {spread(values)} (n={len(values)})")
    print(f"\nCPU seconds of every command under runs/main: {cpu_seconds():.0f}")


if __name__ == "__main__":
    main()

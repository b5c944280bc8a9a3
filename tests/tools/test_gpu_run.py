"""``bash benchmarks/gpu_run.sh``, the one GPU command, built and tested on the CPU: its plan and estimates, each
mode as one session of the template, Lightning's bare loop and the plain loop, the ratios and host syncs in
``runs.json``, the deadline, and (slow) a tiny session of the three sides run for real on the CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import folder_input, gpu_common, gpu_runs
from benchmarks._common import Setup
from benchmarks.gpu_runs import MODES, Mode

REPO = Path(__file__).resolve().parents[2]
REQUIRED = [  # issue 43: in this order, in at most 420 s
    "mobilenet_v2 fp32 eager",
    "mobilenet_v2 bf16 CUDA graphs",
    "mobilenet_v2 bf16 eager",
    "resnet50 bf16 eager",
    "resnet50 bf16 CUDA graphs",
]


def python3_first() -> dict[str, str]:
    """The environment where ``python3`` is this interpreter (on the GPU machine it is the one with torch)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def plan_steps(lines: list[str]) -> tuple[list[tuple[int, str]], int]:
    """(seconds, name) of each step the plan lists, and its total."""
    steps = [(int(m[1]), m[2]) for line in lines if (m := re.match(r"^\s*(\d+) s  (.+)$", line))]
    total = next(s for s, name in steps if name.startswith("in all"))
    return [(s, name) for s, name in steps if not name.startswith("in all")], total


def test_the_plan_reaches_the_five_modes_in_order_within_420_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_runs.main(["--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps, total = plan_steps(lines)
    assert total <= 420 and "deadline 420 s" in lines[len(REQUIRED) + 2]
    assert [name for _, name in steps[1 : len(REQUIRED) + 1]] == REQUIRED
    assert steps[len(REQUIRED) + 1][1].startswith("folder input: JPEGs decoded by one DataLoader worker a core")
    assert steps[-1][1] == "mobilenet_v2 bf16 compiled" and MODES[-1].if_time_left  # only if time is left
    assert total == sum(s for s, _ in steps[: len(REQUIRED) + 2])


def test_the_estimates_come_from_the_lease() -> None:
    """The template's eager fit of the lease scaled to this fit's images, each loop's images at its speed, the
    compilation where compiled, CUDA's start in the first mode only."""
    fp32, graphs = MODES[0], MODES[1]
    lease = gpu_runs.LEASE[("mobilenet_v2", "32-true", None)]
    images = gpu_runs.EPOCHS * gpu_runs.STEPS * 256
    template = lease.fit_s * (images + (gpu_runs.EPOCHS + 1) * 256) / gpu_runs.LEASE_IMAGES
    lightning = images / (lease.template_ips * lease.plain_ips) ** 0.5
    loops = lightning + images / lease.plain_ips + 2 * gpu_runs.LOOP_SETUP_S
    assert fp32.estimate_s() == pytest.approx(template + loops)
    assert fp32.estimate_s(first=True) == pytest.approx(template + loops + gpu_runs.CUDA_START_S)
    compiled = graphs.estimate_s() - Mode("x", compile_mode=None).estimate_s()  # bf16 eager, same network
    eager_loops = images / 12_531 + images / (6_593 * 12_531) ** 0.5
    graph_loops = images / 31_963 + images / (9_043 * 31_963) ** 0.5
    expected = gpu_runs.COMPILE_S + 2 * gpu_runs.RECOMPILE_S + graph_loops - eager_loops
    assert compiled == pytest.approx(expected)
    assert gpu_runs.estimates(MODES)[0] == int(-(-fp32.estimate_s(first=True) // 1))


def test_each_mode_is_one_session_of_the_three_sides_on_the_job(tmp_path: Path) -> None:
    command = gpu_runs.session_command(MODES[1], tmp_path)
    assert command[1:3] == ["-m", "benchmarks.paired"] and command[-1] == str(tmp_path)
    spec = json.loads(command[3])
    assert spec["once"] is True and spec["stage"] == "fit"
    setup = Setup(**spec["setup"])
    assert (setup.arch, setup.precision, setup.compile, setup.compile_mode) == (
        "mobilenet_v2",
        "bf16-mixed",
        True,
        "reduce-overhead",
    )
    assert (setup.batch_size, setup.image_size) == (256, 112)
    assert (setup.epochs - 1) * setup.train_batches >= 100  # the steady window: every epoch after the first
    assert "--model.compile_mode=reduce-overhead" in setup.cli_args()
    assert f"--trainer.callbacks+={gpu_runs.PROFILE}" in spec["template_options"]
    eager = Setup(**json.loads(gpu_runs.session_command(MODES[0], tmp_path)[3])["setup"])
    assert (eager.precision, eager.compile) == ("32-true", False)
    assert "--model.compile_mode=default" not in eager.cli_args()


def made_up_session(template_ips: float = 9_000.0) -> dict[str, list[dict[str, Any]]]:
    epochs = [
        {"seconds": 5.0, "samples": 12_800},
        {"seconds": 1.0, "samples": 12_800},
        {"seconds": 1.0, "samples": 12_800},
    ]
    template = {"train_samples_per_second": template_ips, "first_epoch_seconds": 9.0, "peak_memory_mb": [900.0, None]}
    template["environment"] = {"git_commit": "abc"}
    lightning = {"epochs": [{**e, "seconds": e["seconds"] * 1.2} for e in epochs]}  # 10,667 images/s steady
    return {"template": [template], "lightning": [lightning], "plain": [{"epochs": epochs}]}  # plain: 12,800


def test_a_pairs_record_holds_the_ratios_and_the_host_syncs() -> None:
    profile = {"host_syncs": 0.0, "launches": 500.0, "step_seconds": 0.02, "device_idle_fraction": 0.4}
    record = gpu_runs.pair_record(MODES[0], made_up_session(), profile)
    assert record["images_per_second"] == {
        "template": 9_000.0,
        "lightning": pytest.approx(12_800 / 1.2),
        "plain": 12_800.0,
    }
    assert record["ratio_to_plain"] == pytest.approx(9_000 / 12_800)
    assert record["ratio_to_lightning"] == pytest.approx(9_000 * 1.2 / 12_800)
    assert record["host_syncs"] == 0.0 and record["step_profile"] == profile
    assert (record["peak_memory_mib"], record["git_commit"], record["errors"]) == (900.0, "abc", {})


def test_a_side_that_failed_or_did_not_run_leaves_its_ratio_empty() -> None:
    session = made_up_session()
    session["lightning"] = [{"error": "RuntimeError: boom"}]
    del session["plain"]  # stopped at the deadline before it ran
    record = gpu_runs.pair_record(MODES[0], session, None)
    assert record["ratio_to_plain"] is None and record["ratio_to_lightning"] is None and record["host_syncs"] is None
    assert record["errors"] == {"lightning": "RuntimeError: boom", "plain": "did not run"}
    assert gpu_runs.pair_record(MODES[0], {}, None)["images_per_second"] == dict.fromkeys(
        ("template", "lightning", "plain")
    )


timeouts: list[float] = []  # each stand-in session's time limit
folder_inputs: list[float] = []  # each stand-in folder input's time limit


def stand_in(monkeypatch: pytest.MonkeyPatch, codes: list[int | None]) -> list[list[str]]:
    """The sessions replaced: the n-th exits with ``codes[n]`` having written the made-up session (a stopped one:
    the template's side only) and the template's step profile where a real session leaves them."""
    commands: list[list[str]] = []
    timeouts.clear()
    folder_inputs.clear()

    def run_logged(command: list[str], log: Path, timeout_s: float) -> tuple[int | None, str, float]:
        if command[1:3] == ["-m", "benchmarks.folder_input"]:
            folder_inputs.append(timeout_s)
            Path(command[-1]).write_text(json.dumps({"images_per_second": 2_250.0, "workers": 16}))
            return 0, "folder input: 2,250 images/s\n", 12.0
        code = codes[len(commands)]
        commands.append(command)
        timeouts.append(timeout_s)
        folder = Path(command[-1])
        session = made_up_session() if code is not None else {"template": made_up_session()["template"]}
        (folder / "0-template" / "lightning_logs" / "version_0").mkdir(parents=True)
        (folder / "0-template" / "lightning_logs" / "version_0" / "step_profile.json").write_text('{"host_syncs": 0.0}')
        (folder / "session.json").write_text(json.dumps(session))
        log.write_text(f"session {len(commands)}\n")
        return code, f"session {len(commands)}\n", 30.0

    monkeypatch.setattr(gpu_common, "run_logged", run_logged)
    monkeypatch.setattr(gpu_runs, "environment_record", lambda out: {"device_name": "fake"})
    return commands


def test_runs_json_after_each_pair_and_what_would_overrun_is_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    commands = stand_in(monkeypatch, [0, None])
    modes = [Mode("short", precision="32-true"), Mode("stopped"), Mode("too long", compile_mode="default")]
    monkeypatch.setattr(gpu_runs, "estimates", lambda modes, steps: [10, 20, 10_000])
    out = tmp_path / "out"
    records = gpu_runs.run_all(modes, out, tmp_path / "work", deadline_s=100, command="test")
    assert len(commands) == 2 and [r["name"] for r in records] == ["short", "stopped"]
    assert timeouts[0] == 2 * 10 and 0 < timeouts[1] <= 100  # twice its estimate, or what is left of the deadline
    assert [r["status"] for r in records] == ["pass", "stopped at its time limit"]
    saved = json.loads((out / "runs.json").read_text())
    assert saved["runs"] == records and saved["environment"] == {"device_name": "fake"}
    assert saved["runs"][0]["ratio_to_plain"] == pytest.approx(9_000 / 12_800) and saved["runs"][0]["host_syncs"] == 0.0
    assert saved["runs"][1]["images_per_second"]["template"] == 9_000.0 and saved["runs"][1]["ratio_to_plain"] is None
    log = (out / "gpu-run.log").read_text()
    assert "===== short: exit 0" in log and "===== stopped: exit None" in log
    assert "===== folder input: exit 0" in log and len(folder_inputs) == 1 and folder_inputs[0] <= 100
    assert saved["folder_input"]["images_per_second"] == 2_250.0 and saved["folder_input"]["status"] == "pass"
    assert saved["folder_input"]["template_fastest_images_per_second"] == 9_000.0
    assert saved["folder_input"]["ratio_to_template"] == pytest.approx(0.25)
    assert sorted(p.name for p in out.iterdir()) == ["gpu-run.log", "runs.json"]  # few files come back


def test_the_folder_input_runs_before_what_runs_only_if_time_is_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    order: list[str] = []
    stand_in(monkeypatch, [0, 0])
    recorded = gpu_common.run_logged  # the stand-in

    def in_order(command: list[str], log: Path, timeout_s: float) -> tuple[int | None, str, float]:
        order.append(command[2])
        return recorded(command, log, timeout_s)

    monkeypatch.setattr(gpu_common, "run_logged", in_order)
    modes = [Mode("always", precision="32-true"), Mode("if time is left", compile_mode="default", if_time_left=True)]
    monkeypatch.setattr(gpu_runs, "estimates", lambda modes, steps: [10, 10])
    records = gpu_runs.run_all(modes, tmp_path / "out", tmp_path / "work", deadline_s=1_000, command="test")
    assert order == ["benchmarks.paired", "benchmarks.folder_input", "benchmarks.paired"] and len(records) == 2
    assert "gpu_run: folder input: pass; images/s 2250 with 16 workers, 0.25 of the template's fastest training" in (
        capsys.readouterr().out
    )


def test_the_folder_input_is_skipped_when_its_time_is_not_left(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stand_in(monkeypatch, [0])
    monkeypatch.setattr(gpu_runs, "estimates", lambda modes, steps: [10])
    gpu_runs.run_all(MODES[:1], tmp_path / "out", tmp_path / "work", deadline_s=20, command="test")
    saved = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert folder_inputs == [] and saved["folder_input"]["status"] == "skipped"
    assert saved["folder_input"]["reason"].endswith(f"s left for an estimated {gpu_runs.FOLDER_INPUT_S} s")


def test_a_session_that_fails_is_recorded_and_the_next_mode_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stand_in(monkeypatch, [1, 0])
    records = gpu_runs.run_all(MODES[:2], tmp_path / "out", tmp_path / "work", deadline_s=10_000, command="test")
    assert [r["status"] for r in records] == ["exit 1", "pass"]
    assert gpu_runs.summary_line(records[1]) == (
        "mobilenet_v2 bf16 CUDA graphs: pass in 30 s; images/s template 9000, lightning 10667, plain 12800; "
        "template/plain 0.703; template/lightning 0.844"
    )


@pytest.mark.slow
def test_the_script_plans_checks_and_says_when_there_is_no_gpu(tmp_path: Path) -> None:
    def script(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "benchmarks/gpu_run.sh", *args], cwd=REPO, env=python3_first(), capture_output=True, text=True
        )

    planned = script("--plan")
    assert planned.returncode == 0 and plan_steps(planned.stdout.splitlines())[1] <= 420, planned.stderr
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the runs would start")
    ran = script(str(tmp_path / "out"))
    assert ran.returncode == 0 and "gpu_run: no CUDA GPU here" in ran.stdout, ran.stderr
    checked = script("--check", "--out", str(tmp_path / "check"))
    assert checked.returncode == 0 and checked.stdout.startswith("gpu-check: no CUDA GPU here"), checked.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "check").exists()


@pytest.mark.slow
def test_a_tiny_session_runs_the_three_sides_once_and_pairs_them(tmp_path: Path) -> None:
    """One session as the script starts it, on the CPU at 32 px: the template (with its step profile), Lightning's
    bare loop and the plain loop each train, and the record pairs their steady speeds."""
    setup = Setup(image_size=32, batch_size=4, train_batches=3, epochs=2, precision="32-true")
    profile = [f"--trainer.callbacks+={gpu_runs.PROFILE}", "--trainer.callbacks.first_step=1"]
    profile += ["--trainer.callbacks.steps=2", "--trainer.enable_progress_bar=false"]
    command = gpu_runs.session_command(MODES[0], tmp_path, setup=setup, template_options=profile)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    session, step_profile = gpu_runs.read_session(tmp_path)
    assert [len(session[side]) for side in ("template", "lightning", "plain")] == [1, 1, 1]
    record = gpu_runs.pair_record(MODES[0], session, step_profile)
    assert record["errors"] == {} and all(ips > 0 for ips in record["images_per_second"].values())
    assert record["ratio_to_plain"] > 0 and record["ratio_to_lightning"] > 0
    assert step_profile is not None and step_profile["steps"] == 2 and record["host_syncs"] is not None


@pytest.mark.slow
def test_the_folder_input_times_the_folder_modules_loader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Generated JPEGs through ``ImageFolderDataModule``'s real training loader with a worker process."""
    out = tmp_path / "folder-input.json"
    args = ["--workers=1", "--images=4", "--copies=3", "--epochs=2", f"--out={out}"]
    assert folder_input.main(args) == 0
    record = json.loads(out.read_text())
    assert record["files"] == 12 and record["workers"] == 1 and record["batch_size"] == 1  # a tenth of 12 files
    assert record["epoch_images"] == [12, 12] and record["images_per_second"] > 0
    assert record["images_per_second_per_worker"] == record["images_per_second"]
    assert capsys.readouterr().out.startswith("folder input: ")

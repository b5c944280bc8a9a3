"""``python -m project plan`` (project/tools/plan/): its formulas on known inputs, the predictions they add up to,
and the command (a table from a timing.json and the block_times.json beside it, without torch where nothing is
measured here; one-line errors)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from project.tools import plan
from project.tools.plan import Link, Measured, Target

FAST = Link(latency=0.0, bandwidth=1e9, source="given")  # 1 GB/s, no latency: round numbers
MB = 1e6


def measured(**changes: object) -> Measured:
    """A single-device run: batch 32, a step of 0.1 data + 0.2 forward + 0.4 backward + 0.1 optimizer +
    0.2 rest = 1 s; 100 MB of parameters in 4 units (the 2nd and 3rd with 90 % of the FLOPs)."""
    values = dict(
        accelerator="cuda",
        world_size=1,
        batch_size=32,
        data_wait=0.1,
        forward=0.2,
        backward=0.4,
        optimizer=0.1,
        rest=0.2,
        parameter_bytes=100 * MB,
        buffer_bytes=0,
        activation_bytes_per_sample=1 * MB,
        optimizer_state_bytes=100 * MB,
        peak_memory_mb=2000.0,
        units=[
            ["a", 5, 1_000_000, 4000],
            ["b", 45, 10_000_000, 2000],
            ["c", 45, 10_000_000, 1000],
            ["d", 5, 4_000_000, 40],
        ],
    )
    values.update(changes)
    return Measured(**values)  # type: ignore[arg-type]


def test_collective_formulas() -> None:
    assert plan.ring_all_reduce_seconds(100 * MB, 2, FAST) == pytest.approx(0.1)  # 2(N-1)/N = 1
    assert plan.ring_all_reduce_seconds(100 * MB, 8, FAST) == pytest.approx(0.175)  # 2 x 7/8
    assert plan.ring_all_reduce_seconds(100 * MB, 1, FAST) == 0.0
    assert plan.all_gather_seconds(100 * MB, 8, Link(1e-3, 1e9, "")) == pytest.approx(0.0875 + 0.007)
    assert plan.balanced_stages([5, 45, 45, 5], 2) == [[0, 1], [2, 3]]


def test_ddp_hides_all_but_the_last_bucket_behind_a_long_backward_and_nothing_behind_a_single_bucket() -> None:
    buckets = [25 * MB] * 4
    last = plan.ring_all_reduce_seconds(25 * MB, 2, FAST)
    assert plan.ddp_exposed_seconds(buckets, backward=10.0, world=2, link=FAST) == pytest.approx(last)
    whole = plan.ring_all_reduce_seconds(100 * MB, 2, FAST)
    assert plan.ddp_exposed_seconds([100 * MB], backward=10.0, world=2, link=FAST) == pytest.approx(whole)
    assert plan.ddp_exposed_seconds(buckets, backward=0.0, world=2, link=FAST) == pytest.approx(whole)


def test_weak_scaling_with_an_infinitely_fast_link_is_perfect_for_ddp() -> None:
    run = measured()
    infinite = Link(0.0, float("inf"), "given")
    ddp = plan.predict_ddp(run, Target(8, batch="per-device"), infinite, overlap=True)
    assert ddp.step == pytest.approx(run.step) and plan.scaling_efficiency(ddp, run) == pytest.approx(1.0)


def test_strong_scaling_splits_the_batch_work_but_not_the_optimizer_nor_the_rest() -> None:
    run = measured()
    ddp = plan.predict_ddp(run, Target(2), FAST, overlap=True)
    # data and compute halve; the optimizer and the rest do not; 1 MiB + 24 MiB ... buckets of 100 MB
    assert ddp.parts["data_wait"] == pytest.approx(0.05) and ddp.parts["compute"] == pytest.approx(0.3)
    assert (ddp.parts["optimizer"], ddp.parts["rest"]) == (0.1, 0.2)
    expected = plan.ddp_exposed_seconds(plan.ddp_buckets(100 * MB), 0.2, 2, FAST)
    assert ddp.parts["communication"] == pytest.approx(expected) and expected > 0
    assert ddp.samples_per_step == 32
    # processes sharing the cores of the run: the multi-threaded work runs N x slower, data and rest do not
    shared = plan.predict_ddp(run, Target(2, slowdown=2.0), FAST, overlap=True)
    assert shared.parts["compute"] == pytest.approx(0.6) and shared.parts["optimizer"] == pytest.approx(0.2)


def test_on_a_cpu_ddp_hides_none_of_its_all_reduce() -> None:
    run = measured(accelerator="cpu")
    cpu = plan.predict_ddp(run, Target(2), FAST, overlap=False)
    whole = sum(plan.ring_all_reduce_seconds(b, 2, FAST) for b in plan.ddp_buckets(100 * MB))
    assert cpu.parts["communication"] == pytest.approx(whole)
    assert cpu.parts["communication"] > plan.predict_ddp(run, Target(2), FAST, overlap=True).parts["communication"]


def test_a_share_of_the_batch_takes_what_its_blocks_take_at_that_size() -> None:
    # every block measured at 32 and 8 images: a fixed 0.01 s plus the rest per image
    forward = [[0.01 + 0.0009 * 32] * 4, [0.01 + 0.0009 * 8] * 4]
    times = {"batch_sizes": [32, 8], "forward": forward, "backward": [[2 * t for t in row] for row in forward]}
    run = measured(block_seconds=times)
    half_forward, half_backward = plan.share_seconds(run, 0.5)
    ratio = (0.01 + 0.0009 * 16) / (0.01 + 0.0009 * 32)  # half the batch: more than half the time
    assert (half_forward, half_backward) == (pytest.approx(0.2 * ratio), pytest.approx(0.4 * ratio))
    ddp = plan.predict_ddp(run, Target(2), FAST, overlap=True)
    assert ddp.parts["compute"] == pytest.approx(0.6 * ratio) and ratio > 0.5


def test_fsdp_gathers_twice_and_reduce_scatters_once_and_shards_the_states() -> None:
    run = measured()
    gather = plan.all_gather_seconds(100 * MB, 4, FAST)  # 75 ms for 100 MB on 4 devices
    blocking = plan.predict_fsdp(run, Target(4), FAST, overlap=False)
    assert blocking.parts["communication"] == pytest.approx(3 * gather)
    assert blocking.parts["optimizer"] == pytest.approx(0.1 / 4)
    overlapped = plan.predict_fsdp(run, Target(4), FAST, overlap=True)
    assert overlapped.parts["communication"] < blocking.parts["communication"]
    # memory: a quarter of parameters, gradients and optimizer state (300 MB), a quarter of the
    # activations, two copies of the largest unit's parameters, on the run's baseline
    baseline = 2000 - 300 * MB / plan.MIB - 32 * MB / plan.MIB
    expected = baseline + 75 * MB / plan.MIB + 8 * MB / plan.MIB + 2 * (10 / 25 * 100 * MB) / plan.MIB
    assert blocking.memory_mb == [pytest.approx(expected)] * 4


def test_pipeline_with_balanced_stages_idles_as_gpipe_says() -> None:
    run = measured(data_wait=0.0, optimizer=0.0, rest=0.0)
    infinite = Link(0.0, float("inf"), "given")
    pipeline = plan.predict_pipeline(run, Target(2, micro_batches=4), infinite)
    p, m = 2, 4
    assert pipeline.parts["bubble"] / pipeline.step == pytest.approx((p - 1) / (m + p - 1))  # GPipe's bubble
    assert pipeline.step == pytest.approx(0.6 * 0.5 * 5 / 4)  # (m + p - 1) slots of half the compute / m
    # sharing the cores at 2x: equal stages compute together nearly all the step, so it is about the whole compute
    shared = plan.predict_pipeline(run, Target(2, micro_batches=16, slowdown=2.0), infinite)
    assert shared.step >= 0.6


@pytest.mark.parametrize(
    ("forward", "backward", "micro_batches"),
    [([1.0, 1.0], [2.0, 2.0], 4), ([1.0, 3.0], [2.0, 6.0], 4), ([1.0, 2.0, 0.5], [2.0, 4.0, 1.0], 6)],
)
def test_the_played_out_schedule_is_gpipes_without_sharing_and_slows_only_overlaps(
    forward: list[float], backward: list[float], micro_batches: int
) -> None:
    alone = plan.gpipe_step_seconds(forward, backward, micro_batches, 0.0)
    step, busy = plan.gpipe_shared_seconds(forward, backward, micro_batches, 0.0, 1.0)
    assert step == pytest.approx(alone)
    assert busy == pytest.approx([micro_batches * (f + b) for f, b in zip(forward, backward, strict=True)])
    shared, _ = plan.gpipe_shared_seconds(forward, backward, micro_batches, 0.0, 2.0)
    # slower where stages compute together, never the whole schedule twice over (the ramps run alone)
    assert alone < shared < 2 * alone
    assert plan.gpipe_shared_seconds(forward, backward, micro_batches, 0.0, 3.0)[0] > shared


def test_one_stage_shares_with_no_one() -> None:
    assert plan.gpipe_shared_seconds([1.0], [2.0], 4, 0.5, 2.0) == (pytest.approx(12.0), [pytest.approx(12.0)])


def test_a_message_delays_the_next_stage() -> None:
    without, _ = plan.gpipe_shared_seconds([1.0, 1.0], [2.0, 2.0], 1, 0.0, 1.0)
    with_message, _ = plan.gpipe_shared_seconds([1.0, 1.0], [2.0, 2.0], 1, 0.25, 1.0)
    assert with_message == pytest.approx(without + 2 * 0.25)  # one micro-batch: forward and backward each wait


def write_run(folder: Path, **changes: object) -> Path:
    run = measured()
    timing = {
        "strategy": "single_device",
        "accelerator": "cpu",
        "world_size": 1,
        "batch_size": 32,
        "image_size": 32,
        "peak_memory_mb": [2000.0],
        "step_anatomy": {
            "steps": 5,
            "ranks": [
                {"data_wait": 0.1, "compute": 0.6, "forward": 0.2, "backward": 0.4, "communication": 0.0}
                | {"optimizer": 0.1, "bubble": None, "rest": 0.2, "step_seconds": 1.0}
            ],
        },
        "network": {
            "parameters": 25_000_000,
            "parameter_bytes": run.parameter_bytes,
            "buffer_bytes": 0,
            "activation_bytes_per_sample": run.activation_bytes_per_sample,
            "optimizer_state_bytes": run.optimizer_state_bytes,
            "units": run.units,
        },
    }
    timing.update(changes)
    folder.mkdir(parents=True)
    (folder / "timing.json").write_text(json.dumps(timing))
    return folder


def test_the_command_prints_every_strategy_from_a_timing_json_without_importing_torch(tmp_path: Path) -> None:
    folder = write_run(tmp_path / "run")
    code = "import sys\nfrom project.__main__ import main\n"
    code += (
        f"main(['plan', {str(folder)!r}, '--devices', '2', '--link-gbps', '8', '--out', {str(tmp_path / 'out')!r}])\n"
    )
    code += "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.rstrip().endswith("[]")
    assert "measured step 1.000 s" in out and "each device computes 2.00x slower" in out  # a CPU run, one node
    record = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert [p["strategy"] for p in record["predictions"]] == ["single", "dp", "ddp", "fsdp", "pipeline"]
    assert record["predictions"][0]["step_seconds"] == pytest.approx(1.0)
    assert (tmp_path / "out" / "plan.md").read_text().startswith("# Plan")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--devices", "0"], "error: plan --devices=0 is not allowed: it must be >= 1"),
        (["--devices", "2", "--link-gbps", "-1"], "error: plan --link-gbps=-1.0 is not allowed"),
        (["--devices", "2", "--link-gbps", "8", "--timing"], "error: unrecognized arguments: --timing"),
    ],
)
def test_bad_options_get_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], line: str) -> None:
    folder = write_run(tmp_path / "run")
    with pytest.raises(SystemExit) as exit_info:
        plan.main([str(folder), *args])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(line)


def test_a_run_without_anatomy_is_one_line_naming_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = write_run(tmp_path / "old", step_anatomy=None)
    with pytest.raises(SystemExit):
        plan.main([str(folder), "--devices", "2", "--link-gbps", "8"])
    assert "has no step_anatomy or network" in capsys.readouterr().err


def test_pipeline_takes_the_time_its_blocks_were_measured_to_take() -> None:
    # Stages split by FLOPs ([a, b] | [c, d]), but c was measured 10x slower than a: the stages are unequal.
    per_image = [0.01, 0.03, 0.10, 0.01]  # forward seconds per 32 images; backward twice that
    forward = [per_image, [t / 4 for t in per_image]]  # at 32 and 8 images: no fixed cost
    times = {"batch_sizes": [32, 8], "forward": forward, "backward": [[2 * t for t in row] for row in forward]}
    run = measured(data_wait=0.0, optimizer=0.0, rest=0.0, block_seconds=times)
    assert plan.balanced_stages([unit[1] for unit in run.units], 2) == [[0, 1], [2, 3]]
    infinite = Link(0.0, float("inf"), "given")
    pipeline = plan.predict_pipeline(run, Target(2, micro_batches=4), infinite)
    # a micro-batch of 8: stage 0 forward 0.01, backward 0.02; stage 1 forward 0.0275, backward 0.055
    assert pipeline.step == pytest.approx((0.01 + 0.02 + 0.0275 + 0.055) + 3 * (0.0275 + 0.055))
    assert pipeline.parts["compute"] == pytest.approx(4 * (0.0275 + 0.055))  # the slower stage, busy throughout
    assert "timed by block" in pipeline.note
    # without the times: the FLOP split, equal stages, GPipe's bubble
    assert "FLOPs" in plan.predict_pipeline(measured(), Target(2), infinite).note


def test_the_plan_reads_the_block_times_beside_the_timing_json_or_says_how_to_time_them(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = write_run(tmp_path / "run")
    options = ["--devices", "2", "--link-gbps", "8"]
    plan.main([str(folder), *options])
    untimed = capsys.readouterr().out
    assert "stages as their FLOPs" in untimed and plan.TIME_BLOCKS in untimed
    forward = [[0.01, 0.03, 0.10, 0.01], [0.0025, 0.0075, 0.025, 0.0025]]
    times = {"batch_sizes": [32, 8], "forward": forward, "backward": [[2 * t for t in row] for row in forward]}
    (folder / "block_times.json").write_text(json.dumps(times))
    for path in (folder, folder / "timing.json"):
        assert plan.read_run(path).block_seconds == times
        plan.main([str(path), *options])
        timed = capsys.readouterr().out
        assert "stages timed by block" in timed and plan.TIME_BLOCKS not in timed
    (folder / "block_times.json").write_text("{")
    with pytest.raises(SystemExit):
        plan.main([str(folder), *options])
    assert "block_times.json is not a readable block_times.json" in capsys.readouterr().err

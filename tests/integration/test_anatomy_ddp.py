"""The step anatomy of a 2-process ddp run: every rank's parts add up to its measured step, and ``plan`` reads the
record. The run is ``ddp_static`` (a static graph, gradients as bucket views), which the other ddp runs of the
suite, Lightning's own ``ddp``, leave out. (The anatomy's bookkeeping and its window, in one process:
tests/unit/test_anatomy.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_strategy_runs import run_project


@pytest.mark.slow
def test_each_ddp_rank_records_an_anatomy_that_adds_up_and_plan_reads_it(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_project(
        "fit",
        *tiny_args,
        "--trainer.strategy=ddp_static",
        "--trainer.devices=2",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=5",
        "--trainer.num_sanity_val_steps=0",
        "--timing.warmup_iterations=1",
        "--timing.anatomy_steps=3",
        cwd=tmp_path,
    )
    run = tmp_path / "lightning_logs" / "version_0"
    timing = json.loads((run / "timing.json").read_text())
    anatomy = timing["step_anatomy"]
    assert (anatomy["steps"], anatomy["first_batch"], anatomy["clock"]) == (3, 1, "host")
    assert len(anatomy["ranks"]) == 2
    for rank in anatomy["ranks"]:
        assert abs(rank["parts_sum_seconds"] - rank["step_seconds"]) <= 0.10 * rank["step_seconds"]
        assert rank["communication"] > 0  # the last bucket's all-reduce runs after the backward, always
        assert rank["compute"] > 0 and rank["forward"] > 0 and rank["backward"] > 0 and rank["optimizer"] > 0
        assert rank["bubble"] is None
    network = timing["network"]
    assert network["parameters"] > 2e6 and network["parameter_bytes"] == 4 * network["parameters"]
    assert network["optimizer_state_bytes"] == network["parameter_bytes"]  # SGD's momentum, one per parameter

    from project.tools.plan import main as plan_main

    capsys.readouterr()
    plan_main([str(run), "--devices", "4", "--link-gbps", "8", "--out", str(tmp_path / "plan")])
    table = capsys.readouterr().out
    assert all(f"\n{s} " in table for s in ("single", "dp", "ddp", "fsdp", "pipeline"))
    record = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert [p["devices"] for p in record["predictions"]] == [1, 1, 4, 4, 4]  # dp on a CPU: one device

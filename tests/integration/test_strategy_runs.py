"""Every strategy end to end, as a user runs it: ``python -m project fit|validate|test|predict`` in a
process of its own, on the CPU, two processes (gloo) for ddp and fsdp (two machines: test_two_machines.py).
Slow (each run starts Python, torch and Lightning), and still part of CI."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from project.model import ImageClassifier
from tests.integration.test_evaluation_report import confusion_of, read_confusion
from tests.integration.test_strategies import last_checkpoint, recorded, recorder_args
from tests.support.fixtures import TEST_IMAGES, ColourImages
from tests.support.user_nets import sequential_convnet

REPO = Path(__file__).resolve().parents[2]
STOP_AFTER_FIRST_EPOCH = "--trainer.callbacks+=tests.integration.test_strategies.StopAfterFirstEpoch"

# How each strategy is asked for on the command line, and how many processes it runs.
STRATEGIES = {
    "single_device": (["--trainer.strategy=auto"], 1),
    "dp": (["--trainer.strategy=dp"], 1),
    "ddp": (["--trainer.strategy=ddp", "--trainer.devices=2"], 2),
    "fsdp": (["--trainer.strategy=fsdp", "--trainer.devices=2"], 2),
}


def run_project(*args: str, cwd: Path, timeout: float = 300, expect: int = 0, env: dict | None = None) -> str:
    """Run ``python -m project ARGS`` and return its stderr. It may start more processes (ddp's launcher
    does), so a run that outlives ``timeout`` -- a hang -- is killed with its whole process group.
    ``env`` replaces the environment; build it from ``os.environ``, which carries the PYTHONPATH that lets
    the processes import tests/ (tests/conftest.py)."""
    command = [sys.executable, "-m", "project", *args]
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            _, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, err = process.communicate()
            pytest.fail(f"{' '.join(args[:3])} ... still running after {timeout} s (hung?):\n{err[-3000:]}")
    assert process.returncode == expect, f"exit {process.returncode}:\n{err[-4000:]}"
    return err


def evaluate(checkpoint: Path, split: str) -> dict[str, float]:
    """Accuracy and mean loss of a checkpoint on the whole val or test split of the tests' data set, in
    this one process, at the tests' settings (32 px, val_size 41): what a distributed run's metrics must
    equal."""
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    dm = ColourImages(image_size=32, batch_size=20, val_size=41, num_workers=0)
    dm.setup("fit" if split == "val" else "test")
    correct, loss, count = 0, 0.0, 0
    with torch.inference_mode():
        for images, labels in dm.val_dataloader() if split == "val" else dm.test_dataloader():
            logits = model(images)
            correct += int((logits.argmax(1) == labels).sum())
            loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            count += len(labels)
    return {f"{split}/acc": correct / count, f"{split}/loss": loss / count}


def metrics(out: Path, stage: str, split: str) -> dict[str, float]:
    return {k: v for k, v in recorded(out, stage)["metrics"].items() if k in (f"{split}/acc", f"{split}/loss")}


# A user's network that the machinery knows nothing of: an nn.Sequential, split at its children.
USER_NET = "tests.support.user_nets.sequential_convnet"
USER_NET_BLOCKS = ["stem", "block1", "block2", "head"]

# Every strategy but fsdp with MobileNetV2; fsdp, which shards the blocks a network declares, with the user's
# nn.Sequential and with ResNet50 (whose stem block is four of its modules). The others treat every network
# alike (CI time: each of these runs costs 40-60 s).
ARCH_RUNS = [(strategy, "mobilenet_v2") for strategy in STRATEGIES if strategy != "fsdp"]
ARCH_RUNS += [("fsdp", USER_NET), ("fsdp", "resnet50")]


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "arch"), ARCH_RUNS, ids=[f"{s}-{a.rpartition('.')[2]}" for s, a in ARCH_RUNS])
def test_fit_validate_test(strategy: str, arch: str, tiny_args: list[str], tmp_path: Path) -> None:
    strategy_args, world = STRATEGIES[strategy]
    # 41 validation images do not split evenly across 2 processes: fsdp must still not hang
    common = [*tiny_args, "--data.val_size=41", f"--model.arch={arch}", *strategy_args]
    out = tmp_path / "records"
    epochs = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=2"]
    validate_once = ["--trainer.num_sanity_val_steps=0", "--trainer.check_val_every_n_epoch=2"]  # saves time
    err = run_project("fit", *common, *epochs, *validate_once, *recorder_args(out), cwd=tmp_path)

    # rank 0 alone wrote: one run folder, one event file, one config, the checkpoints
    runs = tmp_path / "lightning_logs"
    assert [p.name for p in runs.iterdir()] == ["version_0"]
    run = runs / "version_0"
    assert len(list(run.glob("events.out.tfevents.*"))) == 1 and (run / "config.yaml").is_file()
    checkpoints = sorted((run / "checkpoints").iterdir())
    assert [p.name for p in checkpoints][-1] == "last.ckpt" and len(checkpoints) == 2
    assert all(p.is_file() for p in checkpoints)  # one consolidated file each, fsdp included

    ranks = [recorded(out, "fit", rank) for rank in range(world)]
    assert {r["world_size"] for r in ranks} == {world}
    for r in ranks:
        assert r["batch_sizes"] == [20 // world] * 4  # the global batch of 20, split across the processes
        assert r["epochs"] == [0, 1] and r["train_order"][0] != r["train_order"][1]  # reshuffled each epoch
    for epoch in (0, 1):  # disjoint shards
        shards = [set(r["train_order"][epoch]) for r in ranks]
        assert sum(map(len, shards)) == len(set().union(*shards))
    assert len({len(r["val_batches"]) for r in ranks}) == 1  # as many evaluation steps on every rank
    if strategy == "dp":
        assert ranks[0]["net"][0] == "DataParallel"
        assert all(writes == [] for writes in ranks[0]["module_writes"])  # in the strategy's view, not the module
    plan = json.loads((run / "timing.json").read_text()).get("parallel_plan")
    if strategy == "fsdp":
        for r in ranks:  # parameters, gradients and optimizer state: each rank holds about half
            half = r["params"]["total"] / 2
            assert abs(r["params"]["local"] - half) < 0.02 * half
            assert abs(r["grads"] - half) < 0.02 * half and abs(r["optimizer_state"] - half) < 0.02 * half
        # one unit per block the network declares, then the root; recorded, and printed once (rank 0)
        units = plan["units"]
        assert sum(u["parameters"] for u in units) == ranks[0]["params"]["total"] and units[-1]["name"] == "root"
        if arch == USER_NET:
            assert [u["name"] for u in units] == [*USER_NET_BLOCKS, "root"] and units[-1]["parameters"] == 0
        else:
            assert units[0] == {"name": "stem", "modules": ["conv1", "bn1", "relu", "maxpool"], "parameters": 9536}
        assert err.count("fsdp plan:") == 1
    else:
        assert plan is None

    # validate and test the last checkpoint under the same strategy: reduced across the ranks, the
    # metrics equal a single-process evaluation of that checkpoint over the whole split. validate goes
    # through the same evaluation code as test, so ResNet50 (the slow arch) runs test alone (CI time).
    last = run / "checkpoints" / "last.ckpt"
    stages = (("validate", "val"), ("test", "test")) if arch != "resnet50" else (("test", "test"),)
    for stage, split in stages:
        run_project(stage, *common, "--ckpt_path=last", *recorder_args(out), cwd=tmp_path)
        expected = evaluate(last, split)
        assert metrics(out, stage, split) == pytest.approx(expected, rel=1e-5)
        assert read_confusion(run / f"confusion_{split}.csv") == confusion_of(last, split, val_size=41)  # all ranks'
    # the evaluations of the fit's checkpoint wrote into its folder (rank 0 alone: one config each)
    assert [p.name for p in runs.iterdir()] == ["version_0"]
    assert all((run / f"config-{stage}.yaml").is_file() for stage, _ in stages)
    if strategy == "ddp":  # predict too: each rank its share of the images, predictions.csv all of them once
        run_project("predict", *common, "--ckpt_path=last", cwd=tmp_path)
        assert [int(row["index"]) for row in csv.DictReader(open(run / "predictions.csv"))] == list(range(TEST_IMAGES))


@pytest.mark.slow
def test_a_users_sequential_network_is_pipelined_in_two_stages_and_the_plan_recorded_and_printed_once(
    tiny_args: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "records"
    pipeline = [*tiny_args, f"--model.arch={USER_NET}", f"--config={REPO / 'configs' / 'strategy' / 'pipeline.yaml'}"]
    pipeline += ["--trainer.strategy.micro_batches=2", "--trainer.devices=2"]
    err = run_project(
        "fit",
        *pipeline,
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.num_sanity_val_steps=0",
        *recorder_args(out),
        cwd=tmp_path,
    )
    stages = json.loads((tmp_path / "lightning_logs/version_0/timing.json").read_text())["parallel_plan"]["stages"]
    total = sum(p.numel() for p in sequential_convnet(num_classes=10, in_channels=3).parameters())
    assert len(stages) == 2 and all(stage["parameters"] > 0 for stage in stages)
    assert sum(stage["parameters"] for stage in stages) == total
    assert [name for stage in stages for name in stage["blocks"]] == USER_NET_BLOCKS  # in order, each once
    assert [stage["modules"] for stage in stages] == [stage["blocks"] for stage in stages]  # the children
    assert err.count("pipeline plan:") == 1
    run = tmp_path / "lightning_logs/version_0"  # every stage saw every image; each counted once
    assert read_confusion(run / "confusion_val.csv") == confusion_of(run / "checkpoints/last.ckpt", "val", val_size=40)
    for rank in (0, 1):  # trained and validated through the stages, without a write on the module object
        record = recorded(out, "fit", rank)
        assert record["params"]["local"] == stages[rank]["parameters"]
        assert len(record["losses"]) == 2 and record["val_batches"]
        assert record["module_writes"] and all(writes == [] for writes in record["module_writes"])
    # predicted through the stages too: every stage predicts every image, predictions.csv holds each once
    run_project("predict", *pipeline, "--ckpt_path=last", cwd=tmp_path)
    assert [int(row["index"]) for row in csv.DictReader(open(run / "predictions.csv"))] == list(range(TEST_IMAGES))


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy_args",
    [
        ["--trainer.strategy=ddp", "--trainer.devices=2"],
        [f"--config={REPO / 'configs' / 'strategy' / 'fsdp.yaml'}", "--trainer.devices=2"],  # the YAML form
    ],
    ids=["ddp", "fsdp"],
)
def test_resumed_run_ends_with_the_weights_of_an_unbroken_one(
    strategy_args: list[str], tiny_args: list[str], tmp_path: Path
) -> None:
    common = [
        *tiny_args,
        *strategy_args,
        "--trainer.max_epochs=2",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=2",
        "--trainer.deterministic=true",
    ]
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    run_project("fit", *common, f"--trainer.default_root_dir={unbroken}", cwd=tmp_path)
    run_project("fit", *common, f"--trainer.default_root_dir={broken}", STOP_AFTER_FIRST_EPOCH, cwd=tmp_path)
    resume = [f"--trainer.default_root_dir={broken}", *recorder_args(tmp_path / "records"), "--ckpt_path=last"]
    run_project("fit", *common, *resume, cwd=tmp_path)
    for rank in (0, 1):
        record = recorded(tmp_path / "records", "fit", rank)
        assert record["start"] == {"epoch": 1, "global_step": 2} and record["epochs"] == [1]
    expected, actual = last_checkpoint(unbroken)["state_dict"], last_checkpoint(broken, 1)["state_dict"]
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-7, msg=name)


@pytest.mark.slow
def test_fsdp_checkpoint_serves_a_single_device_and_uneven_data_is_refused_not_hung(
    tiny_args: list[str], tmp_path: Path
) -> None:
    fsdp = ["--trainer.strategy=fsdp", "--trainer.devices=2"]
    run_project("fit", *tiny_args, *fsdp, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", cwd=tmp_path)
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    single = [*tiny_args, "--trainer.strategy=auto", "--trainer.devices=1", f"--ckpt_path={last}"]
    run_project("test", *single, *recorder_args(tmp_path / "records"), cwd=tmp_path)
    assert recorded(tmp_path / "records", "test")["strategy"] == "SingleDeviceStrategy"
    assert {"test/acc", "test/loss"} <= recorded(tmp_path / "records", "test")["metrics"].keys()
    err = run_project("predict", *single, cwd=tmp_path)
    assert "Traceback" not in err

    # 41 test images, 10 a batch on each of 2 processes: 3 batches and 2. Prediction (unlike val and
    # test) keeps Lightning's sampler, so fsdp must refuse it rather than wait forever.
    synthetic = ["--data.synthetic=true", "--data.synthetic_size=205", "--data.val_size=5"]
    err = run_project("predict", *tiny_args, *fsdp, *synthetic, cwd=tmp_path, timeout=120, expect=2)
    # Both ranks print the error line into the shared stderr. Now and then the second one then aborts in
    # C++ while gloo shuts down (seen in 1 of 6 CI runs, cause not found; the README says so), so the
    # error is looked for among the lines rather than as the last one.
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")][-1] == (
        "error: fsdp needs the same number of batches on every process (each forward pass is collective), but "
        "this data gives the processes [3, 2]; change data.batch_size, or run it on one device (fsdp checkpoints "
        "are single files)"
    )


@pytest.mark.slow
def test_a_ddp_run_with_the_step_profile_ends_and_writes_it(tiny_args: list[str], tmp_path: Path) -> None:
    """StepProfile profiles rank 0 only, but every rank reads the run folder (a collective under ddp): a rank
    that skipped it would leave the others waiting, and the run would hang until the timeout below."""
    run_project(
        "fit",
        *tiny_args,
        *STRATEGIES["ddp"][0],
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=4",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.callbacks+=project.toolkit.timing.step_profile.StepProfile",
        "--trainer.callbacks.first_step=1",
        "--trainer.callbacks.steps=2",
        cwd=tmp_path,
        timeout=240,
    )
    (written,) = tmp_path.glob("lightning_logs/version_*/step_profile.json")
    summary = json.loads(written.read_text())
    assert (summary["first_step"], summary["steps"]) == (1, 2) and summary["device"] == "cpu"
    assert summary["step_seconds"] > 0 and (written.parent / "step_profile.trace.json").is_file()

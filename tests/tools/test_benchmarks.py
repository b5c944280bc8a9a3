"""The performance benchmarks under ``benchmarks/`` (``make bench-perf`` runs them, for minutes):
that they import and start as modules from the repository root without any PYTHONPATH, that the
children they launch can find what they name, and that the callback stamping the template's
steps records them."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.stamps import StepStamps
from tests.conftest import quiet_trainer

if TYPE_CHECKING:
    from benchmarks.host_calls import CallCounter

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = [
    "benchmarks.overhead",
    "benchmarks.inference",
    "benchmarks.input",
    "benchmarks.decoding",
    "benchmarks.parity",
    "benchmarks.host_memory",
    "benchmarks.timing_cost",
    "benchmarks.host_calls",
]


def without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.parametrize(
    "name",
    [
        "benchmarks._common",
        "benchmarks.plain",
        "benchmarks.digits",
        "benchmarks.paired",
        "benchmarks.lightning_loop",
        "benchmarks.folder_input",
        "benchmarks.gpu_check_paths",
        *SCRIPTS,
    ],
)
def test_every_benchmark_module_imports(name: str) -> None:
    module = importlib.import_module(name)
    assert Path(module.__file__).parent == REPO / "benchmarks"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_benchmark_has_its_options(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(name).main(["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m {name} ")


@pytest.mark.parametrize("name", [name for name in SCRIPTS if name != "benchmarks.host_calls"])  # counts: run once
def test_every_benchmark_refuses_repeats_that_measure_nothing(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    for wrong in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as refused:
            importlib.import_module(name).main(["--repeats", wrong])
        error = capsys.readouterr().err.splitlines()[-1]
        assert refused.value.code == 2 and error.endswith(f"argument --repeats: {wrong!r}: a whole number above 0")


def test_a_benchmark_starts_as_a_module_from_the_repository_root_without_pythonpath() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.overhead", "--help"],
        cwd=REPO,
        env=without_pythonpath(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: python -m benchmarks.overhead ") and "--options" in result.stdout


def test_the_children_are_started_in_the_repository_root_by_names_that_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import _common

    launched: list[tuple[list[str], dict]] = []

    def fake_run(command: list[str], **options: object) -> subprocess.CompletedProcess:
        launched.append((command, options))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(_common.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    out = tmp_path / "plain" / "plain.json"
    out.parent.mkdir()
    out.write_text("[{}]")
    _common.plain_fit_run(_common.Setup(), out, threads=1)
    folder = tmp_path / "template"
    (folder / "lightning_logs" / "version_0").mkdir(parents=True)
    (folder / "lightning_logs" / "version_0" / "timing.json").write_text("{}")
    (folder / "clock.json").write_text("{}")
    assert _common.template("fit", _common.Setup(), folder, threads=0) == {"clock": {}}

    (plain, plain_options), (template, template_options) = launched
    assert plain[1:3] == ["-m", "benchmarks.plain"]
    assert template[1:4] == ["-m", "project", "fit"]
    for options in (plain_options, template_options):
        assert options["cwd"] == REPO  # where -m finds this checkout's project and benchmarks
        assert options["env"]["PYTHONPATH"] == "/somewhere"  # the caller's, untouched
    assert plain_options["env"]["OMP_NUM_THREADS"] == "1"
    callback = next(a.split("=", 1)[1] for a in template if a.startswith("--trainer.callbacks+="))
    module, _, name = callback.rpartition(".")
    assert getattr(importlib.import_module(module), name) is StepStamps


class Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3 * 4 * 4, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.flatten(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("loss", F.cross_entropy(self(batch[0]), batch[1]))

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0]).argmax(1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_step_stamps_record_every_step_of_fit_test_and_predict(tmp_path: Path) -> None:
    data = TensorDataset(torch.randn(20, 3, 4, 4), torch.randint(0, 10, (20,)))
    loader = DataLoader(data, batch_size=5)
    path = tmp_path / "stamps" / "clock.json"
    stamps = StepStamps(str(path))
    options = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    trainer = Trainer(fast_dev_run=3, callbacks=[stamps], default_root_dir=tmp_path, **options)
    model = Tiny()
    trainer.fit(model, loader)
    written = json.loads(path.read_text())
    for clock in (written, written["cpu"]):  # wall seconds, and the process's CPU seconds in the same layout
        (start,), (ends,) = clock["epoch_starts"], clock["train_batch_ends"]
        assert len(ends) == 3 and start <= ends[0] <= ends[1] <= ends[2] <= clock["train_end"]

    trainer.test(model, loader, verbose=False)
    trainer.predict(model, loader)
    written = json.loads(path.read_text())
    for batches in (written["eval_batches"], written["cpu"]["eval_batches"]):
        assert len(batches) == 6  # three of test, then three of predict
        assert all(start <= end and images == 5 for start, end, images in batches)
        assert all(a[1] <= b[0] for a, b in zip(batches, batches[1:], strict=False))  # one after the other


@pytest.mark.slow
def test_a_session_runs_every_side_alternated_in_a_fresh_process_without_pythonpath(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from benchmarks import _common

    monkeypatch.delenv("PYTHONPATH", raising=False)
    setup = _common.Setup(image_size=32, batch_size=4, test_batches=3)
    ran = _common.session("test", setup, tmp_path, threads=1)
    assert {side: len(runs) for side, runs in ran.items()} == {"plain": 2, "lightning": 2, "template": 2}
    for runs in ran.values():
        assert all(len(run["clock"]["eval_batches"]) == 3 for run in runs)
    assert all(run["test_samples_per_second"] > 0 for run in ran["template"])  # its timing.json
    # each run in a folder of its own, numbered in the order they ran: there and back again
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert folders == ["0-plain", "1-lightning", "2-template", "3-template", "4-lightning", "5-plain"]


@pytest.mark.slow
def test_the_host_memory_benchmark_reads_both_settings_from_timing_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from benchmarks import _common, host_memory

    tiny = _common.Setup(image_size=32, batch_size=4, train_batches=2, epochs=1, test_batches=2)
    monkeypatch.setattr(host_memory, "DEFAULT_SIZE", tiny)
    host_memory.main(["--repeats", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "host_memory.json").read_text())
    assert [case["stage"] for case in report["cases"]] == ["test", "fit"]
    for case in report["cases"]:
        assert {name: len(runs) for name, runs in case["runs"].items()} == {"on": 1, "off": 1}
        assert all(seconds > 0 and peak > 0 for runs in case["runs"].values() for seconds, peak in runs)
        assert case["speedup"] == pytest.approx(case["runs"]["off"][0][0] / case["runs"]["on"][0][0])
    least = min(report["cases"], key=lambda case: case["speedup"])
    assert report["headline"].endswith(f"({least['stage']}, the smallest gain)")


def test_the_decoding_benchmark_times_every_side_on_generated_photos(tmp_path: Path) -> None:
    from benchmarks import decoding

    decoding.main(["--images", "2", "--repeats", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "decoding.json").read_text())
    cases = [(kind, size) for kind in decoding.GRAIN for size in decoding.SIZES]
    assert [(case["kind"], case["size"]) for case in report["cases"]] == cases and report["images"] == 2
    for case in report["cases"]:
        assert all(rate["cpu"] > 0 and rate["wall"] > 0 for rate in case["images_per_second"].values())
        assert case["ratios"]["whole"] == [1.0] and case["differences"]["reduced"]["mean"] < 2
    assert report["headline"].startswith("decoding: reduced-scale/whole-file images per CPU second")
    assert "| photos | resize | decoding |" in (tmp_path / "decoding.md").read_text()


def test_plain_stamps_take_the_layout_of_the_template_stamps() -> None:
    from benchmarks.plain import as_layout

    pairs = {"epoch_starts": [(1.0, 0.1)], "train_batch_ends": [[(2.0, 0.2), (3.0, 0.3)]], "train_end": (4.0, 0.4)}
    pairs["eval_batches"] = [[(5.0, 0.5), (6.0, 0.6), 8]]
    assert as_layout(pairs) == {
        "epoch_starts": [1.0],
        "train_batch_ends": [[2.0, 3.0]],
        "train_end": 4.0,
        "eval_batches": [[5.0, 6.0, 8]],
        "cpu": {
            "epoch_starts": [0.1],
            "train_batch_ends": [[0.2, 0.3]],
            "train_end": 0.4,
            "eval_batches": [[0.5, 0.6, 8]],
        },
    }


def test_the_template_side_runs_with_the_default_input_path_unless_told() -> None:
    from benchmarks._common import Setup

    default = Setup(image_size=32, batch_size=128).cli_args()
    assert not any(a.startswith(("--data.on_device", "--data.num_workers", "--data=")) for a in default)
    assert "--data.synthetic=true" in default and "--trainer.limit_train_batches=4" in default
    digits = Setup(data="benchmarks.digits.DigitsDataModule", train_batches=None, val_size=200, on_device=False)
    args = digits.cli_args()
    assert args[0] == "--data=benchmarks.digits.DigitsDataModule" and "--data.on_device=false" in args
    assert "--data.val_size=200" in args and not any(a.startswith("--trainer.limit_train") for a in args)
    assert not any("synthetic" in a for a in args)


def test_digits_are_upscaled_grey_in_three_channels_with_a_fixed_test_split(monkeypatch: pytest.MonkeyPatch) -> None:
    # scikit-learn stands in here: the suite does not need it (the parity extra installs it)
    rng = np.random.default_rng(0)
    digits = SimpleNamespace(images=rng.integers(0, 17, (1797, 8, 8)).astype(float), target=np.arange(1797) % 10)
    fake = types.ModuleType("sklearn.datasets")
    fake.load_digits = lambda: digits
    monkeypatch.setitem(sys.modules, "sklearn", types.ModuleType("sklearn"))
    monkeypatch.setitem(sys.modules, "sklearn.datasets", fake)
    from benchmarks.digits import TEST_IMAGES, DigitsDataModule, digits_arrays

    images, labels = digits_arrays()
    assert images.shape == (1797, 32, 32, 3) and images.dtype == np.uint8
    assert (images[..., 0] == images[..., 2]).all()  # grey, copied into every channel
    assert (images[:, :4, :4, 0] == np.rint(digits.images[:, :1, :1] * 255 / 16)).all()  # one pixel, 4 x 4
    assert images.max() <= 255 and (images == 255).any()  # 16 is white
    data = DigitsDataModule(image_size=32, batch_size=8, val_size=8)
    (train, train_labels), (test, test_labels) = data.load_split(True), data.load_split(False)
    assert len(test) == len(test_labels) == TEST_IMAGES and len(train) == len(train_labels) == 1797 - TEST_IMAGES
    assert set(map(bytes, train)).isdisjoint(map(bytes, test))
    assert np.array_equal(data.load_split(False)[1], test_labels)  # the same split every time


@pytest.mark.slow
@pytest.mark.parametrize("name", ["overhead", "inference"])
def test_a_comparison_runs_real_sessions_and_reports_their_ratios(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from benchmarks import _common, inference, overhead

    tiny = _common.Setup(image_size=32, batch_size=4, train_batches=3, epochs=2, test_batches=6)
    monkeypatch.setattr(overhead, "CASES", [tiny])
    monkeypatch.setattr(inference, "CASES", [("test tiny", "test", tiny, 4, "throughput")])
    module = {"overhead": overhead, "inference": inference}[name]
    sessions = []
    real_session = _common.session

    orders = []

    def recorded(*args: Any, **kwargs: Any) -> dict:
        sessions.append(real_session(*args, **kwargs))
        folder = args[2]  # session(stage, setup, folder, ...): its runs' folders numbered in the order they ran
        orders.append(sorted(p.name for p in folder.iterdir() if p.is_dir()))
        return sessions[-1]

    monkeypatch.setattr(_common, "session", recorded)
    module.main(["--repeats", "2", "--out", str(tmp_path), "--clock", "cpu"])
    (case,) = json.loads((tmp_path / f"{name}.json").read_text())["cases"]
    assert len(sessions) == 2 and all(len(s["plain"]) == len(s["template"]) == 2 for s in sessions)
    assert orders == [  # the second session in the next rotation
        ["0-plain", "1-lightning", "2-template", "3-template", "4-lightning", "5-plain"],
        ["0-lightning", "1-template", "2-plain", "3-plain", "4-template", "5-lightning"],
    ]
    key = "cpu_images_per_second" if name == "overhead" else "cpu_speed"
    runs = case["runs"]  # every session's runs, in order: two of each side per session
    own = []
    for number, ratio in enumerate(case["cpu_session_ratios"]):
        template, lightning, plain = (
            runs[side][2 * number : 2 * number + 2] for side in ("template", "lightning", "plain")
        )
        assert ratio == pytest.approx((template[0][key] + template[1][key]) / (plain[0][key] + plain[1][key]))
        floor = case["sessions"][number]["lightning_cpu"]  # Lightning's loop alone, over the plain loop
        assert floor == pytest.approx((lightning[0][key] + lightning[1][key]) / (plain[0][key] + plain[1][key]))
        own.append((template[0][key] + template[1][key]) / (lightning[0][key] + lightning[1][key]))
    assert case["cpu_ratio"] == pytest.approx(sum(case["cpu_session_ratios"]) / 2)  # one round's mean
    assert case["lightning_cpu_ratio"] == pytest.approx(sum(s["lightning_cpu"] for s in case["sessions"]) / 2)
    assert case["over_lightning_cpu_ratio"] == pytest.approx(sum(own) / 2)  # the template over Lightning's loop alone
    assert case["ratio"] == case["cpu_ratio"]  # the CPU clock decides on a CPU-only machine
    assert "2 sessions in rotated orders" in (tmp_path / f"{name}.md").read_text()


def test_the_headline_is_the_median_over_rounds_of_three_sessions_of_each_rounds_mean(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from benchmarks import _common, inference

    # Nine sessions of made-up stamps: evaluation steps of 1 s on the plain side, 1/0.98 s on the lightning side,
    # 1/ratio s on the template's. Round means 0.9467, 0.99 and 0.9133: their median 0.9467, where the median of
    # all nine would give 0.97 and their mean 0.95; over Lightning's loop alone, each of them / 0.98. One round of
    # the three reaches the goal.
    session_ratios = [0.90, 0.95, 0.99, 0.99, 0.99, 0.99, 0.80, 0.97, 0.97]
    template_ratios = iter(session_ratios)
    rotations = []

    def stamps(step: float) -> dict:
        batches = [[i * step, (i + 0.5) * step, 4] for i in range(8)]
        return {"clock": {"eval_batches": batches, "cpu": {"eval_batches": batches}}}

    def made_up_session(*args: object, rotation: int, **kwargs: object) -> dict:
        rotations.append(rotation)
        template = stamps(1 / next(template_ratios))
        return {"plain": [stamps(1.0)] * 2, "lightning": [stamps(1 / 0.98)] * 2, "template": [template] * 2}

    monkeypatch.setattr(_common, "session", made_up_session)
    monkeypatch.setattr(inference, "CASES", [("test", "test", _common.Setup(), 4, "throughput")])
    inference.main(["--repeats", "9", "--out", str(tmp_path), "--clock", "cpu"])
    (case,) = json.loads((tmp_path / "inference.json").read_text())["cases"]
    assert rotations == list(range(9))  # each session its own order
    assert case["cpu_session_ratios"] == pytest.approx(session_ratios)
    assert case["ratio"] == pytest.approx((0.90 + 0.95 + 0.99) / 3)  # the first round's mean
    assert case["lightning_cpu_ratio"] == pytest.approx(0.98)
    assert case["over_lightning_cpu_ratio"] == pytest.approx((0.90 + 0.95 + 0.99) / 3 / 0.98)
    table = (tmp_path / "inference.md").read_text()
    assert "| template/lightning |" in table.splitlines()[0] and table.splitlines()[2].endswith("| 0.980 | 0.966 |")
    headline = table.splitlines()[-1]
    assert "ratio 0.947" in headline and "0.800 to 0.990" in headline
    assert headline.endswith("goal >= 0.98: MISSED, 1 of 3 rounds at or over it")


def test_batch_sizes_measure_mobilenets_test_at_each_size_none_held_to_the_goal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from benchmarks import _common, inference

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU's MobileNetV2 setup
    sizes = []

    def made_up_session(stage: str, setup: _common.Setup, *args: Any, rotation: int, **kwargs: Any) -> dict:
        sizes.append((stage, args[2], setup.test_batches))  # args: folder, threads, batch_size
        step = 1.0 if args[2] == 512 else 1 / 0.9  # the template at 0.9 of the plain loop's speed at batch 32
        template = {"eval_batches": [[i * step, (i + 0.5) * step, 4] for i in range(8)]}
        plain = {"eval_batches": [[i, i + 0.5, 4] for i in range(8)]}
        as_run = [{"clock": {**clock, "cpu": clock}} for clock in (plain, template)]
        return {"plain": [as_run[0]] * 2, "lightning": [as_run[0]] * 2, "template": [as_run[1]] * 2}

    monkeypatch.setattr(_common, "session", made_up_session)
    inference.main(["--batch-sizes", "32,512", "--repeats", "3", "--out", str(tmp_path), "--clock", "cpu"])
    # about as many images a run as the default case's 24 batches of 128, at least 12 batches
    assert sizes == [("test", 32, 96)] * 3 + [("test", 512, 12)] * 3
    cases = json.loads((tmp_path / "inference.json").read_text())["cases"]
    assert [(c["case"], c["batch_size"], c["goal"]) for c in cases] == [
        ("test mobilenet_v2, batch 32", 32, False),
        ("test mobilenet_v2, batch 512", 512, False),
    ]
    headline = (tmp_path / "inference.md").read_text().splitlines()[-1]
    each = "test mobilenet_v2, batch 32: 0.900; test mobilenet_v2, batch 512: 1.000"
    assert headline.endswith(f"none held to the goal: {each}")
    assert inference.batch_sizes("32, 64") == [32, 64]
    for wrong in ("32,0", "32,032", "", "32;64"):
        with pytest.raises(SystemExit) as refused:
            inference.main(["--batch-sizes", wrong])
        assert refused.value.code == 2 and f"{wrong!r}: comma-separated batch sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # the sweep has no options' cases
        inference.main(["--batch-sizes", "32", "--options"])
    assert refused.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


class SlowValidation(LightningModule):
    """Training steps of no time to speak of, validation steps of 0.5 s, 8 images a batch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        import time

        time.sleep(0.5)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_epoch_walls_count_the_images_and_leave_the_validation_out(tmp_path: Path) -> None:
    from benchmarks.timing_cost import EpochWalls, steady_speed

    walls = EpochWalls(str(tmp_path / "epochs.json"))
    data = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=8)
    trainer = quiet_trainer(tmp_path, max_epochs=2, callbacks=[walls], num_sanity_val_steps=0)
    trainer.fit(SlowValidation(), data, data)  # a validation of 3 x 0.5 s at the end of each epoch
    epochs = json.loads((tmp_path / "epochs.json").read_text())
    assert [e["images"] for e in epochs] == [24, 24]
    assert all(0 < e["seconds"] < 0.75 for e in epochs), epochs  # the 1.5 s of validation left out
    assert steady_speed(epochs) == pytest.approx(24 / epochs[1]["seconds"])


@pytest.mark.slow
def test_the_timing_cost_runs_a_real_session_of_every_variant(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from benchmarks import _common, timing_cost

    tiny = _common.Setup(image_size=32, batch_size=4, train_batches=3, epochs=2)
    monkeypatch.setattr(timing_cost, "CPU_CASES", [tiny])
    timing_cost.main(["--repeats", "1", "--out", str(tmp_path)])
    (case,) = json.loads((tmp_path / "timing_cost.json").read_text())["cases"]
    assert {name: len(speeds) for name, speeds in case["runs"].items()} == {"off": 2, "on": 2, "sync every step": 2}
    assert all(speed > 0 for speeds in case["runs"].values() for speed in speeds)
    on, off = case["runs"]["on"], case["runs"]["off"]
    assert case["ratios"]["on"] == pytest.approx(sum(on) / sum(off))  # one session: its mean over off's
    headline = (tmp_path / "timing_cost.md").read_text().splitlines()[-1]
    met = case["ratios"]["on"] >= timing_cost.GOAL
    assert headline.startswith("timing_cost: min on/off speed ratio")
    assert headline.endswith(f"{'met' if met else 'MISSED'}, no whole round of 3 sessions to say how firmly")


@pytest.mark.parametrize("gpu", [False, True])
def test_the_comparisons_take_the_cases_of_the_machine(monkeypatch: pytest.MonkeyPatch, gpu: bool) -> None:
    from benchmarks import inference, overhead

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    fits = [setup for setup, _ in overhead.chosen_cases(options=True)]
    evaluations = [case for case, _ in inference.chosen_cases(options=False)]
    size, batch = (112, 256) if gpu else (32, 128)  # on a GPU the job's settings; on a CPU small images
    assert fits[0].image_size == size and fits[0].batch_size == batch
    assert [f.compile for f in fits].count(True) == 1 and fits[-1].host_memory_reuse is False  # --options
    assert {setup.image_size for _, _, setup, _, _ in evaluations} == {size}
    assert [b for *_, b, kind in evaluations if kind == "throughput"][0] == batch


def test_only_the_default_options_are_held_to_the_goal(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import inference, overhead

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU's cases, named below
    fits = overhead.chosen_cases(options=True)
    assert [held for _, held in fits] == [True] * len(overhead.CASES) + [False] * len(overhead.OPTIONS)
    evaluations = inference.chosen_cases(options=True)
    held = {name for (name, *_), goal in evaluations if goal}
    assert held == {name for name, *_, kind in inference.CASES if kind == "throughput"}  # not batch 1
    assert all(not goal for (name, *_), goal in evaluations if name in {c[0] for c in inference.OPTION_CASES})


def _steps(counter: CallCounter, work: Callable[[int], object], steps: int = 5) -> dict[str, dict[str, float]]:
    """``steps`` steps of ``work(step)``, counted by ``counter``; its means per batch."""
    for step in range(steps):
        counter.step_started()
        work(step)
        counter.step_ended()
    counter.stop()
    assert [len(counter.windows[w]) for w in ("step", "between")] == [steps, steps - 1]  # none after the last
    return counter.per_batch()


def test_the_call_counter_counts_a_steps_calls_and_puts_a_modules_to_the_network() -> None:
    from benchmarks import host_calls

    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.zeros(1, 4)

    def step_calls(step: int) -> None:  # step k: k built-in calls
        for _ in range(step):
            len("x")

    idle = _steps(host_calls.CallCounter(), lambda step: None)
    busy = _steps(host_calls.CallCounter(), step_calls)
    network = _steps(host_calls.CallCounter(), lambda step: net(x))
    # each step: the counter's own calls at its ends, the step's function, and what that calls; the mean is
    # over the steps after the warm-up
    after_warmup = range(host_calls.WARMUP_BATCHES, 5)
    assert busy["step"][host_calls.REST] - idle["step"][host_calls.REST] == sum(after_warmup) / len(after_warmup)
    for counts in (busy, idle):  # the calls only: a collection of the process's may fall in either's windows
        counts["between"].pop(host_calls.COLLECTIONS)
    assert busy["between"] == idle["between"]
    assert network["step"][host_calls.REST] == idle["step"][host_calls.REST]  # all else is under the module call
    assert network["step"][host_calls.NETWORK] > 3  # the modules' calls, their forward and torch's functions


def test_the_call_counter_names_lightnings_calls_by_the_function_its_loop_called() -> None:
    from benchmarks import host_calls

    # Code compiled under the file names Lightning's loop and one of its connectors have in site-packages.
    loop: dict[str, Any] = {"__name__": "lightning.pytorch.loops.fake"}
    connector: dict[str, Any] = {"__name__": "lightning.pytorch.trainer.connector"}
    exec(compile("def run(work):\n    work()\n    len('x')\n", "/sp/lightning/pytorch/loops/fake.py", "exec"), loop)
    on_batch_end = "def on_batch_end():\n    len('y')\n    len('z')\n"
    exec(compile(on_batch_end, "/sp/lightning/pytorch/trainer/connector.py", "exec"), connector)
    counts = _steps(host_calls.CallCounter(), lambda step: loop["run"](connector["on_batch_end"]))
    assert counts["step"]["Lightning: connector.on_batch_end"] == 3  # its call and its two built-ins
    assert counts["step"]["Lightning: the loop"] == 2  # run's call and the built-in it makes itself


def test_the_call_counter_counts_garbage_collections_by_window() -> None:
    import gc

    from benchmarks import host_calls

    enabled = gc.isenabled()
    gc.disable()  # no collection but the step's own: the counts are exact
    counter = host_calls.CallCounter()
    try:
        counts = _steps(counter, lambda step: gc.collect())
    finally:
        if enabled:
            gc.enable()
    assert counts["step"][host_calls.COLLECTIONS] == 1
    assert counts["between"][host_calls.COLLECTIONS] == 0
    assert not any(origin.endswith(":_collected") for origin in counts["step"])  # the counter's own callback
    assert counter._collected not in gc.callbacks  # stop() took it out
    assert host_calls.total({host_calls.COLLECTIONS: 1.0, host_calls.REST: 2.0}) == 2.0  # collections are not calls


def test_the_counting_callback_stops_its_counter_when_the_run_raises(tmp_path: Path) -> None:
    import gc

    from benchmarks import host_calls

    steps = host_calls.CountedSteps(str(tmp_path / "calls.json"))
    steps.on_test_batch_start(None, None)  # type: ignore[arg-type]  # the hooks use neither trainer nor module
    counting = (sys.getprofile(), steps.counter._collected in gc.callbacks)
    steps.on_exception(None, None, RuntimeError("a failed run"))  # type: ignore[arg-type]
    assert counting == (steps.counter._count, True)
    assert sys.getprofile() is None and steps.counter._collected not in gc.callbacks


@pytest.mark.slow
def test_host_calls_counts_every_sides_calls_per_batch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from benchmarks import _common, host_calls

    monkeypatch.setattr(host_calls, "SETUP", _common.Setup(image_size=32, batch_size=4, test_batches=6))
    host_calls.main(["--out", str(tmp_path)])
    calls = json.loads((tmp_path / "host_calls.json").read_text())["calls"]
    for stage in host_calls.STAGES:
        sides = calls[stage]
        network = {side: sides[side]["step"][host_calls.NETWORK] for side in _common.SIDES}
        # one forward of the same network everywhere; the template's also goes through its LightningModule's call
        # (in this torch: _wrapped_call_impl, _call_impl and its forward; its own lines count as the template's)
        assert network["plain"] == network["lightning"] > 1000
        assert 0 < network["template"] - network["plain"] <= 5
        per_batch = {side: sum(host_calls.total(sides[side][w]) for w in host_calls.WINDOWS) for side in _common.SIDES}
        assert per_batch["plain"] < per_batch["lightning"] < per_batch["template"]
        assert any(origin.startswith("project/model.py:") for origin in sides["template"]["step"])
        # Lightning's own work, by what its loop called, on both Lightning sides only
        assert sides["lightning"]["between"]["Lightning: call._call_strategy_hook"] > 0  # the batch's transfer
        assert not any(origin.startswith(host_calls.LIGHTNING) for origin in sides["plain"]["step"])
        assert all(host_calls.COLLECTIONS in sides[side][w] for side in _common.SIDES for w in host_calls.WINDOWS)
    report = (tmp_path / "host_calls.md").read_text()
    assert "Python calls in the plain loop" in report
    assert "| test | between | Lightning: logger_connector.on_batch_end |" in report  # the third table

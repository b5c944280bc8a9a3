"""The fault probe: bad input and faults a careful user (or a full disk, a busy port, memory running out)
meets, each through the command line as a user runs it. Each case ends in ONE ``error:`` line naming the
value and what is allowed, exit status 2, no traceback, and no run folder left behind where the run had
not trained yet. Most cases fail before any training step (fast); the multi-process faults are in
tests/faults/test_faults.py, marked slow. tests/faults/test_bad_input.py holds the option checks of the same kind.
"""

from __future__ import annotations

import errno
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning
import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from project.__main__ import main
from project.model import ImageClassifier
from project.toolkit.cli import checks as preflight
from project.toolkit.cli import top_level_help
from project.toolkit.cli.tensorboard_runs import run_label, tensorboard_logdir_spec
from project.tools.bench import compare as compare_module
from project.tools.bench.report import speedups
from tests.support.runs import one_error_line

# --------------------------------------------------------------------------- scratch inputs

# One batch of each kind, no sanity check, no timing (its FLOP count): the runs here check what is said.
QUICK = [
    "--trainer.limit_train_batches=1",
    "--trainer.limit_val_batches=1",
    "--trainer.limit_test_batches=1",
    "--trainer.num_sanity_val_steps=0",
    "--callbacks.timing=false",
]


def checkpoint_of(tmp: Path, arch: str) -> Path:
    """A checkpoint of an ``arch`` model as the CLI writes one (hyperparameters included), untrained."""
    model = ImageClassifier(arch=arch)
    path = tmp / f"{arch}.ckpt"
    saved = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams), "epoch": 0, "global_step": 0}
    torch.save({**saved, "pytorch-lightning_version": lightning.__version__}, path)
    return path


def yaml_file(tmp: Path, text: str) -> Path:
    path = tmp / "config.yaml"
    path.write_text(text)
    return path


def list_config(tmp: Path, mp: pytest.MonkeyPatch) -> list[str]:
    return [f"--config={yaml_file(tmp, '- a' + chr(10) + '- b' + chr(10))}"]


def scalar_config(tmp: Path, mp: pytest.MonkeyPatch) -> list[str]:
    return [f"--config={yaml_file(tmp, 'resnet50')}"]


def read_only_root(tmp: Path, mp: pytest.MonkeyPatch) -> list[str]:
    """A run folder whose file system refuses writes (as a read-only mount does, also for root, whom
    permissions do not stop: so the refusal is injected where the check writes)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    mp.setattr(preflight.tempfile, "TemporaryFile", refuse)
    return [f"--trainer.default_root_dir={tmp / 'ro'}"]


def root_under_a_file(tmp: Path, mp: pytest.MonkeyPatch) -> list[str]:
    (tmp / "a_file").write_text("x")
    return [f"--trainer.default_root_dir={tmp / 'a_file' / 'runs'}"]


def port_not_a_number(tmp: Path, mp: pytest.MonkeyPatch) -> list[str]:
    mp.setenv("MASTER_PORT", "http")
    return ["--trainer.strategy=ddp", "--trainer.devices=2"]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A TCP port another process (here, this test) listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("", 0))
        server.listen()
        yield server.getsockname()[1]


class AllocatesTooMuch(Callback):
    """Asks the host for a petabyte at the first training step: an out-of-memory as the allocator reports it."""

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int) -> None:
        torch.empty(2**50, dtype=torch.uint8)


class FileSizeLimitAt(Callback):
    """From the end of step ``step`` on, no file this process writes may grow past ``limit`` bytes (a write that
    fails part-way, as on a full disk; the limit is lifted by the test's fixture)."""

    def __init__(self, step: int = 2, limit: int = 1_000_000) -> None:
        self.step, self.limit = step, limit

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        if trainer.global_step == self.step:
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.fixture
def file_size_limit_lifted() -> Iterator[None]:
    """Puts back the file size limit and SIGXFSZ's handler (ignored: a write past the limit then fails with
    EFBIG instead of killing the process) after a test that sets them."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, handler)


# --------------------------------------------------------------------------- the table

# (id, subcommand, arguments: a list or a function of (scratch folder, fixture values) giving one, the text the
# error line must hold). Each case's arguments come after tiny_args, overriding their values.
Arguments = list[str] | Callable[[Path, pytest.MonkeyPatch], list[str]]
CASES: list[tuple[str, str, Arguments, str]] = [
    (
        "image too big for memory",
        "fit",
        ["--data.image_size=100000"],
        "data.image_size=100000 cannot fit: one batch of 20 images of 3 x 100000 x 100000 pixels is 2.4 TB as float32",
    ),
    (
        "config file that is a list",
        "fit",
        list_config,
        'config.yaml: a config file must be a mapping of options (key: value), e.g. "trainer: {max_epochs: 5}"; '
        "this one holds a list: - a - b",
    ),
    (
        "config file that is one value",
        "fit",
        scalar_config,
        "config.yaml: a config file must be a mapping of options (key: value)",
    ),
    (
        "run folder on a read-only file system",
        "fit",
        read_only_root,
        "/scratch/ro: cannot write into ",
    ),
    (
        "run folder under a file",
        "fit",
        root_under_a_file,
        "/scratch/a_file/runs: cannot write into ",
    ),
    (
        "test: checkpoint of another arch than given",
        "test",
        lambda tmp, mp: [f"--ckpt_path={checkpoint_of(tmp, 'resnet18')}", "--model.arch=mobilenet_v2"],
        "resnet18.ckpt holds a model trained with model.arch=resnet18, but --model.arch=mobilenet_v2 was given; "
        "leave the option out to use the checkpoint's",
    ),
    (
        "fit: resume from a checkpoint of another arch than given",
        "fit",
        lambda tmp, mp: [f"--ckpt_path={checkpoint_of(tmp, 'resnet18')}", "--model.arch=mobilenet_v2"],
        "holds a model trained with model.arch=resnet18, but --model.arch=mobilenet_v2 was given",
    ),
    (
        "test: checkpoint of another learning rate than given",
        "test",
        lambda tmp, mp: [f"--ckpt_path={checkpoint_of(tmp, 'mobilenet_v2')}", "--model.lr=0.5"],
        "holds a model trained with model.lr=0.1, but --model.lr=0.5 was given",
    ),
    (
        "MASTER_PORT not a port",
        "fit",
        port_not_a_number,
        "MASTER_PORT=http is not a port: use a number between 1 and 65535, or unset it",
    ),
    (
        "out of host memory during a run",
        "fit",
        [f"--trainer.callbacks+={__name__}.AllocatesTooMuch", "--trainer.num_sanity_val_steps=0"],
        "out of host memory: the run tried to allocate 1125.9 TB more; lower --data.batch_size (now 20) or "
        "--data.image_size (now 32)",
    ),
]


@pytest.mark.parametrize(("subcommand", "arguments", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_probe(
    tiny_args: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    subcommand: str,
    arguments: Arguments,
    message: str,
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    args = arguments(scratch, monkeypatch) if callable(arguments) else arguments
    line = one_error_line(subcommand, [*tiny_args, *args], capsys)
    assert message in line, line
    assert not (tmp_path / "lightning_logs").exists()  # no half-made run folder


def test_probe_taken_master_port(tiny_args: list[str], capsys, monkeypatch, taken_port: int, tmp_path: Path) -> None:
    monkeypatch.setenv("MASTER_PORT", str(taken_port))
    line = one_error_line("fit", [*tiny_args, "--trainer.strategy=ddp", "--trainer.devices=2"], capsys)
    assert line == (
        f"error: MASTER_PORT={taken_port} is already in use on this machine (another run?); unset MASTER_PORT to let "
        "the run pick a free port, or set one that is free"
    )
    assert not (tmp_path / "lightning_logs").exists()  # checked before the processes are started


def test_an_unset_master_port_is_not_checked() -> None:
    preflight.check_master_port({})  # Lightning picks a free one itself
    with pytest.raises(preflight.ProjectError, match="MASTER_PORT=0 is not a port"):
        preflight.check_master_port({"MASTER_PORT": "0"})


def test_probe_full_disk_while_saving_keeps_the_previous_checkpoint(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, file_size_limit_lifted: None
) -> None:
    # 1 step an epoch: epoch 0's last.ckpt (18 MB: weights and momentum) is written whole; from step 2 on no
    # file may pass 1 MB, so epoch 1's save fails part-way
    args = [*tiny_args, *QUICK, "--trainer.max_epochs=2"]
    line = one_error_line("fit", [*args, f"--trainer.callbacks+={__name__}.FileSizeLimitAt"], capsys)
    checkpoints = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    assert line.startswith("error: could not save the checkpoint ") and f" into {checkpoints} (" in line, line
    assert "it needs about 18.0 MB, " in line and " free there; " in line and "last.ckpt is intact" in line, line
    assert [p.name for p in checkpoints.iterdir() if p.name.startswith(".")] == []  # no partial file left
    saved = torch.load(checkpoints / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 1  # epoch 0's, whole and loadable


# --------------------------------------------------------------------------- what a user reads


def test_oversubscribed_cpu_is_said_with_the_core_count(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(preflight.log, "warning", lambda msg, *args: said.append(msg % args))
    preflight.warn_cpu_oversubscription(3, "cpu", cuda_available=False, cores=2)
    preflight.warn_cpu_oversubscription("2", "auto", cuda_available=False, cores=2)  # as many as there are
    preflight.warn_cpu_oversubscription(8, "gpu", cuda_available=True, cores=2)  # GPUs: not CPU processes
    assert said == [
        "trainer.devices=3 starts 3 CPU processes on this machine's 2 CPU core(s): they share the cores. Fine to "
        "check a strategy, but its timings are not those of 3 devices; use --trainer.devices=2 or fewer to measure"
    ]


def test_test_of_a_small_image_fit_tests_at_its_size_in_its_folder(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    fit_args = [a for a in tiny_args if not a.startswith("--data.image_size")]
    main(["fit", *fit_args, *QUICK, "--data.image_size=24", "--trainer.max_epochs=1"])
    run = tmp_path / "lightning_logs" / "version_0"
    capsys.readouterr()
    bar = ["--trainer.enable_progress_bar=true"]
    tested = main(["test", *fit_args, *QUICK, *bar, f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])  # no size
    assert tested.datamodule.hparams.image_size == 24
    assert tested.trainer.log_dir == str(run)  # the fit's folder, not a new one
    out, err = capsys.readouterr()
    assert "taking the settings it was trained with: data.image_size=24" in err
    # the bar's last drawing comes before the summary, not after it
    assert "Testing" in out and out.rindex("Testing") < out.index("test done; run folder:"), out
    # given explicitly: kept, and said
    main(["test", *fit_args, *QUICK, "--data.image_size=32", f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])
    assert "was trained with data.image_size=24; running with data.image_size=32 as given" in capsys.readouterr().err


def test_arch_not_given_comes_from_the_checkpoint_and_is_said(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = checkpoint_of(tmp_path, "resnet18")
    cli = main(["test", *tiny_args, *QUICK, f"--ckpt_path={path}"])
    assert cli.model.hparams.arch == "resnet18"
    assert (
        f"--ckpt_path={path}: taking the settings it was trained with: model.arch=resnet18" in capsys.readouterr().err
    )


def test_help_says_what_predict_writes() -> None:
    text = top_level_help("project.tools")
    written = "the predicted class of every test image (name, probability, top 5), written to predictions.csv"
    assert f"predict   {written}" in text


def test_compare_without_matplotlib_writes_the_tables_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "runs" / "version_0"
    run.mkdir(parents=True)
    timing = '{"strategy": "single_device", "arch": "mobilenet_v2", "batch_size": 20, "devices": 1, '
    (run / "timing.json").write_text(timing + '"precision": "32-true", "epoch_seconds_mean": 2.0}')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    compare_module.main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])  # returns: exit status 0
    captured = capsys.readouterr()
    assert "results.png skipped: the chart needs matplotlib, which is not installed" in captured.err
    assert "results in " in captured.out and captured.out.rstrip().endswith("results.{csv,md}")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.csv", "results.md"]


def _row(cell: str, strategy: str, seconds: float | None) -> dict:
    row = {"cell": cell, "status": "ok", "bench_strategy": strategy, "arch": "m", "batch_size": 8, "precision": "32"}
    return {**row, "epoch_seconds_mean": seconds}


def test_only_a_fit_can_be_the_speedup_baseline() -> None:
    rows = [_row("fit", "single", 4.0), _row("ddp", "ddp", 2.0), _row("predict-only", "single", None)]
    assert speedups(rows) == [1.0, 2.0, None]  # the later predict-only folder does not replace the baseline
    rows = [_row("first fit", "single", 4.0), _row("second fit", "single", 8.0), _row("ddp", "ddp", 2.0)]
    assert speedups(rows)[2] == 2.0  # the first fit stays the baseline


def test_tensorboard_names_runs_by_their_setup(tmp_path: Path) -> None:
    ddp, bare = tmp_path / "version_3", tmp_path / "version_4"
    for folder in (ddp, bare):
        folder.mkdir()
        (folder / "events.out.tfevents.1").write_bytes(b"")
    timing = '{"strategy": "ddp", "arch": "resnet50", "devices": 2, "accelerator": "cpu", "batch_size": 256}'
    (ddp / "timing.json").write_text(timing)
    assert run_label(ddp) == "version_3-ddp-resnet50-2xcpu-b256"
    assert tensorboard_logdir_spec(tmp_path) == (
        f"--logdir_spec=version_3-ddp-resnet50-2xcpu-b256:{ddp},version_4:{bare}"  # no setup recorded: the folder
    )
    assert tensorboard_logdir_spec(tmp_path / "nothing") == f"--logdir={tmp_path / 'nothing'}"


@pytest.mark.parametrize(
    ("variables", "says", "installs_from"),
    [
        (["HAS_CUDA_GPU="], "note: no CUDA GPU found", None),  # a CPU machine, as CI: PyPI's torch, and one line
        (["HAS_CUDA_GPU=yes"], None, None),  # a GPU machine: PyPI's CUDA build, nothing said
        (["TORCH_INDEX=https://download.pytorch.org/whl/cpu"], None, "https://download.pytorch.org/whl/cpu"),
    ],
    ids=["no GPU", "GPU", "CPU build asked for"],
)
def test_make_fit_on_a_machine_without_a_gpu(
    tmp_path: Path, variables: list[str], says: str | None, installs_from: str | None
) -> None:
    # a dry run (-n) of a fresh install (-B) into a scratch environment: nothing is installed
    result = subprocess.run(
        ["make", "-n", "-B", "fit", f"VENV={tmp_path / 'venv'}", *variables],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    notes = [line for line in lines if "no CUDA GPU found" in line]
    assert len(notes) == (1 if says else 0)
    if says:
        assert "make fit TORCH_INDEX=https://download.pytorch.org/whl/cpu" in notes[0]
    torch_first = [line for line in lines if "--index-url" in line]
    assert torch_first == ([] if installs_from is None else [torch_first[0]])
    if installs_from:
        assert torch_first[0].endswith(f"--index-url {installs_from} torch torchvision")
    project = [line for line in lines if line.endswith("-e '.[progress,bench]'")]
    assert len(project) == 1  # the project itself, with the bar and the chart, always from the registry
    assert lines.index(project[0]) > max((lines.index(line) for line in torch_first), default=-1)

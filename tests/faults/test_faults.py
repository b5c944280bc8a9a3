"""Checkpoints never half-written, bad checkpoint files named, non-finite losses stopped."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from project.__main__ import main
from project.toolkit.callbacks import checkpoints
from project.toolkit.callbacks.checkpoints import AtomicCheckpointIO, Checkpoints, check_checkpoint_file
from project.toolkit.callbacks.guards import Guards
from project.toolkit.errors import ProjectError
from tests.conftest import quiet_trainer
from tests.support.runs import Records


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)

    def dies_half_way(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # the process is stopped in the middle of writing

    monkeypatch.setattr(checkpoints.torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    assert torch.equal(torch.load(path)["state_dict"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no partial file left either


@pytest.mark.parametrize("io", [TorchCheckpointIO(), AtomicCheckpointIO()], ids=["lightning", "template"])
def test_a_save_cut_short_across_file_systems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: object) -> None:
    """Where the system's temp folder lies on another file system than the run, Lightning's save moves its temporary
    file by copying it over last.ckpt, and a copy cut short (here a full disk) leaves last.ckpt half-written; the
    template's writes beside the file, so the rename stays on one file system and the save is whole."""
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)

    def across_file_systems(source: str, destination: str, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")  # what the kernel says: shutil.move then copies

    def disk_full_half_way(out_fd: int, *args: object) -> int:
        os.write(out_fd, b"PK\x03\x04 half a zip")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "rename", across_file_systems)
    monkeypatch.setattr(os, "sendfile", disk_full_half_way)
    try:
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    except OSError:
        pass
    monkeypatch.undo()
    if isinstance(io, AtomicCheckpointIO):
        assert torch.equal(torch.load(path)["state_dict"]["w"], torch.zeros(3))
    else:  # Lightning's: the old checkpoint is gone and the new one is half there
        with pytest.raises(RuntimeError, match="zip archive"):
            torch.load(path)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not a readable checkpoint"),  # None: a real checkpoint, truncated
        (b"hello, not a checkpoint", "not a readable checkpoint"),
        ({"weights": 1}, "a torch file, but not a Lightning checkpoint"),
    ],
)
def test_bad_checkpoint_files_are_named(tmp_path: Path, content: object, message: str) -> None:
    path = tmp_path / "some.ckpt"
    if content is None:
        torch.save({"state_dict": {"w": torch.randn(1000)}}, path)
        path.write_bytes(path.read_bytes()[:2000])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(ProjectError, match=rf"--ckpt_path={path}: {message}"):
        check_checkpoint_file(path)


def test_a_good_checkpoint_passes(tmp_path: Path) -> None:
    path = tmp_path / "good.ckpt"
    torch.save({"state_dict": {}, "epoch": 0}, path)
    check_checkpoint_file(path)
    with pytest.raises(ProjectError, match="no such file"):
        check_checkpoint_file(tmp_path / "missing.ckpt")


class LossTurnsNaN(LightningModule):
    """A linear model whose loss becomes NaN from step `bad_step` (counted from 1) on."""

    def __init__(self, bad_step: int) -> None:
        super().__init__()
        self.layer, self.bad_step = torch.nn.Linear(4, 1), bad_step

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        return loss * float("nan") if self.global_step + 1 >= self.bad_step else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_nan_run(tmp_path: Path, bad_step: int) -> Trainer:
    checkpoint = Checkpoints(dirpath=tmp_path, save_last=True, every_n_train_steps=1)
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=2,
        default_root_dir=tmp_path,
        callbacks=[Guards(lost_rank=False), checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4)  # 8 steps per epoch
    trainer.fit(LossTurnsNaN(bad_step), loader)
    return trainer


class Validated(LossTurnsNaN):
    """Logs ``val/acc`` at each validation: the metric the checkpoints monitor exists only after the first."""

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", -self.layer(batch[0]).pow(2).mean())


class LastSaved(Callback):
    """The step ``last.ckpt`` holds at each training step's end (Lightning runs the checkpoint callbacks after this
    one: the file is as the steps before left it)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.seen = folder, {}

    def on_train_batch_end(self, trainer: Trainer, *args) -> None:
        path = self.folder / "last.ckpt"
        self.seen[trainer.global_step] = torch.load(path)["global_step"] if path.is_file() else None


def test_step_checkpoints_start_before_the_first_validation(tmp_path: Path) -> None:
    """--checkpoint.every_n_train_steps bounds what a crash loses in the first epoch too (a long one most of
    all), while the monitored val/acc does not exist yet."""
    probe = LastSaved(tmp_path)
    checkpoint = Checkpoints(dirpath=tmp_path, monitor="val/acc", mode="max", save_last=True, every_n_train_steps=3)
    trainer = quiet_trainer(tmp_path, max_epochs=2, callbacks=[probe, checkpoint], enable_checkpointing=True)
    loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4)  # 8 steps an epoch
    trainer.fit(Validated(bad_step=10_000), loader, DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4))
    assert [probe.seen[step] for step in (3, 4, 6, 7)] == [None, 3, 3, 6]  # epoch 0, before its validation
    assert probe.seen[13] == 12 and torch.load(tmp_path / "last.ckpt")["global_step"] == 16
    assert Path(checkpoint.best_model_path).is_file()


def test_training_stops_at_the_first_non_finite_loss(tmp_path: Path) -> None:
    with pytest.raises(ProjectError, match=r"training loss is nan at step 11 \(epoch 1\)"):
        fit_nan_run(tmp_path, bad_step=11)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 10  # the last good step; nothing was saved from the bad one
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())


def test_finite_losses_run_to_the_end(tmp_path: Path) -> None:
    trainer = fit_nan_run(tmp_path, bad_step=10_000)
    assert trainer.global_step == 16
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_the_loss_guard_reads_losses_only_where_the_loggers_write_and_names_the_bad_step() -> None:
    guard, reads = Guards(lost_rank=False), []
    trainer = SimpleNamespace(global_step=0, current_epoch=0, log_every_n_steps=5, fast_dev_run=False)

    class Loss(torch.Tensor):  # a loss whose value read on the host is noted with the step the host had reached
        def tolist(self) -> list:
            reads.append(trainer.global_step)
            return super().tolist()

    def step(number: int, value: float) -> None:
        trainer.global_step = number
        guard.on_train_batch_end(trainer, None, {"loss": torch.tensor(value).as_subclass(Loss)}, None, number - 1)

    for number in range(1, 8):
        step(number, 1.0)
    assert reads == [5]  # all five losses read at once, at the step the loggers write
    step(8, float("nan"))  # not read yet: no step but the loggers' waits for the device
    with pytest.raises(ProjectError, match=r"training loss is nan at step 8 \(epoch 0\)"):
        step(9, 1.0)
        step(10, 1.0)
    assert reads == [5, 10]


class SignalAt(Callback):
    """Sends this process ``signum`` at the end of optimizer step ``step`` (on global rank ``rank`` only,
    if given): a preemption notice (SIGTERM), a Ctrl-C (SIGINT) or a hard kill (SIGKILL) arriving in
    the middle of an epoch."""

    def __init__(self, signum: int = signal.SIGTERM, step: int = 1, rank: int | None = None, mark: str = "") -> None:
        self.signum, self.step, self.rank, self.mark = signum, step, rank, mark

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            self.send(trainer)

    def send(self, trainer: Trainer) -> None:
        if self.rank in (None, trainer.global_rank):
            if self.mark:  # when it happened, for the test to time what follows
                Path(self.mark).write_text(str(time.time()))
            os.kill(os.getpid(), self.signum)


class SignalAtTestBatch(SignalAt):
    """Sends ``signum`` at the end of test batch ``step`` (counted from 0) on global rank ``rank``."""

    def on_test_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx: int, *loader) -> None:
        if batch_idx == self.step:
            self.send(trainer)


@pytest.fixture
def sigint_as_in_a_terminal() -> Iterator[None]:
    """Python's own Ctrl-C handler, which a process started from a terminal has, whatever started pytest
    (a background job starts with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_checkpoint_and_the_run_resumes_from_it(
    tiny_args: list[str], tmp_path: Path, signum: int, sigint_as_in_a_terminal: None
) -> None:
    args = ["fit", *tiny_args, "--trainer.max_epochs=2"]  # 8 steps per epoch
    stop = [
        f"--trainer.callbacks+={__name__}.SignalAt",
        f"--trainer.callbacks.signum={signum}",
        "--trainer.callbacks.step=11",
    ]
    said = Records()
    logging.getLogger("project.toolkit.callbacks.checkpoints").addHandler(said)  # main() resets "project"
    try:
        with pytest.raises(SystemExit) as exit_info:
            main([*args, *stop])
    finally:
        logging.getLogger("project.toolkit.callbacks.checkpoints").removeHandler(said)
    assert exit_info.value.code == 128 + signum  # what a shell reports for a process stopped by it
    # the line for a SIGTERM; a Ctrl-C has its own
    assert any("Received SIGTERM" in m for m in said.messages) == (signum == signal.SIGTERM), said.messages
    assert any(m.startswith("Ctrl-C: finishing this step") for m in said.messages) == (signum == signal.SIGINT)
    saved = torch.load(tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    assert (saved["epoch"], saved["global_step"]) == (1, 11)  # the step the signal came in, finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C handling given back

    resumed = main([*args, "--ckpt_path=last"])
    assert resumed.trainer.global_step == 16 and resumed.trainer.current_epoch == 2


def test_an_ignored_ctrl_c_stays_ignored(tiny_args: list[str], sigint_as_in_a_terminal: None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `nohup` or `cmd &` in a script start a process
    ctrl_c = [f"--trainer.callbacks+={__name__}.SignalAt", f"--trainer.callbacks.signum={signal.SIGINT}"]
    cli = main(["fit", *tiny_args, "--trainer.max_epochs=1", *ctrl_c, "--trainer.callbacks.step=3"])
    assert cli.trainer.global_step == 8  # the whole epoch: the Ctrl-C at step 3 was ignored
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def ddp_fit(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """A 2-process ddp fit on CPU (9 steps per epoch, 2 epochs) in a fresh process; and when it ended."""
    data = ["--data.synthetic=true", "--data.synthetic_size=400", "--data.val_size=40", "--data.image_size=32"]
    trainer = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.max_epochs=2"]
    command = [sys.executable, "-m", "project", "fit", *data, "--data.batch_size=40", "--data.num_workers=0", *trainer]
    result = subprocess.run(
        [*command, "--trainer.enable_progress_bar=false", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result, time.time()


def kill_rank(rank: int, mark: Path) -> list[str]:
    callback = [f"--trainer.callbacks+={__name__}.SignalAt", f"--trainer.callbacks.signum={int(signal.SIGKILL)}"]
    return [
        *callback,
        "--trainer.callbacks.step=12",
        f"--trainer.callbacks.rank={rank}",
        f"--trainer.callbacks.mark={mark}",
    ]


@pytest.mark.slow
def test_a_dead_rank_stops_the_run_is_named_and_the_run_resumes(tmp_path: Path) -> None:
    result, ended = ddp_fit(tmp_path, *kill_rank(1, tmp_path / "killed"))
    assert result.returncode == 1, result.stderr[-3000:]
    assert ended - float((tmp_path / "killed").read_text()) < 60
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    checkpoints = Path("lightning_logs") / "version_0" / "checkpoints"  # as shown: relative to the run's cwd
    assert errors == [
        f"error: rank 1 of 2 died (killed by SIGKILL); stopping rank 0 too. Saved: {checkpoints / 'last.ckpt'} "
        "(step 9); resume with the same command and --ckpt_path=last"
    ]
    assert "Traceback" not in result.stderr
    assert torch.load(tmp_path / checkpoints / "last.ckpt", weights_only=False)["global_step"] == 9  # epoch 0's

    resumed, _ = ddp_fit(tmp_path, "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # a whole ddp run says nothing the user cannot act on: no warning from the template's own logging,
    # gathering or model summary (Lightning's own notices, e.g. "GPU available", remain)
    for noise in ("sync_dist=True", "all_gather is deprecated", "already configured with model summary"):
        assert noise not in resumed.stderr, noise
    final = torch.load(tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "last.ckpt", weights_only=False)
    assert (final["epoch"], final["global_step"]) == (1, 18)


@pytest.mark.slow
def test_a_dead_rank_stops_a_test_run_too(tmp_path: Path) -> None:
    """Not only fit: under ddp a test whose rank dies ends the other in seconds with one line (before: a gloo
    traceback where the peer's socket closed, a wait where its machine went silent)."""
    data = ["--data.synthetic=true", "--data.synthetic_size=400", "--data.val_size=40", "--data.image_size=32"]
    common = [*data, "--data.batch_size=20", "--data.num_workers=0", "--trainer.accelerator=cpu"]
    common += ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]
    main(["fit", *common, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2"])
    kill = [f"--trainer.callbacks+={__name__}.SignalAtTestBatch", f"--trainer.callbacks.signum={int(signal.SIGKILL)}"]
    kill += ["--trainer.callbacks.step=1", "--trainer.callbacks.rank=1", f"--trainer.callbacks.mark={tmp_path / 'k'}"]
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--ckpt_path=last", "--trainer.limit_test_batches=4"]
    result = subprocess.run(
        [sys.executable, "-m", "project", "test", *common, *ddp, *kill],
        capture_output=True,
        text=True,
        timeout=300,
    )
    ended = time.time()
    assert result.returncode == 1, result.stderr[-3000:]
    assert ended - float((tmp_path / "k").read_text()) < 60
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: rank 1 of 2 died (killed by SIGKILL); stopping rank 0 too. "
        "Nothing to resume: run the same command again"
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_when_rank_zero_dies_the_rank_it_started_stops_and_says_so(tmp_path: Path) -> None:
    result, ended = ddp_fit(tmp_path, *kill_rank(0, tmp_path / "killed"))  # returns when rank 1 is gone too
    assert result.returncode == -signal.SIGKILL
    assert ended - float((tmp_path / "killed").read_text()) < 60
    assert "error: rank 0 of 2, which started this process, died; stopping rank 1 too" in result.stderr


@pytest.mark.slow
def test_kill_9_mid_epoch_then_resume_ends_with_the_weights_of_an_unbroken_run(tiny_args: list[str], tmp_path: Path):
    # 8 steps per epoch; a checkpoint every 3 steps; the kill comes at step 11, so the run resumes
    # from step 9, in the middle of epoch 1. Worker processes on one side, none on the other: the
    # result must not depend on them.
    common = ["--trainer.max_epochs=2", "--trainer.deterministic=true", "--checkpoint.every_n_train_steps=3"]
    main(["fit", *tiny_args, *common, f"--trainer.default_root_dir={tmp_path / 'unbroken'}"])

    broken = [*tiny_args, *common, "--data.num_workers=2", f"--trainer.default_root_dir={tmp_path / 'broken'}"]
    kill = [f"--trainer.callbacks+={__name__}.SignalAt", f"--trainer.callbacks.signum={int(signal.SIGKILL)}"]
    result = subprocess.run(
        [sys.executable, "-m", "project", "fit", *broken, *kill, "--trainer.callbacks.step=11"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    last = tmp_path / "broken" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 9

    main(["fit", *broken, "--ckpt_path=last"])
    runs = [
        tmp_path / name / "lightning_logs" / version
        for name, version in (("unbroken", "version_0"), ("broken", "version_1"))
    ]
    expected, resumed = (torch.load(run / "checkpoints" / "last.ckpt", weights_only=False) for run in runs)
    assert resumed["global_step"] == expected["global_step"] == 16
    for name, tensor in expected["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=0, atol=0, msg=name)

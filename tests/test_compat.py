"""The private Lightning names the template relies on (project/toolkit/compat.py) still exist and mean what
they meant, and importing the package stays cheap and registers nothing."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.strategies import FSDPStrategy

from project.toolkit import compat


def test_every_private_name_exists_in_the_installed_lightning() -> None:
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    # loggers_write_this_step: a bool property of the logger connector
    assert isinstance(trainer._logger_connector.should_update_logs, bool)
    assert compat.loggers_write_this_step(trainer) is trainer._logger_connector.should_update_logs
    fast = Trainer(accelerator="cpu", logger=False, fast_dev_run=True, enable_progress_bar=False)
    assert compat.loggers_write_this_step(fast) is True  # fast_dev_run logs every step
    # restart_training_batches: the fit loop keeps its data fetcher under this name (None before fit)
    assert "_data_fetcher" in vars(trainer.fit_loop)
    compat.restart_training_batches(trainer)
    # last_global_step_saved: ModelCheckpoint's record of its latest save
    assert isinstance(compat.last_global_step_saved(ModelCheckpoint()), int)
    # release_fsdp_name: the list of names Lightning ties to its FSDPStrategy
    assert isinstance(FSDPStrategy._registered_strategies, list)
    assert "fsdp_cpu_offload" in FSDPStrategy._registered_strategies
    # is_subprocess_script_launcher: the launcher of `--trainer.devices=N` runs, which holds `procs`
    ddp = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert compat.is_subprocess_script_launcher(ddp.strategy.launcher)
    assert hasattr(ddp.strategy.launcher, "procs")
    assert not compat.is_subprocess_script_launcher(trainer.strategy.launcher)
    assert isinstance(compat.xla_available(), bool)
    # advance_rich_bar: RichProgressBar's method that sets a task's count
    assert list(inspect.signature(RichProgressBar._update).parameters)[:3] == ["self", "progress_bar_id", "current"]
    # format_model_summary: Lightning's summary table from its totals and columns
    table = compat.format_model_summary(10, 8, 0.5, {"train": 3, "eval": 1}, 0, ("Name", ["net"]), ("Params", ["10"]))
    assert table.splitlines()[0].split() == ["Name", "|", "Params"] and table.endswith("Total Flops")


def test_the_logging_names_exist_in_the_installed_lightning(tmp_path: Path) -> None:
    # lightning_log_step: the fit loop's count of batches that stepped, the step of self.log values
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    assert compat.lightning_log_step(trainer) == trainer.fit_loop.epoch_loop._batches_that_stepped == 0
    # drop_placeholder_hp_metric: the TensorBoardLogger flag behind its placeholder hp_metric=-1
    logger = TensorBoardLogger(tmp_path)
    assert logger._default_hp_metric is True
    compat.drop_placeholder_hp_metric(logger)
    assert logger._default_hp_metric is False
    compat.drop_placeholder_hp_metric(CSVLogger(tmp_path))  # other loggers: nothing to do


def test_the_cli_methods_the_template_overrides_exist_with_their_signatures() -> None:
    for name in compat.CLI_OVERRIDES:
        assert name in vars(LightningCLI), name
    assert list(inspect.signature(LightningCLI._run_subcommand).parameters) == ["self", "subcommand"]


def test_importing_the_package_is_cheap_and_registers_nothing() -> None:
    code = (
        "import sys, project, project.toolkit.errors, project.toolkit.measure\n"
        "print(sorted(m for m in ('torch', 'lightning', 'torchvision') if m in sys.modules))\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "print('dp' in StrategyRegistry.available_strategies())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"  # nothing heavy until a leaf module that needs it is imported
    assert out[1] == "False"  # the CLI registers the strategies when it starts, not the import


def test_registration_happens_where_the_cli_starts() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    from project.toolkit.cli import _register_once

    _register_once()
    assert {"dp", "dp_balanced", "fsdp", "single_xla"} <= set(StrategyRegistry.available_strategies())

"""The private names the template relies on (project/toolkit/compat.py) still exist and mean what they meant;
none is used anywhere else; importing the package stays cheap and registers nothing; a run loads the strategy it names
only."""

from __future__ import annotations

import ast
import atexit
import re
import subprocess
import sys
import threading
from pathlib import Path

from lightning.pytorch import Trainer

from project.toolkit import compat
from tests.support.fixtures import TINY_RUN

PACKAGE = Path(__file__).resolve().parents[2] / "project"
MOST_PRIVATE_NAMES = 8
DOCUMENTED = {"_exit"}  # os._exit: public, despite its name


def test_every_private_name_exists_in_the_installed_libraries() -> None:
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    # restart_training_batches: the fit loop keeps its data fetcher under this name (None before fit)
    assert "_data_fetcher" in vars(trainer.fit_loop)
    compat.restart_training_batches(trainer)
    # shard_over_every_process: ModelParallelStrategy's data-parallel size, "auto" until set up
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(tensor_parallel_size=1)
    assert strategy._data_parallel_size == "auto"
    strategy.parallel_devices, strategy.num_nodes = [None, None], 1
    compat.shard_over_every_process(strategy)
    assert strategy._data_parallel_size == 2
    # shut_down_threads, run_exit_handlers: Python's own first steps of its shutdown
    assert callable(threading._shutdown) and callable(atexit._run_exitfuncs)


def test_a_sharded_checkpoints_metadata_names_only_what_compat_allows(tmp_path: Path) -> None:
    """SHARDED_METADATA_GLOBALS: torch.distributed.checkpoint's private names in a real ``.metadata`` still read."""
    import torch
    import torch.distributed.checkpoint as dcp

    from project.toolkit.safe_load import ShardedMetadataUnpickler

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    dcp.save({"state_dict": net.state_dict(), "optimizer_0": optimizer.state_dict()}, checkpoint_id=tmp_path)
    with open(tmp_path / ".metadata", "rb") as file:
        metadata = ShardedMetadataUnpickler(file).load()
    assert "state_dict.0.weight" in metadata.state_dict_metadata


def private_names(path: Path) -> set[str]:
    """The ``x._name`` attributes and ``from lib import _name`` imports in ``path``'s code (not its strings)."""
    tree = ast.parse(path.read_text())
    found = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr.startswith("_")}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("project"):
            found |= {alias.name for alias in node.names if alias.name.startswith("_")}
    return {name for name in found if re.fullmatch(r"_[A-Za-z]\w*", name) and not name.startswith("__")}


def test_private_names_live_in_compat_only_and_are_few() -> None:
    outside = {
        str(path.relative_to(PACKAGE)): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "compat.py" and (names := private_names(path) - own_private_names(path) - DOCUMENTED)
    }
    assert outside == {}
    assert len(private_names(PACKAGE / "toolkit" / "compat.py")) <= MOST_PRIVATE_NAMES


def own_private_names(path: Path) -> set[str]:
    """The module's own private names: its functions, classes and names, and the attributes its classes declare
    or set in their ``__init__`` (a private attribute of a library's class set elsewhere is not the module's)."""
    tree = ast.parse(path.read_text())
    own = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            own |= {
                n.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
            }
    return own


def test_the_private_name_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from lightning.pytorch.overrides.distributed import _IndexBatchSamplerWrapper\nx = trainer._logger\n"
    )
    assert private_names(bad) - own_private_names(bad) == {"_IndexBatchSamplerWrapper", "_logger"}


def test_importing_the_package_is_cheap_and_registers_nothing() -> None:
    code = (
        "import sys, project, project.toolkit.errors, project.toolkit.timing, project.toolkit.cli\n"
        "print(sorted(m for m in ('torch', 'lightning', 'torchvision') if m in sys.modules))\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "print('dp' in StrategyRegistry.available_strategies())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"  # nothing heavy until a leaf module that needs it is imported
    assert out[1] == "False"  # the CLI registers a strategy a run names, not the import


def test_a_run_loads_only_the_strategy_it_names(tmp_path: Path) -> None:
    """A run on one CPU imports none of the template's strategy modules (nor the pipeline's bubble meter, nor a GPU's
    peaks); a run that names one imports and registers it, in whichever process parses the command line."""
    run = [*TINY_RUN, "--trainer.devices=1", "--trainer.max_epochs=1", "--trainer.limit_train_batches=1"]
    code = (
        "import sys\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "from project.__main__ import main\n"
        "def show():\n"
        "    mine = ('project.toolkit.strategies.', 'project.toolkit.timing.bubble', 'project.toolkit.timing.peaks')\n"
        "    loaded = sorted(m for m in sys.modules if m.startswith(mine))\n"
        "    print('loaded:', loaded, 'dp' in StrategyRegistry.available_strategies())\n"
        f"main(['fit', *{run!r}, '--trainer.default_root_dir={tmp_path / 'auto'}'])\n"
        "show()\n"
        f"main(['fit', *{run!r}, '--trainer.default_root_dir={tmp_path / 'dp'}', '--trainer.strategy=dp'])\n"
        "show()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    default, with_dp = [line[len("loaded: ") :] for line in done.stdout.splitlines() if line.startswith("loaded:")]
    assert default == "['project.toolkit.strategies.deepspeed', 'project.toolkit.strategies.registry'] False"
    dp = ["contract", "deepspeed", "dp", "registry"]
    assert with_dp == f"{[f'project.toolkit.strategies.{name}' for name in dp]} True"

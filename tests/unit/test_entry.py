"""``python -m project``: the commands, their help, and the hints for a mistyped command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from lightning.pytorch.cli import LightningCLI

from project.__main__ import main
from project.toolkit.cli import TRAINER_COMMANDS
from project.tools import COMMANDS as TOOL_COMMANDS


def test_the_trainer_commands_are_lightnings() -> None:
    assert list(TRAINER_COMMANDS) == list(LightningCLI.subcommands())


def test_top_level_help_lists_every_command_without_importing_torch() -> None:
    code = "import sys\nfrom project.__main__ import main\n"
    code += "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
    code += "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("usage: python -m project")
    for command in [*TRAINER_COMMANDS, *TOOL_COMMANDS]:
        assert f"\n  {command} " in out
    assert out.rstrip().endswith("[]")  # neither torch nor Lightning was imported


def test_bench_help_lists_the_presets(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert out.startswith("usage: python -m project bench")
    assert "Presets: cpu-learn, cpu-smoke, gpu1, seed." in " ".join(out.split())


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["fitt"],
            "error: 'fitt' is not a command; did you mean 'fit'? "
            "Commands: fit, validate, test, predict, bench, compare, plan, export, search",
        ),
        (["bench", "--out"], "error: argument --out: expected one argument (see python -m project bench --help)"),
        (["export", "--out"], "error: argument --out: expected one argument (see python -m project export --help)"),
        (
            ["fit", "--data.batchsize=64"],
            "error: unrecognized arguments: --data.batchsize=64; did you mean --data.batch_size? "
            "(see python -m project fit --help)",
        ),
    ],
)
def test_a_mistyped_command_line_gets_one_line_with_the_nearest_name(
    capsys: pytest.CaptureFixture, args: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == line


def test_fit_help_names_the_program_and_the_templates_strategies(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # help text is wrapped at the terminal's width
    assert out.startswith("usage: python -m project [options] fit")
    names = "auto, single_device, dp, dp_balanced, ddp, ddp_static, fsdp,"
    assert f"The template's names for --trainer.strategy: {names}" in out
    assert "--trainer.accelerator: auto, cpu, gpu, tpu, xla_cpu" in out

"""Examples of small helpers of the command line, the bench and the toolkit's top-level modules: the texts
jsonargparse refuses with and the one lines made of them, the bench matrix's rules, dotted paths."""

from __future__ import annotations

import pytest
import torch

from project.toolkit.cli import unknown_command
from project.toolkit.cli.checkpoint_settings import command_line_keys
from project.toolkit.cli.messages import (
    class_path_error_line,
    config_shape_error,
    init_parameters,
    one_line,
    parse_error_line,
    project_error_within,
    unwrap_class_option_error,
    with_option_hints,
)
from project.toolkit.cli.run_dirs import setting
from project.toolkit.dotted import chosen_class, import_object, section_args
from project.toolkit.errors import ProjectError
from project.toolkit.host_memory import host_allocator
from project.toolkit.training import SampleMean, WarmupCosine
from project.tools.bench.chart import label
from project.tools.bench.config import BenchConfig, _is_variants, strategy_options

# jsonargparse's refusal of --data=x.Y (a class path naming no module) and of --data.size=big
NO_SUCH_CLASS = (
    "Parser key \"data\":\n  Subtypes: [<class 'a.Base'>]\n  Errors:\n    - Problem with given "
    "class_path 'x.Y':\n        No module named 'x'\n    - Expected None\n  Given value: x.Y"
)
WRONG_OPTION_TYPE = (
    "Parser key \"data\":\n  Subtypes: [<class 'a.Base'>]\n  Errors:\n"
    "    - Problem with given class_path 'a.Mine':\n        Parser key \"size\":\n"
    "          Expected a <class 'int'>. Got value: big\n  Given value: NestedArg(key='size', val='big')"
)
UNION_REFUSAL = (
    'Parser key "trainer.max_epochs":\n  Does not validate against any of the Union subtypes\n'
    "  Subtypes: [<class 'int'>, <class 'NoneType'>]\n  Errors:\n    - Expected a <class 'int'>\n"
    "    - Expected a <class 'NoneType'>\n  Given value type: <class 'str'>\n  Given value: abc"
)


def test_unknown_options_get_the_nearest_known_one() -> None:
    message = "unrecognized arguments: --data.batchsize=64"
    assert with_option_hints(message, ["--data.batch_size", "--data.data_dir"]) == (
        "unrecognized arguments: --data.batchsize=64; did you mean --data.batch_size?"
    )
    assert with_option_hints("Subcommand 'fit' does not accept option 'model.lrr'", ["--model.lr"]) == (
        "Subcommand 'fit' does not accept option 'model.lrr'; did you mean --model.lr?"
    )


def test_a_config_that_is_no_mapping() -> None:
    assert config_shape_error("Unexpected config: - a", ["fit", "--config=missing.yaml"]) == (
        'a config file must be a mapping of options (key: value), e.g. "trainer: {max_epochs: 5}"; found: - a'
    )


def test_a_refused_option_of_a_chosen_class_is_reported_as_that_option() -> None:
    assert unwrap_class_option_error(WRONG_OPTION_TYPE) == (
        "Parser key \"data.size\":\n          Expected a <class 'int'>. Got value: big"
    )


def test_a_class_path_naming_no_module() -> None:
    assert class_path_error_line(NO_SUCH_CLASS) == (
        "data=x.Y is not allowed: it must name a Base subclass as package.module.Class (No module named 'x')"
    )


def test_the_project_error_a_class_raised_while_built_is_found() -> None:
    try:
        try:
            raise ProjectError("data.image_size=0 is not allowed")
        except ProjectError:
            raise ValueError("Does not validate against any of the Union subtypes ...")  # noqa: B904
    except ValueError as err:
        assert str(project_error_within(err)) == "data.image_size=0 is not allowed"


def test_init_parameters_include_the_bases() -> None:
    assert init_parameters(type("Wider", (torch.nn.Linear,), {}))[:3] == ["in_features", "out_features", "bias"]


def test_one_line_and_values_of_the_wrong_type() -> None:
    assert one_line("first\n  second") == "first second"
    assert parse_error_line("Parser key \"data.image_size\":\n  Expected a <class 'int'>. Got value: abc") == (
        "data.image_size=abc is not allowed; expected int"
    )
    assert parse_error_line(UNION_REFUSAL) == "trainer.max_epochs=abc is not allowed; expected int or null"


def test_strategy_options() -> None:
    assert (strategy_options("single"), strategy_options("ddp")) == (
        ["--trainer.strategy=auto"],
        ["--trainer.strategy=ddp"],
    )
    assert strategy_options("pipeline-mb8")[1] == "--trainer.strategy.init_args.micro_batches=8"


def test_variants_and_their_names() -> None:
    assert BenchConfig(["single"], ["a"], [8], variants={"x": ["--y"]}).variant_names() == [""]
    assert BenchConfig(["single"], ["a"], [8], variants={"x": [], "z": []}).variant_names() == ["x", "z"]
    assert (_is_variants({"loader": [], "on_device": ["--data.on_device=true"]}), _is_variants({"a b": []})) == (
        True,
        False,
    )
    assert (_is_variants({"x": "--y"}), _is_variants({}), _is_variants(["x"])) == (False, False, False)


def test_chart_labels() -> None:
    assert label({"bench_strategy": "ddp", "devices": 2, "batch_size": 32, "precision": "32-true"}) == (
        "ddp x2\nb32 32-true"
    )
    row = {"bench_strategy": "ddp", "devices": 2, "batch_size": 32, "precision": "bf16-mixed", "variant": "on_device"}
    assert label({**row, "train_tflops_per_second": 51.234, "mfu": 0.2571}) == (
        "ddp x2 on_device\nb32 bf16-mixed\n51.2 TFLOP/s, MFU 25.7 %"
    )


def test_dotted_paths_and_config_sections() -> None:
    assert import_object("torch.nn.Linear").__name__ == "Linear"
    assert (chosen_class({"class_path": "torch.nn.Linear", "init_args": {}}).__name__, chosen_class({"lr": 0.1})) == (
        "Linear",
        None,
    )
    assert (section_args({"class_path": "x.Y", "init_args": {"lr": 0.1}}), section_args({"lr": 0.2})) == (
        {"lr": 0.1},
        {"lr": 0.2},
    )
    with pytest.raises(ProjectError, match="cannot be imported"):
        import_object("no.such.Thing")


def test_host_allocator_says_what_it_is() -> None:
    allocator = host_allocator()
    assert allocator in ("defaults of glibc", "defaults of the C library") or allocator.startswith("glibc,")


def test_warmup_cosine_and_sample_mean() -> None:
    factor = WarmupCosine(warmup_steps=10, total_steps=110)
    assert [round(factor(step), 3) for step in (0, 9, 10, 60, 110)] == [0.1, 1.0, 1.0, 0.5, 0.0]
    mean = SampleMean()
    mean.update(torch.tensor([1.0, 2.0]))
    mean.update(torch.tensor([6.0]))
    assert mean.compute().item() == 3.0


def test_a_mistyped_command_gets_the_nearest() -> None:
    assert unknown_command("fitt", "project.tools") == (
        "'fitt' is not a command; did you mean 'fit'? "
        "Commands: fit, validate, test, predict, bench, compare, plan, export, search"
    )


def test_the_keys_a_command_line_sets() -> None:
    argv = ["fit", "--model.arch=resnet50", "--model.init_args.lr", "0.1", "--data.x"]
    assert sorted(command_line_keys(argv, "model")) == ["arch", "lr"]


def test_a_setting_is_found_inside_init_args() -> None:
    assert setting({"data": {"class_path": "x.Y", "init_args": {"image_size": 32}}}, "data.image_size") == 32
    assert (setting({"trainer": {"devices": 2}}, "trainer.devices"), setting({}, "trainer.devices")) == (2, None)

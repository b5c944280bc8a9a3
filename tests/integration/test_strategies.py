"""The strategies on one process: dp and dp_balanced against a single device, the names Lightning
resolves, the evaluation sampler every multi-process run relies on, and FSDP's sharding plan.
The runs with several processes are in test_strategy_runs.py; XLA in test_strategy_xla.py.

``Recorder`` is used by those files too, also inside the processes the runs start."""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from project.__main__ import main
from project.data import EvenBatchSampler
from project.model import ImageClassifier
from project.toolkit.blocks import module_blocks
from project.toolkit.errors import DataError, ProjectError
from project.toolkit.strategies.dp import DataParallelStrategy, NetWithLoss
from project.toolkit.strategies.fsdp import FullyShardedStrategy, evaluate_under_no_grad, shard_network
from project.toolkit.strategies.registry import register_strategies
from tests.conftest import quiet_trainer
from tests.support.runs import free_port_below_ephemeral_range

REPO = Path(__file__).resolve().parents[2]


def local_numel(tensor: torch.Tensor) -> int:
    """Elements this process holds: its shard of a sharded (DTensor) tensor, else all of it."""
    return tensor.to_local().numel() if isinstance(tensor, DTensor) else tensor.numel()


def writes_on(module: LightningModule, own_net: Any) -> list[str]:
    """What a strategy wrote on the user's module object: instance attributes that shadow its class's
    methods (``training_loss``, ``forward``), and ``net`` if it is no longer the module's own network."""
    shadowed = sorted(name for name in vars(module) if callable(getattr(type(module), name, None)))
    return shadowed + ([] if module.net is own_net else ["net"])


class Recorder(Callback):
    """Writes what one process of a run saw to ``<out>/rank<R>-<stage>.json``: the strategy and device,
    the training order of every epoch, batch sizes, losses, how many parameters, gradients and
    optimizer-state elements it held, how many evaluation batches it ran, and the final metrics;
    also, at every training and validation batch, what the strategy wrote on the module (``writes_on``),
    and which network the steps called (the strategy's view's, where it runs the steps through one).
    With ``save_weights`` it also saves its final weights to ``<out>/rank<R>-weights.pt``. ``own_net`` keeps
    the module's network as it was at ``setup``, before the strategy set up."""

    def __init__(self, out: str = "records", save_weights: bool = False) -> None:
        self.out, self.save_weights = Path(out), save_weights
        self.record: dict[str, Any] = defaultdict(list)
        self.own_net: Any = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.record.update(strategy=type(trainer.strategy).__name__, world_size=trainer.world_size)
        self.own_net = pl_module.net

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        view = getattr(trainer.strategy, "module_view", None)
        net = (pl_module if view is None else view).net
        self.record.update(
            start={"epoch": trainer.current_epoch, "global_step": trainer.global_step},
            device=str(pl_module.device),
            net=[type(net).__name__, type(getattr(net, "module", net)).__name__],
        )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record["epochs"].append(trainer.current_epoch)
        self.record["train_order"].append(list(trainer.train_dataloader.sampler))

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.record["batch_sizes"].append(len(batch[0]))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.record["losses"].append(outputs["loss"].item())
        self.record["module_writes"].append(writes_on(pl_module, self.own_net))

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        # After backward: under fsdp every unit is resharded now (the root unit keeps its parameters
        # gathered between an evaluation forward and the next backward).
        parameters = list(pl_module.parameters())
        self.record["params"] = {
            "local": sum(local_numel(p) for p in parameters),
            "total": sum(p.numel() for p in parameters),
        }
        self.record["grads"] = sum(local_numel(p.grad) for p in parameters if p.grad is not None)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        states = trainer.optimizers[0].state.values()
        self.record["optimizer_state"] = sum(local_numel(s["momentum_buffer"]) for s in states)

    def on_validation_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self.record["val_batches"].append(trainer.current_epoch)

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.record["module_writes"].append(writes_on(pl_module, self.own_net))

    def on_test_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self.record["test_batches"].append(0)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.save_weights:
            self.out.mkdir(parents=True, exist_ok=True)
            weights = {k: v.detach().cpu() for k, v in pl_module.state_dict().items()}
            torch.save(weights, self.out / f"rank{trainer.global_rank}-weights.pt")

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.record["metrics"] = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.out.mkdir(parents=True, exist_ok=True)
        name = f"rank{trainer.global_rank}-{TrainerFn(stage).value}.json"  # stage is an enum member
        (self.out / name).write_text(json.dumps(self.record))
        self.record = defaultdict(list)


class StopAfterFirstEpoch(Callback):
    """Ends a run after its first epoch, as a machine going down would: the learning-rate schedule is
    still the one planned for all of ``max_epochs``, so resuming it must give the unbroken run."""

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        trainer.should_stop = True


def recorded(out: Path, stage: str, rank: int = 0) -> dict[str, Any]:
    return json.loads((out / f"rank{rank}-{stage}.json").read_text())


def recorder_args(out: Path) -> list[str]:
    return [f"--trainer.callbacks+={__name__}.Recorder", f"--trainer.callbacks.out={out}"]


def last_checkpoint(root: Path, version: int = 0) -> dict[str, Any]:
    return torch.load(root / f"lightning_logs/version_{version}/checkpoints/last.ckpt", weights_only=False)


# As a Python user of the strategies does; the command line registers the one a command names.
register_strategies()

# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name, cls, options",
    [
        ("dp", DataParallelStrategy, {"loss_in_replicas": False}),
        ("dp_balanced", DataParallelStrategy, {"loss_in_replicas": True}),
        ("fsdp", FullyShardedStrategy, {}),
    ],
)
def test_strategy_names_reach_the_template_strategies_on_cpu(name: str, cls: type, options: dict) -> None:
    # By instance: Lightning refuses the name `fsdp` off CUDA (its own FSDP1's); the CLI passes an instance too.
    trainer = Trainer(
        strategy=StrategyRegistry.get(name), accelerator="cpu", devices=2 if name == "fsdp" else 1, logger=False
    )
    assert type(trainer.strategy) is cls
    assert {k: getattr(trainer.strategy, k) for k in options} == options


def test_fsdp_strategy_shards_over_every_process_without_tensor_parallelism() -> None:
    strategy = Trainer(strategy=StrategyRegistry.get("fsdp"), accelerator="cpu", devices=2, logger=False).strategy
    assert strategy._tensor_parallel_size == 1
    assert strategy._save_distributed_checkpoint is False  # one file a single device can read


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed here")
def test_xla_cpu_without_torch_xla_says_how_to_install_it(
    tiny_args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")  # what the accelerator would set; undone after the test
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args, "--trainer.accelerator=xla_cpu", "--trainer.strategy=single_xla"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --trainer.accelerator=xla_cpu needs torch_xla, which pins its own torch: install the project into "
        "a separate environment with `pip install -e '.[xla]'` (`make test-xla` builds one in .venv-xla)"
    )


# --------------------------------------------------------------------------- dp on one process


def test_dp_runs_single_device_losses_and_wraps_only_the_network_in_a_view_not_on_the_module(
    tiny_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    common = [*tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=4", "--trainer.deterministic=true"]
    runs = {}
    for strategy in ("auto", "dp", "dp_balanced"):
        out = tmp_path / strategy
        capsys.readouterr()
        run_args = [
            f"--trainer.strategy={strategy}",
            f"--trainer.default_root_dir={out}",
            *recorder_args(out / "records"),
        ]
        cli = main(["fit", *common, *run_args])
        runs[strategy] = recorded(out / "records", "fit")
        runs[strategy]["stderr"] = capsys.readouterr().err
        runs[strategy]["net_after"] = type(cli.model.net).__name__
        recorder = next(c for c in cli.trainer.callbacks if isinstance(c, Recorder))
        runs[strategy]["writes_after"] = writes_on(cli.model, recorder.own_net)  # the net it had before the run
        runs[strategy]["keys"] = sorted(last_checkpoint(out)["state_dict"])

    single = runs["auto"]
    assert len(single["losses"]) == 4
    for strategy in ("dp", "dp_balanced"):
        run = runs[strategy]
        torch.testing.assert_close(run["losses"], single["losses"], rtol=0, atol=1e-6)
        warnings = [line for line in run["stderr"].splitlines() if "DataParallel needs 2 or more" in line]
        assert warnings == [
            f"{strategy}: 0 GPU(s) in this run; DataParallel needs 2 or more to split a batch, so this runs as a "
            "single-device run on cpu"
        ]
        assert run["keys"] == single["keys"]  # checkpoints interchangeable with every other strategy
        assert run["net_after"] == "MobileNetV2" and run["writes_after"] == []
        # nothing written on the module while it ran either: the steps ran through the strategy's view
        assert len(run["module_writes"]) > 4 and all(writes == [] for writes in run["module_writes"])
    # while training: DataParallel around the network alone (dp), or around the network and the loss
    assert runs["dp"]["net"] == ["DataParallel", "MobileNetV2"]
    assert runs["dp_balanced"]["net"] == ["DataParallel", "NetWithLoss"]
    assert single["net"] == ["MobileNetV2", "MobileNetV2"]
    assert "DataParallel needs" not in single["stderr"]


def test_dp_balanced_replica_holds_the_network_and_the_loss() -> None:
    model = ImageClassifier(num_classes=10)
    replica = NetWithLoss(model.net, model.criterion)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    model.eval()
    loss_sum, predictions = replica(images, labels)
    logits = model.net(images)
    torch.testing.assert_close(loss_sum, model.criterion(logits, labels).reshape(1) * 4)
    assert torch.equal(predictions, logits.argmax(1)) and torch.equal(replica(images), logits)


def test_dp_refuses_a_batch_that_does_not_split_across_the_gpus() -> None:
    strategy = DataParallelStrategy()
    strategy.parallel_devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    batch = (torch.zeros(5, 3, 32, 32), torch.zeros(5, dtype=torch.long))
    # the check comes first, so no GPU is touched
    with pytest.raises(ProjectError, match="data.batch_size=5 does not split evenly across the 2 GPUs of dp"):
        strategy.training_step(batch, 0)


def test_resumed_single_device_and_dp_runs_end_with_the_weights_of_unbroken_ones(
    tiny_args: list[str], tmp_path: Path
) -> None:
    common = [*tiny_args, "--trainer.limit_train_batches=3", "--trainer.deterministic=true"]
    for strategy in ("auto", "dp", "dp_balanced"):
        unbroken, broken = tmp_path / strategy / "unbroken", tmp_path / strategy / "broken"
        strategy_args = [*common, f"--trainer.strategy={strategy}"]
        main(["fit", *strategy_args, "--trainer.max_epochs=2", f"--trainer.default_root_dir={unbroken}"])
        stop = f"--trainer.callbacks+={__name__}.StopAfterFirstEpoch"
        main(["fit", *strategy_args, "--trainer.max_epochs=2", f"--trainer.default_root_dir={broken}", stop])
        resumed = [*strategy_args, f"--trainer.default_root_dir={broken}", *recorder_args(broken / "records")]
        main(["fit", *resumed, "--trainer.max_epochs=2", "--ckpt_path=last"])
        assert recorded(broken / "records", "fit")["epochs"] == [1]
        expected = last_checkpoint(unbroken)["state_dict"]
        actual = last_checkpoint(broken, version=1)["state_dict"]
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0, msg=f"{strategy}: {name}")


# --------------------------------------------------------------------------- evaluation sampler


@pytest.mark.parametrize(
    "size, world, batch_size", [(41, 2, 10), (40, 2, 10), (60, 2, 10), (5, 2, 2), (7, 3, 2), (10001, 2, 128)]
)
def test_evaluation_batches_cover_every_image_once_in_as_many_batches_per_rank(
    size: int, world: int, batch_size: int
) -> None:
    ranks = [EvenBatchSampler(range(size), batch_size, num_replicas=world, rank=rank) for rank in range(world)]
    assert len({len(list(sampler)) for sampler in ranks}) == 1  # the same number of forward passes
    seen = [i for sampler in ranks for batch in sampler for i in batch]
    assert sorted(seen) == list(range(size))  # each image exactly once
    assert all(0 < len(batch) <= batch_size for sampler in ranks for batch in sampler)


def test_evaluation_batches_that_cannot_be_evened_out_are_refused() -> None:
    with pytest.raises(DataError, match="3 evaluation images cannot give each of the 2 processes"):
        EvenBatchSampler(range(3), 1, num_replicas=2, rank=1)


def test_data_module_gives_every_rank_as_many_evaluation_batches(cifar_root: Path) -> None:
    from tests.support.data_modules import attach, make_dm

    loaders = []
    for rank in (0, 1):
        dm = attach(make_dm(cifar_root, val_size=41, batch_size=20), world_size=2, rank=rank)
        dm.setup("fit")
        loaders.append(list(dm.val_dataloader()))
    assert [len(batches) for batches in loaders] == [3, 3]
    assert [len(labels) for batches in loaders for _, labels in batches] == [10, 10, 1, 10, 9, 1]
    images, labels = loaders[1][0]
    assert images.shape == (10, 3, 32, 32) and labels.dtype == torch.int64


# --------------------------------------------------------------------------- fsdp's sharding plan


@pytest.fixture
def one_process_group() -> Any:
    """A process group of one (gloo), for FSDP calls in this process; destroyed afterwards."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port_below_ephemeral_range()}", rank=0, world_size=1
    )
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "arch, units",
    [
        ("mobilenet_v2", [*(f"features.{i}" for i in range(19)), "classifier"]),
        ("resnet50", ["stem", *(f"layer{i}.{j}" for i, n in ((1, 3), (2, 4), (3, 6), (4, 3)) for j in range(n)), "fc"]),
        ("tests.support.user_nets.sequential_convnet", ["stem", "block1", "block2", "head"]),
    ],
    ids=["mobilenet_v2", "resnet50", "user-sequential"],
)
def test_fsdp_shards_every_declared_block_then_the_root(one_process_group: Any, arch: str, units: list[str]) -> None:
    model = ImageClassifier(arch=arch)
    total = sum(p.numel() for p in model.net.parameters())
    blocks = module_blocks(model, "fsdp")
    plan = shard_network(model.net, blocks, one_process_group["data_parallel"])
    assert [u["name"] for u in plan] == [*units, "root"]
    assert sum(u["parameters"] for u in plan) == total and all(u["parameters"] > 0 for u in plan[:-1])
    # one FSDP unit per block, over the network's own modules (ResNet's stem: conv1, bn1, relu, maxpool)
    sharded = {name for name, m in model.net.named_modules() if isinstance(m, FSDPModule)}
    assert sharded == {"", *(path for block in blocks for path in block.paths)}
    assert all(isinstance(p, DTensor) for p in model.parameters())


def test_without_a_device_mesh_configure_model_leaves_the_network_alone() -> None:
    model = ImageClassifier()
    before = [id(p) for p in model.parameters()]
    model.configure_model()
    assert [id(p) for p in model.parameters()] == before
    assert not any(isinstance(m, FSDPModule) for m in model.modules())


def test_strategy_config_files_compose_with_the_default_config(capsys: pytest.CaptureFixture) -> None:
    from tests.integration.test_cli import parsed_config

    strategies = {}
    for path in sorted((REPO / "configs" / "strategy").glob("*.yaml")):
        config = parsed_config(capsys, f"--config={REPO / 'configs' / 'default.yaml'}", f"--config={path}")
        strategies[path.stem] = config["trainer"]["strategy"]
    assert strategies == {
        "ddp": "ddp",
        "dp": "dp",
        "dp_balanced": "dp_balanced",
        "fsdp": {
            "class_path": "project.toolkit.strategies.fsdp.FullyShardedStrategy",
            "init_args": {"save_distributed_checkpoint": False},
        },
        "pipeline": {
            "class_path": "project.toolkit.strategies.pipeline.PipelineStrategy",
            "init_args": {"micro_batches": 4, "schedule": "gpipe", "split": None, "process_group_backend": None},
        },
        "tpu": "xla",
        "xla_cpu": "single_xla",
    }


class WithoutNet(LightningModule):
    """A user's own LightningModule, with its network under another name."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.backbone(batch).sum()

    def configure_model(self) -> None:  # Lightning's ModelParallelStrategy insists on it
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("name", ["dp", "dp_balanced"])
def test_a_module_without_the_contract_gets_one_line_naming_what_it_lacks(name: str) -> None:
    trainer = Trainer(strategy=name, accelerator="cpu", devices=1, logger=False, max_steps=1, enable_progress_bar=False)
    with pytest.raises(ProjectError) as error:
        trainer.fit(WithoutNet(), torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"--trainer.strategy={name} needs a LightningModule with its network in `net`")
    assert "WithoutNet has no `net`" in message and "project/toolkit/strategies/contract.py" in message


def test_the_template_module_meets_the_contract() -> None:
    from project.toolkit.strategies.contract import REQUIRED, ParallelizableModule, check_module

    model = ImageClassifier()
    assert isinstance(model, ParallelizableModule)
    for name in REQUIRED:
        check_module(model, name)
    with pytest.raises(ProjectError, match="--trainer.strategy=fsdp needs"):
        check_module(WithoutNet(), "fsdp")


class RecordsInferenceMode(BoringModel):
    """Which evaluation steps ran under ``torch.inference_mode``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, bool] = {}

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen[self.trainer.state.fn.value] = torch.is_inference_mode_enabled()
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen["test"] = torch.is_inference_mode_enabled()
        return super().test_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        self.seen["predict"] = torch.is_inference_mode_enabled()
        return super().predict_step(batch, batch_idx, dataloader_idx)


@pytest.mark.parametrize("no_grad", [False, True])
def test_fsdp_evaluates_under_no_grad_in_every_loop(tmp_path: Path, no_grad: bool) -> None:
    """FSDP2 on one GPU failed in test under inference mode; the fsdp strategy's setup switches every loop to
    no_grad. A CPU run without a process group shows Lightning's choice (a gloo run always gets no_grad)."""
    limits = dict(limit_train_batches=1, limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1)
    trainer = quiet_trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0, **limits)
    if no_grad:
        evaluate_under_no_grad(trainer)
    model = RecordsInferenceMode()
    trainer.fit(model)
    trainer.validate(model, verbose=False)
    trainer.test(model, verbose=False)
    trainer.predict(model)
    assert model.seen == {"fit": False, **dict.fromkeys(("validate", "test", "predict"), not no_grad)}


def test_the_fsdp_strategy_switches_the_evaluation_loops_to_no_grad_when_it_sets_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The wiring of the test above: FullyShardedStrategy.setup calls it (the sharding and Lightning's own
    set-up, which need a process group, stood in for)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from project.toolkit.strategies import fsdp

    monkeypatch.setattr(ModelParallelStrategy, "setup", lambda self, trainer: None)
    monkeypatch.setattr(fsdp, "check_module", lambda module, name: None)
    monkeypatch.setattr(fsdp, "FSDPModule", torch.nn.Module)  # the network counts as sharded already
    trainer = quiet_trainer(tmp_path)
    strategy = fsdp.FullyShardedStrategy()
    strategy._lightning_module = RecordsInferenceMode()
    strategy._lightning_module.net = torch.nn.Linear(2, 2)
    assert trainer.test_loop.inference_mode  # Lightning's default
    strategy.setup(trainer)
    loops = (trainer.validate_loop, trainer.test_loop, trainer.predict_loop)
    assert [loop.inference_mode for loop in loops] == [False, False, False]

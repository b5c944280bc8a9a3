"""predict writes one row per image, in data-set order."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader, TensorDataset

from project.data import CIFAR10DataModule
from project.model import ImageClassifier
from project.toolkit.callbacks.predictions import PredictionWriter
from project.toolkit.errors import ProjectError
from tests import conftest
from tests.support import fixtures


@pytest.mark.parametrize("on_device", [True, False])  # slices of the images; a DataLoader
@pytest.mark.parametrize("limit", [None, 2])
def test_predictions_csv_matches_the_model(
    cifar_root: Path, tmp_path: Path, on_device: bool, limit: int | None
) -> None:
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=10).eval()
    dm = CIFAR10DataModule(data_dir=str(cifar_root), download=False, image_size=32, batch_size=16, on_device=on_device)
    trainer = Trainer(
        accelerator="cpu",
        default_root_dir=tmp_path,
        callbacks=[PredictionWriter()],
        enable_progress_bar=False,
        limit_predict_batches=limit,
    )
    trainer.predict(model, datamodule=dm)

    path = Path(trainer.log_dir) / "predictions.csv"
    assert b"\r" not in path.read_bytes()  # LF line ends
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    count = conftest.TEST_IMAGES if limit is None else limit * 16
    assert [int(r["index"]) for r in rows] == list(range(count))
    images = torch.stack([dm._datasets["test"][i][0] for i in range(count)])
    with torch.inference_mode():
        top = model(images).softmax(1).topk(5, dim=1)
    assert [int(r["predicted"]) for r in rows] == top.indices[:, 0].tolist()
    assert all(r["predicted_name"] == conftest.LABEL_NAMES[int(r["predicted"])] for r in rows)
    for row, probabilities, classes in zip(rows, top.values.tolist(), top.indices.tolist(), strict=True):
        assert float(row["probability"]) == pytest.approx(probabilities[0], abs=5e-5)
        assert [row[f"top{i}_name"] for i in range(1, 6)] == [conftest.LABEL_NAMES[c] for c in classes]
        assert [float(row[f"top{i}_probability"]) for i in range(1, 6)] == pytest.approx(probabilities, abs=5e-5)


def test_predictions_csv_holds_the_top_classes_there_are_up_to_five(tmp_path: Path) -> None:
    model = ImageClassifier(arch="tests.support.user_nets.sequential_convnet", num_classes=3).eval()
    images = torch.randn(6, 3, 32, 32)
    loader = DataLoader(TensorDataset(images, torch.zeros(6, dtype=torch.long)), batch_size=4)
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=[PredictionWriter()], logger=False)
    trainer.predict(model, loader)
    with open(tmp_path / "predictions.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    tops = [f"top{i}_{column}" for i in range(1, 4) for column in ("name", "probability")]
    assert header == ["index", "predicted", "predicted_name", "probability", *tops]  # no names: the class indices
    with torch.inference_mode():
        probabilities = model(images).softmax(1)
    assert len(rows) == 6
    for row, expected in zip(rows, probabilities.tolist(), strict=True):
        assert row[1] == row[2] == row[4]  # the predicted class, its "name" and the first of the top 3
        assert float(row[3]) == pytest.approx(max(expected), abs=5e-5)
        assert sum(float(value) for value in row[5::2]) == pytest.approx(1, abs=1e-3)  # all 3 classes' probabilities


class OneBatch:
    """A loader that is no DataLoader and says nothing of its images' indices."""

    def __iter__(self):
        yield torch.zeros(2, 3, 32, 32), torch.zeros(2, dtype=torch.long)

    def __len__(self) -> int:
        return 1


def test_a_loader_without_known_indices_is_refused_before_predicting(tmp_path: Path) -> None:
    model = ImageClassifier(num_classes=10, channels_last=False)
    trainer = Trainer(
        accelerator="cpu", default_root_dir=tmp_path, callbacks=[PredictionWriter()], enable_progress_bar=False
    )
    with pytest.raises(ProjectError, match="needs the image indices of every batch, which a OneBatch does not give"):
        trainer.predict(model, OneBatch())
    assert not list(tmp_path.rglob("predictions.csv"))


def test_predict_command_writes_the_csv(tiny_args: list[str], tmp_path: Path) -> None:
    from project.__main__ import main

    main(["fit", *tiny_args, "--trainer.max_epochs=1"])
    for options, returned in (([], False), (["--return_predictions=true"], True)):  # none returned unless asked
        cli = main(["predict", *tiny_args, "--ckpt_path=last", *options])
        assert cli.trainer.predict_loop.return_predictions is returned
        rows = list(csv.DictReader(open(Path(cli.trainer.log_dir) / "predictions.csv")))
        assert len(rows) == fixtures.TEST_IMAGES and {r["predicted_name"] for r in rows} <= set(fixtures.LABEL_NAMES)


def test_a_truncated_checkpoint_is_one_error_line(tiny_args: list[str], tmp_path: Path, capsys) -> None:
    from project.__main__ import main

    broken = tmp_path / "broken.ckpt"
    torch.save({"state_dict": {"w": torch.randn(1000)}}, broken)
    broken.write_bytes(broken.read_bytes()[:1500])
    try:
        main(["test", *tiny_args, f"--ckpt_path={broken}"])
    except SystemExit as exit_info:
        assert exit_info.code == 2
    else:
        raise AssertionError("a truncated checkpoint was accepted")
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: --ckpt_path={broken}: not a readable")

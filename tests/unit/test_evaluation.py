"""What an evaluation measures beyond loss and accuracy: a confusion matrix counted on the device, top-5 accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassConfusionMatrix

from project.model import ImageClassifier
from project.toolkit.training import ConfusionMatrix
from tests.conftest import quiet_trainer
from tests.integration.test_performance import HostReads

USER_NET = "tests.support.user_nets.sequential_convnet"  # small: these tests evaluate, they do not train


def test_the_confusion_matrix_counts_each_pair_and_reads_nothing_on_the_host() -> None:
    seed = torch.Generator().manual_seed(0)
    batches = [(torch.randint(4, (n,), generator=seed), torch.randint(4, (n,), generator=seed)) for n in (7, 9)]
    ours, reference, reads = ConfusionMatrix(num_classes=4), MulticlassConfusionMatrix(num_classes=4), HostReads()
    with reads:
        for predicted, labels in batches:
            ours.update(predicted, labels)
    for predicted, labels in batches:
        reference.update(predicted, labels)
    assert reads.calls == []  # torchmetrics' own runs torch.bincount, which on a GPU reads the labels' range
    assert torch.equal(ours.compute(), reference.compute())  # a row per true class, a column per predicted one


@pytest.mark.parametrize("num_classes", [10, 4])
@pytest.mark.parametrize("command", ["validate", "test"])
def test_top5_accuracy_is_logged_where_there_are_ten_classes_or_more(
    tmp_path: Path, num_classes: int, command: str
) -> None:
    torch.manual_seed(0)
    model = ImageClassifier(arch=USER_NET, num_classes=num_classes).eval()
    images, labels = torch.randn(30, 3, 32, 32), torch.arange(30) % num_classes
    trainer = quiet_trainer(tmp_path, callbacks=[])
    getattr(trainer, command)(model, DataLoader(TensorDataset(images, labels), batch_size=8))
    stage = "val" if command == "validate" else "test"
    if num_classes < 10:
        assert f"{stage}/acc_top5" not in trainer.callback_metrics and f"{stage}/acc" in trainer.callback_metrics
        return
    with torch.inference_mode():
        expected = (model(images).topk(5, dim=1).indices == labels[:, None]).any(dim=1).float().mean()
    assert trainer.callback_metrics[f"{stage}/acc_top5"].item() == pytest.approx(expected.item())
    assert 0 < expected < 1  # the check can tell top-5 from top-1 and from always right

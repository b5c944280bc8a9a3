"""What validate and test leave in the run folder beyond timing.json: the confusion matrices (CSV and a TensorBoard
image) and, after test, each class's precision, recall and F1, also printed."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.__main__ import main
from project.model import ImageClassifier
from tests.support.fixtures import LABEL_NAMES, ColourImages


def confusion_of(checkpoint: Path, split: str, val_size: int) -> list[list[int]]:
    """The checkpoint's confusion matrix (a row per true class) on the tests' data set, in this one process."""
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    dm = ColourImages(image_size=32, batch_size=20, val_size=val_size, num_workers=0)
    dm.setup("fit" if split == "val" else "test")
    counts = np.zeros((10, 10), dtype=int)
    with torch.inference_mode():
        for images, labels in dm.val_dataloader() if split == "val" else dm.test_dataloader():
            np.add.at(counts, (labels.numpy(), model(images).argmax(1).numpy()), 1)
    return counts.tolist()


def read_confusion(path: Path) -> list[list[int]]:
    """The counts of a confusion_*.csv, after checking its class names (the header and the first column)."""
    header, *rows = list(csv.reader(open(path, newline="")))
    assert header == ["true \\ predicted", *LABEL_NAMES] and [row[0] for row in rows] == list(LABEL_NAMES)
    return [[int(value) for value in row[1:]] for row in rows]


def test_validate_and_test_write_the_confusion_matrix_and_test_each_class_scores(
    tiny_args: list[str], tmp_path: Path, capsys
) -> None:
    tiny_args = [*tiny_args, "--model.arch=tests.support.user_nets.sequential_convnet"]  # evaluated, barely trained
    main(["fit", *tiny_args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=3"])  # sanity steps included
    run = tmp_path / "lightning_logs" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    val = read_confusion(run / "confusion_val.csv")
    assert val == confusion_of(last, "val", val_size=40)  # the epoch's 40 images, not the sanity check's
    capsys.readouterr()
    tested = main(["test", *tiny_args, "--ckpt_path=last"])
    expected = confusion_of(last, "test", val_size=40)
    assert read_confusion(run / "confusion_test.csv") == expected and sum(map(sum, expected)) == 60

    counts = np.array(expected)
    right = np.diag(counts)
    precision = np.divide(right, counts.sum(0), out=np.zeros(10), where=counts.sum(0) > 0)
    recall = right / counts.sum(1)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(10), where=precision + recall > 0)
    header, *rows = list(csv.reader(open(run / "per_class_test.csv", newline="")))
    assert header == ["class", "precision", "recall", "f1", "support"]
    assert [row[0] for row in rows] == list(LABEL_NAMES) and [int(row[4]) for row in rows] == [6] * 10
    table = np.array([[float(value) for value in row[1:4]] for row in rows])
    np.testing.assert_allclose(table, np.stack([precision, recall, f1], 1), atol=5e-5)
    out = capsys.readouterr().out
    assert f"Each class in the test ({run / 'per_class_test.csv'}):" in out
    assert f"  {LABEL_NAMES[0]:<7} {precision[0]:>9.4f} {recall[0]:>9.4f} {f1[0]:>9.4f} {6:>9}" in out
    assert {"test/acc", "test/acc_top5"} <= tested.trainer.callback_metrics.keys()

    for name in ("confusion_val.csv", "confusion_test.csv", "per_class_test.csv"):
        assert b"\r" not in (run / name).read_bytes()  # LF line ends
    images: dict[str, list] = {}
    for events in run.glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"images": 0})
        accumulator.Reload()
        images |= {tag: accumulator.Images(tag) for tag in accumulator.Tags()["images"]}
    assert images.keys() == {"val/confusion", "test/confusion"}
    assert [(image.width, image.height) for image in images["test/confusion"]] == [(250, 250)]  # 25 px a class

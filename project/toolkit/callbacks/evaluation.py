"""What an evaluation leaves to read: confusion matrices, each class's precision, recall and F1 (EvaluationReport)."""

from __future__ import annotations

import csv
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from project.toolkit.interfaces import image_data, layout_of
from project.toolkit.training import ConfusionMatrix


class EvaluationReport(Callback):
    """Writes and resets the module's ``val_confusion``/``test_confusion``: all ranks compute (a sum), rank 0 writes."""

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        stage = "test" if trainer.testing else "val"
        if not isinstance(metric := getattr(pl_module, f"{stage}_confusion", None), ConfusionMatrix):
            return
        counts = metric.compute() // layout_of(trainer.strategy).sample_copies  # pipeline: each stage counted it
        metric.reset()
        log_dir = trainer.log_dir  # every rank asks: Lightning broadcasts it from rank 0
        if not trainer.is_global_zero or log_dir is None or trainer.sanity_checking or trainer.fast_dev_run:
            return
        names = getattr(image_data(trainer), "label_names", None) or [str(i) for i in range(len(counts))]
        rows = [[name, *row] for name, row in zip(names, counts.tolist(), strict=True)]
        tables = {f"confusion_{stage}.csv": [["true \\ predicted", *names], *rows]}
        if stage == "test":  # precision, recall and F1 of each class, 0 where undefined
            precision, recall = (counts.diag() / counts.sum(dim=d).clamp(min=1) for d in (0, 1))
            f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
            scores = zip(names, precision.tolist(), recall.tolist(), f1.tolist(), counts.sum(1).tolist(), strict=True)
            rows = [[name, f"{p:.4f}", f"{r:.4f}", f"{f:.4f}", n] for name, p, r, f, n in scores]
            tables["per_class_test.csv"] = [["class", "precision", "recall", "f1", "support"], *rows]
            width = max(len(name) for name in [*names, "class"])
            lines = [f"  {r[0]:<{width}} " + " ".join(f"{v:>9}" for v in r[1:]) for r in tables["per_class_test.csv"]]
            print(f"Each class in the test ({Path(log_dir) / 'per_class_test.csv'}):", *lines, sep="\n", flush=True)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            with open(Path(log_dir) / name, "w", newline="") as f:
                csv.writer(f, lineterminator="\n").writerows(table)
        px = max(1, 256 // len(counts))  # a cell's pixels; a row's shares of its class's images: black all, white none
        image = (1 - counts / counts.sum(1, keepdim=True).clamp(1)).repeat_interleave(px, 0).repeat_interleave(px, 1)
        for logger in [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]:
            logger.experiment.add_image(f"{stage}/confusion", image, trainer.global_step, dataformats="HW")

    on_test_epoch_end = on_validation_epoch_end

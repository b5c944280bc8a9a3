"""The machinery tests' own data set: CIFAR-10's shape and class count, each class a colour under noise
(so it is learnable), made in memory. The tests of the toolkit run on it (``tiny_args``), not on the
template's data set, so a user who swaps CIFAR-10 out keeps a green suite; CIFAR-10's own reader is
tested on files in the official format (``cifar_root``)."""

from __future__ import annotations

import numpy as np

from project.data import ImageArrayDataModule

TRAIN_IMAGES, TEST_IMAGES = 200, 60
LABEL_NAMES = ("red", "green", "yellow", "blue", "orange", "purple", "cyan", "magenta", "lime", "grey")

# Ten well-separated colours: a class is a colour, which survives crops, flips and resizing.
PALETTE = np.array(
    [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
     (145, 30, 180), (70, 240, 240), (240, 50, 230), (210, 245, 60), (128, 128, 128)]
)  # fmt: skip


def colour_images(labels: np.ndarray, rng: np.random.Generator, side: int = 32) -> np.ndarray:
    """uint8 images (N, side, side, 3) of each label's colour under noise."""
    noise = rng.integers(0, 256, (len(labels), side, side, 3))
    return (0.75 * PALETTE[labels][:, None, None, :] + 0.25 * noise).astype(np.uint8)


# The options of a run that takes seconds on a CPU with the data set below (conftest's tiny_args adds the devices
# and the run's folder).
TINY_RUN = [
    "--data=tests.support.fixtures.ColourImages",
    "--data.image_size=32",
    "--data.batch_size=20",
    "--data.val_size=40",
    "--data.num_workers=0",
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.log_every_n_steps=1",
]


class ColourImages(ImageArrayDataModule):
    """200 training and 60 test images of 32 x 32 x 3 in 10 balanced classes."""

    num_classes = 10
    image_shape = (32, 32, 3)
    # Declared, so every split and every process normalises alike whatever val_size a test holds out
    # (measured statistics are tested on their own, in tests/integration/test_dataset_choice.py).
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)

    def load_split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        self.label_names = list(LABEL_NAMES)  # the names predictions.csv writes beside each index
        rng = np.random.default_rng(1 if train else 2)
        labels = rng.permutation(np.arange(TRAIN_IMAGES if train else TEST_IMAGES) % self.num_classes)
        return colour_images(labels, rng), labels

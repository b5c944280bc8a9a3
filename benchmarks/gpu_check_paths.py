"""The GPU check's paths (``benchmarks/gpu_check.py``): each a few ``python -m project ...`` commands and what each
must leave behind; the data a path trains on (synthetic, or a generated folder of JPEGs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.decoding import GRAIN, photo
from benchmarks.gpu_common import newest_run, newest_timing

CHECK_BATCHES = 10  # training batches per epoch of a check: enough for every hook, a few seconds on any GPU
DP_SINGLE = "DataParallel needs 2 or more to split a batch, so this runs as a single-device run"
RESTORED = "Restoring states from the checkpoint path"  # Lightning's line when it resumes
NAN_STOP = "training loss is"  # the Guards callback's one line for a non-finite loss
ROOT = "{root}"  # in a step's options: the path's folder

# A check: given the path's folder and the command's output, what is wrong (None: nothing).
Check = Callable[[Path, str], str | None]


# --------------------------------------------------------------------------- what a run left


def wrote_timing(key: str) -> Check:
    def check(root: Path, output: str) -> str | None:
        run = newest_run(root)
        if run is None or not (run / "timing.json").is_file():
            return f"no timing.json in {run or root / 'lightning_logs'}"
        return None if newest_timing(root).get(key) is not None else f"{run / 'timing.json'} has no {key!r}"

    return check


def wrote_checkpoint(root: Path, output: str) -> str | None:
    """``last.ckpt`` of some run: a file, or a folder under DeepSpeed."""
    found = list((root / "lightning_logs").glob("version_*/checkpoints/last.ckpt"))
    return None if found else f"no lightning_logs/version_*/checkpoints/last.ckpt under {root}"


def wrote_predictions(root: Path, output: str) -> str | None:
    run = newest_run(root)
    path = run / "predictions.csv" if run is not None else root / "lightning_logs"
    return None if path.is_file() and len(path.read_text().splitlines()) > 1 else f"no predictions in {path}"


def printed(text: str) -> Check:
    def check(root: Path, output: str) -> str | None:
        return None if text in output else f"its output does not say {text!r}"

    return check


def resumed_to_step(step: int) -> Check:
    """The newest run's ``last.ckpt`` is at ``step``: training went on from the checkpoint to the new end."""

    def check(root: Path, output: str) -> str | None:
        run = newest_run(root)
        path = run / "checkpoints" / "last.ckpt" if run is not None else None
        if path is None or not path.is_file():
            return f"the resumed run wrote no last.ckpt ({path})"
        reached = torch.load(path, map_location="cpu", weights_only=True).get("global_step")
        return None if reached == step else f"{path} is at step {reached}, not {step}"

    return check


def wrote_in_run(name: str) -> Check:
    """The newest run's folder holds the file ``name`` (an evaluation's table, say)."""

    def check(root: Path, output: str) -> str | None:
        run = newest_run(root)
        return None if run is not None and (run / name).is_file() else f"no {name} in {run or root}"

    return check


def wrote_file(relative: str) -> Check:
    def check(root: Path, output: str) -> str | None:
        path = root / relative
        return None if path.is_file() and path.stat().st_size > 0 else f"no {path}"

    return check


# --------------------------------------------------------------------------- the data and the paths

FOLDER = "images"
FOLDER_SHAPES = ((640, 480), (480, 640), (1024, 768))  # (width, height): JPEGs a camera's size down to a thumbnail's
FOLDER_SPLITS = {"train": 48, "val": 16, "test": 16}  # images per class


def write_folder(root: Path, classes: int = 2) -> Path:
    """``root/images/{train,val,test}/<class>/*.jpg`` (once): the decoding benchmark's photo-like JPEGs, quality 90,
    so that the folder path decodes, resizes and crops real files."""
    folder = root / FOLDER
    if folder.is_dir():
        return folder
    rng = np.random.default_rng(0)
    for split, count in FOLDER_SPLITS.items():
        for label in range(classes):
            (folder / split / f"class_{label}").mkdir(parents=True)
            for n in range(count):
                image = photo(rng, *FOLDER_SHAPES[n % len(FOLDER_SHAPES)], GRAIN["grainy"])
                image.save(folder / split / f"class_{label}" / f"{n:03d}.jpg", quality=90)
    return folder


@dataclass(frozen=True)
class Step:
    """One ``python -m project <subcommand>`` of a path, with the options it adds to the shared ones (``shared``:
    the trainer's and the data's, which ``export`` does not take); ``{root}`` in an option is the path's folder."""

    subcommand: str
    args: tuple[str, ...] = ()
    succeeds: bool = True  # False: the command must exit non-zero (a refusal is the check)
    checks: tuple[Check, ...] = ()
    shared: bool = True


@dataclass(frozen=True)
class CheckPath:
    """A path through the template on a GPU. ``after``: the path whose folder (and runs) it continues."""

    name: str
    what: str
    steps: tuple[Step, ...]
    after: str | None = None
    needs_deepspeed: bool = False
    data: str = "synthetic"  # or "folder": the generated JPEGs (write_folder)


def _fit(*args: str, checks: tuple[Check, ...] = ()) -> Step:
    return Step("fit", args, checks=(wrote_checkpoint, wrote_timing("fit_seconds"), *checks))


TEST_LAST = Step("test", ("--ckpt_path=last",), checks=(wrote_timing("test_samples_per_second"),))


def check_paths(batches: int = CHECK_BATCHES) -> list[CheckPath]:
    """Every path, in the order they run (a path's ``after`` comes before it)."""
    single = "--trainer.precision=32-true"
    return [
        CheckPath("single-fp32", "one device, 32-true (convolutions in TF32)", (_fit(single),)),
        CheckPath("bf16-mixed", "one device, bf16 autocast", (_fit("--trainer.precision=bf16-mixed"),)),
        CheckPath("channels-last-off", "NCHW activations", (_fit("--model.channels_last=false"),)),
        CheckPath("compile", "torch.compile (inductor, Triton kernels)", (_fit("--model.compile=true"),)),
        CheckPath("on-device", "data set on the GPU, augmented there", (_fit("--data.on_device=true"),)),
        # The default (on_device=auto) keeps a CIFAR-sized set on the GPU: the DataLoader path needs its own run.
        CheckPath("loader", "DataLoader workers feeding the GPU, pinned memory", (_fit("--data.on_device=false"),)),
        CheckPath("ddp-1", "DDP on 1 GPU (NCCL)", (_fit("--trainer.strategy=ddp"),)),
        CheckPath("fsdp-1", "FSDP2 on 1 GPU", (_fit("--trainer.strategy=fsdp"),)),
        CheckPath("dp-1", "DataParallel on 1 GPU", (_fit("--trainer.strategy=dp", checks=(printed(DP_SINGLE),)),)),
        CheckPath(
            "deepspeed-stage-2",
            "DeepSpeed ZeRO-2 on 1 GPU, then test from its checkpoint folder on a single device",
            (
                _fit("--trainer.strategy=deepspeed_stage_2"),
                TEST_LAST,
            ),
            needs_deepspeed=True,
        ),
        CheckPath(
            "test-last",
            "test --ckpt_path=last after single-fp32",
            (TEST_LAST,),
            after="single-fp32",
        ),
        CheckPath(
            "predict-last",
            "predict --ckpt_path=last after single-fp32",
            (Step("predict", ("--ckpt_path=last",), checks=(wrote_predictions,)),),
            after="single-fp32",
        ),
        CheckPath(
            "resume",
            "fit --ckpt_path=last --trainer.max_epochs=3 after single-fp32: goes on to epoch 3",
            (
                Step(
                    "fit",
                    ("--ckpt_path=last", "--trainer.max_epochs=3", single),
                    checks=(printed(RESTORED), resumed_to_step(3 * batches)),
                ),
            ),
            after="single-fp32",
        ),
        CheckPath("ema", "EMA of the weights, then test on the average", (_fit("--callbacks.ema=true"), TEST_LAST)),
        CheckPath(
            "mixup-cutmix",
            "MixUp/CutMix of each batch on the device, then in DataLoader workers",
            (
                _fit("--data.batch_augmentation=mixup_or_cutmix"),
                _fit("--data.batch_augmentation=mixup_or_cutmix", "--data.on_device=false"),
            ),
        ),
        CheckPath(
            "augmentation",
            "random_resized_crop, then a user's transform (RandAugment), each image on the device",
            (
                _fit("--data.augmentation=random_resized_crop"),
                _fit('--data.augmentation={"class_path": "torchvision.transforms.v2.RandAugment"}'),
            ),
        ),
        CheckPath(
            "folder",
            "a folder of JPEGs: decoded in workers, precise BN, confusion matrix; test, predict, export (pt2)",
            (
                _fit(checks=(wrote_in_run("confusion_val.csv"),)),
                Step("test", ("--ckpt_path=last",), checks=(wrote_in_run("per_class_test.csv"),)),
                Step("predict", ("--ckpt_path=last",), checks=(wrote_predictions,)),
                Step(
                    "export",
                    ("--ckpt_path=last", "--format=pt2", f"--out={ROOT}/model.pt2", f"--logs={ROOT}/lightning_logs"),
                    checks=(wrote_file("model.pt2"), printed("exported")),
                    shared=False,
                ),
            ),
            data="folder",
        ),
        CheckPath(
            "nan-guard",
            "--model.lr=1e30: stops at the first non-finite loss, exit non-zero",
            (Step("fit", ("--model.lr=1e30", single), succeeds=False, checks=(printed(NAN_STOP),)),),
        ),
    ]
